"""A model as a Relax module, through TVM's frontend for its format (ONNX, torch, TFLite); the module
MetaSchedule tunes (``tuning_module``) and, with weight prepacking, the repacking folded once the records are applied
(``fold_weight_prepack``): TVM's ``static_shape_tuning_pipeline(cpu_weight_prepack=True)`` in two halves, the tuning
done by farm in between."""

from __future__ import annotations

import tvm
from tvm import relax

from farm.errors import BuildError, message_line
from farm.models import onnx_proto
from farm.records import ModelSource


def tuning_module(model: ModelSource, weight_prepack: bool) -> tvm.IRModule:
    """The module MetaSchedule sees: the "zero" pipeline first, or extract_tasks finds nothing; with
    ``weight_prepack`` (``records.PREPACK_RULE``) each function's constant inputs marked layout-free
    (``AttachAttrLayoutFreeBuffers``), so MetaSchedule's ``RewriteLayout`` postprocessor may pack them.

    Tuning and tuned compilation both start from this, with the device's one setting, so workloads match (the
    attribute changes them: the functions are renamed, ``fused_conv2d_add_relu`` → ``fused_conv2d_add_relu1``)."""
    mod = relax.get_pipeline("zero")(import_model(model))
    return relax.transform.AttachAttrLayoutFreeBuffers()(mod) if weight_prepack else mod


# TVM's post-tuning half of cpu_weight_prepack (relax/pipeline.py, static_shape_tuning_pipeline)
PREPACK_PASSES = ("SplitLayoutRewritePreproc", "LiftTransformParams", "FoldConstant")


def fold_weight_prepack(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """``mod`` (``tuning_module``'s, with records applied) with each rewritten function split into its weights'
    repacking (``*_weight_prepack``) and the kernel on packed weights (``*_prepacked``), and the repacking of constant
    weights computed now (``FoldConstant``): the library holds the packed weights, ``main(input)`` calls no repacking
    and keeps its interface. (``LiftTransformParams`` lifts the repacking of weights passed as parameters; farm's
    importers keep weights as constants, so there are none.)"""
    with target:
        for name in PREPACK_PASSES:
            mod = getattr(relax.transform, name)()(mod)
    return mod


def prepack_calls(mod: tvm.IRModule) -> list[str]:
    """The ``*_weight_prepack`` functions ``mod``'s ``main`` still calls: a weight repacked at every call (none after
    ``fold_weight_prepack`` while weights are constants)."""
    return sorted(gv.name_hint for gv in relax.analysis.all_global_vars(mod["main"])
                  if gv.name_hint.endswith("_weight_prepack"))


def import_model(model: ModelSource) -> tvm.IRModule:
    """The model as a Relax module, through TVM's frontend for its format."""
    if model.frontend == "torch":
        from tvm.relax.frontend.torch import from_exported_program

        from farm.models import torch_program

        try:
            mod = from_exported_program(torch_program(model), keep_params_as_input=False)
        except Exception as exc:
            raise BuildError(f"TVM's torch importer rejected {model.name}: {message_line(exc)}",
                             "the program may use an operator TVM 0.27 does not support") from exc
        return relax.transform.DecomposeOpsForInference()(mod)
    if model.frontend == "tflite":
        from tvm.relax.frontend.tflite import from_tflite

        from farm.models import tflite_model

        try:
            mod = from_tflite(tflite_model(model), {s.name: s.shape for s in model.inputs},
                              {s.name: s.dtype for s in model.inputs})
        except Exception as exc:
            raise BuildError(f"TVM's TFLite importer rejected {model.name}: {message_line(exc)}",
                             "the model may use an operator TVM 0.27 does not support") from exc
        mod = mod[0] if isinstance(mod, tuple) else mod
        return relax.transform.DecomposeOpsForInference()(mod)
    return import_onnx(model)


def import_onnx(model: ModelSource) -> tvm.IRModule:
    from tvm.relax.frontend.onnx import from_onnx

    shapes = {spec.name: list(spec.shape) for spec in model.inputs}
    dtypes = {spec.name: spec.dtype for spec in model.inputs}
    try:
        mod = from_onnx(onnx_proto(model), shape_dict=shapes, dtype_dict=dtypes, keep_params_in_input=False)
    except Exception as exc:
        raise BuildError(f"TVM's ONNX importer rejected {model.name}: {message_line(exc)}",
                         "the model may use an operator TVM 0.27 does not support; see the TVM log above") from exc
    return relax.transform.DecomposeOpsForInference()(mod)
