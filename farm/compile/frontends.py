"""A model as a Relax module, through TVM's frontend for its format (ONNX, torch, TFLite); the module
MetaSchedule tunes (``tuning_module``: its convolutions NHWC where the device's ``layout`` says so, ``channels_last``)
and, with weight prepacking, the repacking folded once the records are applied (``fold_weight_prepack``): TVM's
``static_shape_tuning_pipeline(cpu_weight_prepack=True)`` in two halves, the tuning done by farm in between."""

from __future__ import annotations

import logging
import re
from typing import Any

import tvm
from tvm import relax
from tvm.target import codegen
from tvm.relax.dpl import is_const, is_op, is_tuple_get_item, rewrite_call, wildcard

from farm.compile.kernels import copy_per_input
from farm.errors import BuildError, message_line
from farm.models import onnx_proto
from farm.records import Device, ModelSource, layout_setting, weight_prepack_setting

log = logging.getLogger(__name__)


def tuning_module(model: ModelSource, weight_prepack: bool, layout: str, lanes: int = 0) -> tvm.IRModule:
    """The module MetaSchedule sees: with ``layout`` "NHWC" (``records.LAYOUT_RULE``) the convolutions converted
    (``channels_last``); the "zero" pipeline, or extract_tasks finds nothing; with ``weight_prepack``
    (``records.PREPACK_RULE``) each function's constant inputs marked layout-free (``AttachAttrLayoutFreeBuffers``),
    so MetaSchedule's ``RewriteLayout`` postprocessor may pack them.

    ``lanes`` is the target CPU's float32 vector lanes (``float32_lanes``; 0 on other targets). On a CPU,
    concatenations are copies per input (``kernels.copy_per_input``); in NHWC, convs are padded to whole vectors.

    Tuning and tuned compilation both start from this, with the device's settings, so workloads match (the
    attribute changes them: the functions are renamed, ``fused_conv2d_add_relu`` → ``fused_conv2d_add_relu1``)."""
    mod = import_model(model)
    if layout == "NHWC":
        mod = channels_last(mod, model.name, lanes)
    mod = relax.get_pipeline("zero")(mod)
    if lanes:
        mod = copy_per_input(mod)
    return relax.transform.AttachAttrLayoutFreeBuffers()(mod) if weight_prepack else mod


def device_tuning_module(model: ModelSource, device: Device, target: dict[str, Any] | None = None) -> tvm.IRModule:
    """``tuning_module`` with ``device``'s settings (``target``: its effective target, where the caller has it)."""
    from farm.compile.targets import effective_target, make_target

    target = target or effective_target(device)
    return tuning_module(model, weight_prepack_setting(device, target), layout_setting(device, target),
                         float32_lanes(make_target(target)))  # as a tuned compile gets them (build.py)


def float32_lanes(target: tvm.target.Target) -> int:
    """The float32 lanes of ``target``'s widest vectors, for an llvm target by its CPU's features: 16 with AVX-512,
    8 with AVX, else 4 (SSE, NEON); 0 for other targets."""
    if target.kind.name != "llvm":
        return 0
    for feature, lanes in (("avx512f", 16), ("avx", 8)):
        if codegen.llvm_cpu_has_features(feature, target):
            return lanes
    return 4


# A convolution's layouts in an NHWC module: data NHWC, weights HWIO (output channels innermost, as the output's)
NHWC_CONV = {"relax.nn.conv2d": ["NHWC", "HWIO"]}
# Elementwise ops of one tensor that TVM 0.27 gives no layout rule (FRelaxInferLayout): ConvertLayout would put a
# transpose on each side of every one (squeezenet with LeakyRelu: 52). They take relu's rule, which keeps their
# attributes (alpha) and gives the output its input's layout.
UNARY_WITHOUT_LAYOUT_RULE = ("relax.nn.leakyrelu", "relax.nn.softplus")


def _elementwise_layout_rules() -> None:
    rule = tvm.ir.Op.get("relax.nn.relu").get_attr("FRelaxInferLayout")
    for name in UNARY_WITHOUT_LAYOUT_RULE:
        if tvm.ir.Op.get(name).get_attr("FRelaxInferLayout") is None:
            tvm.ir.register_op_attr(name, "FRelaxInferLayout", rule)


def channels_last(mod: tvm.IRModule, name: str = "the model", lanes: int = 0) -> tvm.IRModule:
    """``mod`` with its convolutions in NHWC and the ops between them following (Relax's ``ConvertLayout``; the
    model's inputs and outputs keep their layout: a transpose at each end). Inference's rewrites come first: a
    dropout is the identity (``ConvertLayout`` cannot infer a layout for its tuple), and the weights' constant
    expressions are folded, so the transposed weights are constants too. Elementwise ops with no layout rule in TVM
    take relu's (``UNARY_WITHOUT_LAYOUT_RULE``). With ``lanes``, convs are padded to whole vectors (``whole_vectors``).

    A model the pass cannot convert keeps its own layout, with a warning (``name``), and so does one it converts with
    transposes left inside (an op with no layout rule between two convs: densenet121's light model kept 240,
    shufflenet's channel shuffle, a 5-D reshape and transpose, 32):
    tuning and tuned compiles both come here, so they still see one module."""
    _elementwise_layout_rules()
    mod = _inference_rewrites(mod)
    for inference_pass in (relax.transform.DecomposeOpsForInference(), relax.transform.DeadCodeElimination(),
                           relax.transform.CanonicalizeBindings(), relax.transform.FoldConstant()):
        mod = inference_pass(mod)
    converted = mod
    try:
        for layout_pass in (relax.transform.ConvertLayout(NHWC_CONV), relax.transform.FoldConstant()):
            converted = layout_pass(converted)
    except (RuntimeError, ValueError) as exc:  # TVM's errors: an op ConvertLayout cannot infer a layout for
        log.warning("%s: tuned and compiled in the model's own layout: Relax's ConvertLayout could not convert it "
                    "to NHWC (%s)", name, message_line(exc))
        return mod
    added, ends = _transposes(converted) - _transposes(mod), _ends(mod)
    if added > ends:  # an op with no layout rule, between two transposes: copies where NHWC should save time
        log.warning("%s: tuned and compiled in the model's own layout: in NHWC, Relax's ConvertLayout left %d "
                    "transposes inside it (ops it has no layout rule for)", name, added - ends)
        return mod
    return whole_vectors(converted, lanes) if lanes else converted


PAD_FROM = 128  # output channels from which padding to whole vectors wastes under 1/8 of a conv's work
PAIR_WASTE = 1 / 32  # padding to whole pairs of vectors where that adds at most this share of a conv's work


def whole_vectors(mod: tvm.IRModule, lanes: int) -> tvm.IRModule:
    """``mod`` (NHWC) with each float32 convolution whose output channels are not a multiple of ``lanes`` (from
    ``PAD_FROM``) given zero weights up to the next multiple, its bias add and relu following, and the extra channels
    sliced off after them. In NHWC the output channels are innermost, the axis a tuned kernel vectorizes:
    squeezenet's last conv (1,000 channels, 62.5 of AVX-512's 16-lane vectors) ran at half its other convs' rate.
    Where it adds at most ``PAIR_WASTE`` of the work, the channels are padded to whole pairs of vectors: a kernel's
    register tile is pixels × vectors, and MetaSchedule tiles by divisors, so at 1,008 channels (16 × 63) on a
    13 × 13 image the only tile that fits AVX-512's 32 registers was 13 pixels × 1 vector, each input broadcast
    feeding one multiply-add; at 1,024 it can be 13 × 2."""
    x, weight, bias = wildcard(), is_const(), is_const()
    conv = is_op("relax.nn.conv2d")(x, weight)
    with_bias = is_op("relax.add")(conv, bias)
    chains = (is_op("relax.nn.relu")(with_bias), with_bias, is_op("relax.nn.relu")(conv), conv)

    def padded(expr: relax.Expr, matched: dict) -> relax.Expr:
        call, ty = matched[conv], matched[weight].ty
        attrs, channels = call.attrs, int(ty.shape.values[-1].value)
        if (attrs.kernel_layout != "HWIO" or attrs.out_layout != "NHWC" or int(attrs.groups) != 1
                or ty.dtype != "float32" or channels < PAD_FROM or channels % lanes == 0):
            return expr
        wide = -(-channels // lanes) * lanes
        pair = -(-channels // (2 * lanes)) * 2 * lanes
        wide = pair if pair - channels <= channels * PAIR_WASTE else wide
        out = relax.Call(call.op, (matched[x], relax.const(_pad_last(matched[weight].value.numpy(), wide))), attrs)
        if with_bias in matched:
            shift = matched[bias].value.numpy()
            if shift.ndim != 4 or shift.shape[:3] != (1, 1, 1) or shift.shape[3] != channels:
                return expr
            out = relax.op.add(out, relax.const(_pad_last(shift, wide)))
        if expr.op.same_as(tvm.ir.Op.get("relax.nn.relu")):
            out = relax.op.nn.relu(out)
        return relax.op.strided_slice(out, axes=[3], begin=[0], end=[channels])

    for var, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            for chain in chains:
                func = rewrite_call(chain, padded, func)
            mod[var] = func
    return mod


def _pad_last(array: Any, size: int) -> Any:
    """``array`` with zeros appended along its last axis up to ``size``."""
    import numpy as np

    return np.pad(array, [(0, 0)] * (array.ndim - 1) + [(0, size - array.shape[-1])])


def _inference_rewrites(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the ops ``ConvertLayout`` has no rule for, where an inference module can do without them:
    a dropout is the identity; a ``broadcast_to`` its input's own shape is its input; ONNX's ``Sum`` of equal shapes
    (imported as ``sum(stack((a, b, ...)), axis=0)``, 5-D: resnet50's residual adds) is ``a + b + ...``."""
    x, shape, items = wildcard(), wildcard(), wildcard()
    dropout = is_tuple_get_item(is_op("relax.nn.dropout")(x), 0)
    same_shape = is_op("relax.broadcast_to")(x, shape)
    stack = is_op("relax.stack")(items)
    summed = is_op("relax.sum")(stack)

    def unbroadcast(expr: relax.Expr, matched: dict) -> relax.Expr:
        given, wanted = _static_shape(matched[x]), _static_shape(expr)
        return matched[x] if given is not None and given == wanted else expr

    def added(expr: relax.Expr, matched: dict) -> relax.Expr:
        terms = matched[items]
        if (not isinstance(terms, relax.Tuple) or matched[stack].attrs.axis is None
                or int(matched[stack].attrs.axis) != 0 or expr.attrs.keepdims
                or expr.attrs.axis is None or [int(a) for a in expr.attrs.axis] != [0]
                or len(shapes := {_static_shape(t) for t in terms.fields}) != 1 or None in shapes):
            return expr
        total = terms.fields[0]
        for term in terms.fields[1:]:
            total = relax.op.add(total, term)
        return total

    for var, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            func = rewrite_call(dropout, lambda _expr, matched: matched[x], func)
            func = rewrite_call(same_shape, unbroadcast, func)
            mod[var] = rewrite_call(summed, added, func)
    return mod


def _static_shape(expr: relax.Expr) -> tuple[str, tuple[int, ...]] | None:
    """``expr``'s dtype and shape when both are known and every dimension is a number, else None."""
    ty = expr.ty
    dims = getattr(ty, "shape", None)
    if dims is None or not hasattr(dims, "values") or any(not hasattr(d, "value") for d in dims.values):
        return None
    return (ty.dtype, tuple(int(d.value) for d in dims.values))


def _transposes(mod: tvm.IRModule) -> int:
    """The ``permute_dims`` calls in ``mod``'s ``main``."""
    transpose, found = tvm.ir.Op.get("relax.permute_dims"), []
    relax.analysis.post_order_visit(
        mod["main"].body, lambda expr: found.append(expr) if isinstance(expr, relax.Call) and expr.op.same_as(transpose)
        else None)
    return len(found)


def _ends(mod: tvm.IRModule) -> int:
    """The transposes an NHWC conversion may add to ``mod``'s ``main``: one a tensor in or out."""
    main = mod["main"]
    result = main.ret_ty  # a tuple's has fields
    return len(main.params) + (len(result.fields) if hasattr(result, "fields") else 1)


# TVM's post-tuning half of cpu_weight_prepack (relax/pipeline.py, static_shape_tuning_pipeline)
PREPACK_PASSES = ("SplitLayoutRewritePreproc", "LiftTransformParams", "FoldConstant")


def fold_weight_prepack(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """``mod`` (``tuning_module``'s, with records applied) with each rewritten function split into its weights'
    repacking (``*_weight_prepack``) and the kernel on packed weights (``*_prepacked``), and the repacking of constant
    weights computed now (``FoldConstant``): the library holds the packed weights, ``main(input)`` calls no repacking
    and keeps its interface. (``LiftTransformParams`` lifts the repacking of weights passed as parameters; farm's
    importers keep weights as constants, so there are none.) Folding leaves each kernel's packed weights bound to a
    tuple ``main`` never reads (a ``make_tuple``, its ``tuple_getitem``s and a null: 104 VM calls a squeezenet run,
    0.5 % of its time): dead code elimination drops them."""
    with target:
        for name in PREPACK_PASSES:
            mod = getattr(relax.transform, name)()(mod)
        return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(mod))


def prepack_calls(mod: tvm.IRModule) -> list[str]:
    """The ``*_weight_prepack`` functions ``mod``'s ``main`` still calls: a weight repacked at every call (none after
    ``fold_weight_prepack`` while weights are constants)."""
    return sorted(gv.name_hint for gv in relax.analysis.all_global_vars(mod["main"])
                  if gv.name_hint.endswith("_weight_prepack"))


def import_model(model: ModelSource, c_names: bool = False) -> tvm.IRModule:
    """The model as a Relax module, through TVM's frontend for its format. ``c_names``: an ONNX model's inputs named
    as C identifiers (``c_identifier``), for targets whose code is C source (CUDA)."""
    if model.frontend == "torch":
        from tvm.relax.frontend.torch import from_exported_program

        from farm.models import torch_program

        try:
            mod = from_exported_program(torch_program(model), keep_params_as_input=False)
        except Exception as exc:
            raise BuildError(f"TVM's torch importer rejected {model.name}: {message_line(exc)}",
                             "the program may use an operator TVM 0.27 does not support") from exc
        return for_inference(mod)
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
        return for_inference(mod)
    return import_onnx(model, c_names)


def c_identifier(name: str) -> str:
    """``name`` as a C identifier: TVM's CUDA codegen writes a model input's name into each kernel's parameters as
    it is, and TVM's ONNX importer only replaces dots (resnet50's ``gpu_0/data_0``: NVRTC "expected a ')'")."""
    legal = re.sub(r"\W", "_", name)
    return legal if legal[:1].isalpha() or legal[:1] == "_" else f"input_{legal}"


def _renamed_inputs(proto, rename: dict[str, str]):
    for graph_input in proto.graph.input:
        graph_input.name = rename.get(graph_input.name, graph_input.name)
    for node in proto.graph.node:
        node.input[:] = [rename.get(name, name) for name in node.input]
    return proto


def import_onnx(model: ModelSource, c_names: bool = False) -> tvm.IRModule:
    from tvm.relax.frontend.onnx import from_onnx

    rename = {spec.name: c_identifier(spec.name) if c_names else spec.name for spec in model.inputs}
    shapes = {rename[spec.name]: list(spec.shape) for spec in model.inputs}
    dtypes = {rename[spec.name]: spec.dtype for spec in model.inputs}
    try:
        mod = from_onnx(_renamed_inputs(onnx_proto(model), rename), shape_dict=shapes, dtype_dict=dtypes,
                        keep_params_in_input=False)
    except Exception as exc:
        raise BuildError(f"TVM's ONNX importer rejected {model.name}: {message_line(exc)}",
                         "the model may use an operator TVM 0.27 does not support; see the TVM log above") from exc
    return for_inference(mod)


def for_inference(mod: tvm.IRModule) -> tvm.IRModule:
    """An imported module as inference runs it: each batch norm that follows a convolution folded into its weights
    and a bias (TVM's ``FoldBatchnormToConv2D``, once the weights' constant expressions are folded, so computed
    weights count as constants), as onnxruntime and TFLite's converter fold them; then the other batch norms and
    training-only ops decomposed (``DecomposeOpsForInference``). Unfolded, a batch norm stays in the conv's kernel
    as a subtract, a divide, a multiply and an add on every output (resnet50: 53 of them) where folded it is one add.
    (Folding constants compiles each constant op: seconds; a module without batch norms skips it here.) TVM's pass
    adds a float32 epsilon to the variance, which TVM refuses for a float16 model (an fp16 variant): those keep
    their batch norms, decomposed."""
    if _batch_norm_dtypes(mod) == {"float32"}:
        for fold_pass in (relax.transform.FoldConstant(), relax.transform.FoldBatchnormToConv2D()):
            mod = fold_pass(mod)
    return relax.transform.DecomposeOpsForInference()(mod)


def _batch_norm_dtypes(mod: tvm.IRModule) -> set[str]:
    """The dtypes of the tensors ``mod``'s ``main`` batch-normalizes."""
    op, found = tvm.ir.Op.get("relax.nn.batch_norm"), set()
    relax.analysis.post_order_visit(
        mod["main"].body, lambda expr: found.add(str(expr.args[0].ty.dtype))
        if isinstance(expr, relax.Call) and expr.op.same_as(op) else None)
    return found
