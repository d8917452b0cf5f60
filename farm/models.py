"""Models: load ONNX files, generate the built-in zoo, compute reference outputs.

The only module that imports ``onnx`` and ``onnxruntime``. The built-in models
have deterministic random weights (a fixed seed per model), so their outputs are
meaningful to check, unlike the constant-weight architectures the onnx package ships
(available as ``onnx:NAME`` for compile and timing work).
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from farm.errors import ModelError
from farm.records import InputSpec, ModelSource

OPSET = 17
LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...], fan_in: int) -> TensorProto:
    value = rng.standard_normal(shape).astype(np.float32) * np.float32(np.sqrt(2.0 / fan_in))
    return numpy_helper.from_array(value, name)


def build_mlp() -> onnx.ModelProto:
    """x[1,64] → Gemm 128 → Relu → Gemm 10. Seed 1."""
    rng = np.random.default_rng(1)
    inits = [
        _init(rng, "w1", (64, 128), 64), _init(rng, "b1", (128,), 64),
        _init(rng, "w2", (128, 10), 128), _init(rng, "b2", (10,), 128),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits,
    )
    return _finish(graph)


def build_convnet() -> onnx.ModelProto:
    """x[1,3,32,32] → conv16 → relu → maxpool → conv32 → relu → (features, GAP → fc10). Seed 2.

    Two outputs of very different sizes (logits 40 B, features 32 KiB) so copy costs
    are measured by size.
    """
    rng = np.random.default_rng(2)
    inits = [
        _init(rng, "c1w", (16, 3, 3, 3), 27), _init(rng, "c1b", (16,), 27),
        _init(rng, "c2w", (32, 16, 3, 3), 144), _init(rng, "c2b", (32,), 144),
        _init(rng, "fcw", (32, 10), 32), _init(rng, "fcb", (10,), 32),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "c1w", "c1b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "c2w", "c2b"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["features"]),
        helper.make_node("GlobalAveragePool", ["features"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fcw", "fcb"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10]),
         helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 32, 16, 16])],
        inits,
    )
    return _finish(graph)


def build_mobile_block() -> onnx.ModelProto:
    """x[1,16,32,32] → depthwise 3×3 → relu → pointwise 32 → relu → GAP → fc10: a MobileNet block. Seed 3."""
    rng = np.random.default_rng(3)
    inits = [
        _init(rng, "dww", (16, 1, 3, 3), 9), _init(rng, "dwb", (16,), 9),
        _init(rng, "pww", (32, 16, 1, 1), 16), _init(rng, "pwb", (32,), 16),
        _init(rng, "fcw", (32, 10), 32), _init(rng, "fcb", (10,), 32),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "dww", "dwb"], ["dw"], pads=[1, 1, 1, 1], group=16),
        helper.make_node("Relu", ["dw"], ["r1"]),
        helper.make_node("Conv", ["r1", "pww", "pwb"], ["pw"]),
        helper.make_node("Relu", ["pw"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fcw", "fcb"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "mobile_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits,
    )
    return _finish(graph)


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="farm")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


BUILTINS: dict[str, Callable[[], onnx.ModelProto]] = {
    "mlp": build_mlp, "convnet": build_convnet, "mobile-block": build_mobile_block,
}


def list_models() -> list[dict[str, str]]:
    rows = [{"name": n, "kind": "builtin", "about": (f.__doc__ or "").strip().splitlines()[0]} for n, f in BUILTINS.items()]
    for path in sorted(LIGHT_DIR.glob("light_*.onnx")):
        name = path.stem.removeprefix("light_")
        rows.append({"name": f"onnx:{name}", "kind": "onnx-package", "about": "constant weights: timing only, outputs are flat"})
    return rows


def load_model(spec: str, shapes: dict[str, tuple[int, ...]] | None = None) -> ModelSource:
    """``spec`` is a built-in name, ``onnx:NAME`` from the onnx package, a path to a .onnx file,
    a torch.export program (.pt2), or ``module:factory`` returning a torch.nn.Module (with ``shapes``)."""
    if spec.endswith(".pt2") or (":" in spec and not spec.startswith("onnx:") and not Path(spec).exists()
                                 and "/" not in spec):
        return _load_torch(spec, shapes or {})
    if spec.endswith(".tflite"):
        return _load_tflite(spec, shapes or {})
    if spec in BUILTINS:
        proto = BUILTINS[spec]()
        return _source(spec, f"builtin:{spec}", proto.SerializeToString(), proto, shapes)
    if spec.startswith("onnx:"):
        path = LIGHT_DIR / f"light_{spec[5:]}.onnx"
        if not path.exists():
            names = ", ".join(r["name"] for r in list_models() if r["kind"] == "onnx-package")
            raise ModelError(f"no model {spec!r} in the onnx package", f"available: {names}")
        name = spec
    else:
        path = Path(spec)
        name = path.stem
        if not path.exists():
            raise ModelError(
                f"model file {spec} does not exist",
                f"give a path to a .onnx file or a built-in model ({', '.join(BUILTINS)}); see `farm models`",
            )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelError(f"cannot read model file {path}: {exc.strerror}", "check the path and permissions") from None
    try:
        proto = onnx.load_model_from_string(data)
        onnx.checker.check_model(proto)
    except Exception as exc:  # protobuf DecodeError, onnx ValidationError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"{path} is not a valid ONNX model ({first})",
            "the file may be truncated or not ONNX: export it again (torch.onnx.export, tf2onnx)",
        ) from None
    if not proto.graph.output:
        raise ModelError(f"{path} has no graph outputs", "export the model with its outputs")
    return _source(name, str(path), data, proto, shapes)


TORCH_HINT = "PyTorch models need torch: pip install 'farm[torch]' (the CPU build, torch==2.13.0)"


def _torch():
    try:
        import torch
    except ImportError:
        raise ModelError("torch is not installed", TORCH_HINT) from None
    return torch


def _load_torch(spec: str, shapes: dict[str, tuple[int, ...]]) -> ModelSource:
    """A .pt2 file (torch.export.save) or ``module:factory`` exported here with ``shapes``."""
    import importlib
    import inspect
    import io

    torch = _torch()
    if spec.endswith(".pt2"):
        path = Path(spec)
        if not path.exists():
            raise ModelError(f"model file {spec} does not exist", "save one with torch.export.save(program, path)")
        data = path.read_bytes()
        try:
            program = torch.export.load(io.BytesIO(data))
        except Exception as exc:
            raise ModelError(f"{spec} is not a torch.export program ({str(exc).splitlines()[0][:200]})",
                             "save it with torch.export.save(torch.export.export(model, example_inputs), path)") from None
        name = path.stem
    else:
        module_name, _, factory_name = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), factory_name)
        except (ImportError, AttributeError) as exc:
            raise ModelError(f"cannot import {spec}: {exc}", "write module:factory, importable from here") from None
        module = factory().eval()
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        missing = [p.name for p in params if p.name not in shapes]
        if missing:
            raise ModelError(f"{spec}: input {missing[0]!r} needs a shape",
                             f"pass --shape {missing[0]}=1,3,224,224 for each forward() argument")
        example = tuple(torch.from_numpy(np.random.default_rng(0).standard_normal(shapes[p.name]).astype(np.float32))
                        for p in params)
        try:
            program = torch.export.export(module, example)
        except Exception as exc:
            raise ModelError(f"torch.export could not export {spec}: {str(exc).splitlines()[0][:200]}",
                             "the module must be exportable by torch.export (no data-dependent control flow)") from None
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        data, name = buffer.getvalue(), factory_name
    inputs = []
    user_inputs = set(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user_inputs:
            value = node.meta["val"]
            inputs.append(InputSpec(node.name, tuple(int(d) for d in value.shape), str(value.dtype).removeprefix("torch.")))
    return ModelSource(name=name, origin=spec, digest=hashlib.sha256(data).hexdigest(), data=data,
                       inputs=tuple(inputs), frontend="torch")


TFLITE_HINT = "TFLite models need the tflite parser and LiteRT: pip install 'farm[tflite]'"
TFLITE_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool", 7: "int16", 9: "int8"}


def tflite_model(model: ModelSource):
    try:
        import tflite
    except ImportError:
        raise ModelError("the tflite package is not installed", TFLITE_HINT) from None
    return tflite.Model.GetRootAsModel(model.data, 0)


def _load_tflite(spec: str, shapes: dict[str, tuple[int, ...]]) -> ModelSource:
    path = Path(spec)
    if not path.exists():
        raise ModelError(f"model file {spec} does not exist", "give a path to a .tflite file")
    data = path.read_bytes()
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ModelError(f"{spec} is not a TFLite model (no TFL3 identifier)", "the file may be truncated; convert it again")
    source = ModelSource(name=path.stem, origin=spec, digest=hashlib.sha256(data).hexdigest(), data=data, inputs=(),
                         frontend="tflite")
    try:
        graph = tflite_model(source).Subgraphs(0)
        inputs = []
        for i in range(graph.InputsLength()):
            tensor = graph.Tensors(graph.Inputs(i))
            name = tensor.Name().decode()
            shape = shapes.get(name) or tuple(int(d) for d in tensor.ShapeAsNumpy())
            if any(d <= 0 for d in shape):
                raise ModelError(f"{spec}: input {name!r} has a dynamic dimension",
                                 f"bind it with --shape {name}=1,224,224,3")
            inputs.append(InputSpec(name, tuple(shape), TFLITE_TYPES.get(tensor.Type(), "float32")))
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"{spec} could not be parsed as TFLite ({exc})", "the file may be truncated; convert it again") from None
    return dataclasses.replace(source, inputs=tuple(inputs))


def torch_program(model: ModelSource):
    import io

    return _torch().export.load(io.BytesIO(model.data))


def _source(name: str, origin: str, data: bytes, proto: onnx.ModelProto, shapes) -> ModelSource:
    return ModelSource(
        name=name, origin=origin, digest=hashlib.sha256(data).hexdigest(), data=data,
        inputs=_input_specs(proto, shapes or {}, origin),
    )


def _input_specs(proto: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], origin: str) -> tuple[InputSpec, ...]:
    initializers = {init.name for init in proto.graph.initializer}
    specs = []
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        if value.name in shapes:
            shape = tuple(shapes[value.name])
        else:
            dims = []
            for i, dim in enumerate(tensor.shape.dim):
                if not dim.HasField("dim_value") or dim.dim_value <= 0:
                    label = dim.dim_param or f"dim {i}"
                    raise ModelError(
                        f"{origin}: input {value.name!r} has a dynamic dimension ({label})",
                        f"bind it with --shape {value.name}=1,3,224,224 (every dimension, comma-separated)",
                    )
                dims.append(dim.dim_value)
            shape = tuple(dims)
        specs.append(InputSpec(value.name, shape, dtype))
    return tuple(specs)


VARIANTS = ("fp32", "fp16", "int8")
CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
# Accuracy drift a variant may show against fp32, as a fraction of the fp32 output's range.
VARIANT_TOLERANCE = {"fp16": 0.01, "int8": 0.05}


def make_variant(model: ModelSource, variant: str, calibration: str = "minmax", calibration_dir: str | None = None,
                 samples: int = 16) -> ModelSource:
    """fp16: the graph converted to float16 (inputs too). int8: static QDQ quantization by onnxruntime,
    calibrated with ``calibration`` on ``calibration_dir`` (.npz files of inputs) or generated inputs."""
    if variant == "fp32":
        return model
    if model.frontend != "onnx":
        raise ModelError(f"variants need an ONNX model; {model.name} is a {model.frontend} model",
                         "export it to ONNX (torch.onnx.export) to compare fp16/int8")
    if variant not in VARIANTS:
        raise ModelError(f"unknown variant {variant!r}", f"use one of {', '.join(VARIANTS)}")
    proto = onnx_proto(model)
    if variant == "fp16":
        try:
            from onnxconverter_common import float16
        except ImportError:
            raise ModelError("the fp16 variant needs onnxconverter-common", "pip install onnxconverter-common") from None
        converted = float16.convert_float_to_float16(proto, keep_io_types=False)
        origin = f"{model.origin}@fp16"
    else:
        converted, origin = _quantize_int8(model, proto, calibration, calibration_dir, samples)
    data = converted.SerializeToString()
    return ModelSource(name=f"{model.name}@{variant}", origin=origin, digest=hashlib.sha256(data).hexdigest(),
                       data=data, inputs=_input_specs(converted, {s.name: s.shape for s in model.inputs}, origin),
                       variant=variant, base_onnx=model.data)


def _quantize_int8(model: ModelSource, proto, calibration: str, calibration_dir: str | None, samples: int):
    import tempfile

    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

    methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}
    if calibration not in methods:
        raise ModelError(f"unknown calibration {calibration!r}", f"use one of {', '.join(CALIBRATION_METHODS)}")
    if calibration_dir:
        files = sorted(Path(calibration_dir).glob("*.npz"))
        if not files:
            raise ModelError(f"no .npz calibration inputs in {calibration_dir}",
                             "save inputs with np.savez(path, **{input_name: array}) one file per sample")
        batches = [{k: v for k, v in np.load(f).items()} for f in files]
        source = f"{calibration_dir} ({len(files)} samples)"
    else:
        batches = [make_inputs(model, seed=1000 + i) for i in range(samples)]
        source = f"generated ({samples} samples, seeds 1000+)"

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._items = iter(batches)

        def get_next(self):
            return next(self._items, None)

    with tempfile.TemporaryDirectory(prefix="farm-int8-") as tmp:
        onnx.save(proto, f"{tmp}/fp32.onnx")
        try:
            quantize_static(f"{tmp}/fp32.onnx", f"{tmp}/int8.onnx", Reader(), quant_format=QuantFormat.QDQ,
                            calibrate_method=methods[calibration], activation_type=QuantType.QInt8,
                            weight_type=QuantType.QInt8)
        except Exception as exc:
            raise ModelError(f"int8 calibration of {model.name} failed: {exc}".splitlines()[0],
                             "check the calibration inputs match the model's inputs") from None
        quantized = onnx.load(f"{tmp}/int8.onnx")
    return quantized, f"{model.origin}@int8:{calibration}:{source}"


def load_model_variant(spec: str, shapes: dict[str, tuple[int, ...]] | None = None) -> ModelSource:
    """``NAME`` or ``NAME@VARIANT`` (int8 calibrated with min-max on generated inputs)."""
    base, _, variant = spec.rpartition("@")
    if base and variant in VARIANTS:
        return make_variant(load_model(base, shapes), variant)
    return load_model(spec, shapes)


def make_inputs(model: ModelSource, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic inputs: standard normal floats, small non-negative integers."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in model.inputs:
        if np.issubdtype(np.dtype(spec.dtype), np.floating):
            inputs[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
        elif spec.dtype == "bool":
            inputs[spec.name] = rng.integers(0, 2, spec.shape).astype(bool)
        else:
            inputs[spec.name] = rng.integers(0, 10, spec.shape).astype(spec.dtype)
    return inputs


def onnx_proto(model: ModelSource) -> onnx.ModelProto:
    return onnx.load_model_from_string(model.data)


def reference_outputs(model: ModelSource, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of onnxruntime on the CPU, the reference farm checks TVM against.

    For a variant: the fp32 model's outputs on the same inputs in fp32, so the check measures
    the variant's accuracy drift."""
    if model.frontend == "tflite":
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            raise ModelError("LiteRT (ai-edge-litert) is not installed: no TFLite reference", TFLITE_HINT) from None
        interpreter = Interpreter(model_content=model.data)
        interpreter.allocate_tensors()
        for detail in interpreter.get_input_details():
            interpreter.set_tensor(detail["index"], inputs[detail["name"]])
        interpreter.invoke()
        return [np.array(interpreter.get_tensor(d["index"])) for d in interpreter.get_output_details()]
    if model.frontend == "torch":
        torch = _torch()
        with torch.no_grad():
            out = torch_program(model).module()(*[torch.from_numpy(v) for v in inputs.values()])
        flat = list(out) if isinstance(out, (tuple, list)) else [out]
        return [o.detach().numpy() for o in flat]
    import onnxruntime

    try:
        if model.base_onnx:
            session = onnxruntime.InferenceSession(model.base_onnx, providers=["CPUExecutionProvider"])
            inputs = {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in inputs.items()}
        else:
            session = onnxruntime.InferenceSession(model.data, providers=["CPUExecutionProvider"])
        return [np.asarray(o) for o in session.run(None, inputs)]
    except Exception as exc:
        raise ModelError(f"onnxruntime could not run {model.name}: {exc}", "the check will be skipped") from None


def load_reference_file(path: str) -> list[np.ndarray]:
    """Expected outputs saved by the user with ``np.savez(path, out0, out1, ...)``."""
    try:
        with np.load(path) as data:
            return [data[k] for k in data.files]  # archive order is saving order
    except FileNotFoundError:
        raise ModelError(f"reference file {path} does not exist", "save expected outputs with np.savez(path, out0, ...)") from None
    except Exception as exc:
        raise ModelError(f"cannot read reference file {path}: {exc}", "save expected outputs with np.savez(path, out0, ...)") from None
