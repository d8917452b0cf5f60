"""A model as a Relax module, through TVM's frontend for its format (ONNX, torch, TFLite), and the module
MetaSchedule tunes (``tuning_module``)."""

from __future__ import annotations

import tvm
from tvm import relax

from farm.errors import BuildError, message_line
from farm.models import onnx_proto
from farm.records import ModelSource


def tuning_module(model: ModelSource) -> tvm.IRModule:
    """The module MetaSchedule sees: the "zero" pipeline first, or extract_tasks finds nothing.

    Tuning and tuned compilation both start from this, so workloads match."""
    return relax.get_pipeline("zero")(import_model(model))


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
