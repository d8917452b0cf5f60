"""Models: load ONNX, PyTorch and TFLite models, the built-in zoo, variants, reference outputs.

The only package that imports ``onnx``, ``onnxruntime``, ``torch`` and ``tflite``. The built-in
models have deterministic random weights (a fixed seed per model), so their outputs are
meaningful to check, unlike the constant-weight architectures the onnx package ships
(available as ``onnx:NAME`` for compile and timing work). Modules: ``zoo`` (built-ins),
``sources`` (ModelSource from ONNX, inputs), ``frameworks`` (torch, TFLite), ``variants``
(fp16, int8); this file loads by spec and computes references.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import onnx

from farm.errors import ModelError, message_line
from farm.models.frameworks import TFLITE_HINT, _torch, load_tflite, load_torch, tflite_model, torch_program
from farm.models.sources import _source, make_inputs, onnx_proto
from farm.models.variants import CALIBRATION_METHODS, VARIANT_TOLERANCE, VARIANTS, make_variant, split_variant
from farm.models.zoo import BUILTINS, LIGHT_DIR, build_convnet, build_mlp, build_mobile_block, list_models
from farm.records import ModelSource

__all__ = [
    "BUILTINS", "CALIBRATION_METHODS", "VARIANTS", "VARIANT_TOLERANCE", "split_variant", "build_convnet", "build_mlp",
    "build_mobile_block", "list_models", "load_model", "load_model_variant", "load_reference_file", "make_inputs",
    "load_test_data", "make_variant", "onnx_proto", "reference_outputs", "shipped_test_data", "tflite_model",
    "torch_program", "torch_spec",
]


def torch_spec(spec: str) -> bool:
    """Whether ``load_model`` loads ``spec`` with torch: a .pt2 program, or ``module:factory`` (imported and called:
    a lab host runs those only where it lists them, ``lab.worker.refuse_unlisted_factory``)."""
    return spec.endswith(".pt2") or (":" in spec and not spec.startswith("onnx:") and not Path(spec).exists()
                                     and "/" not in spec)


def load_model(spec: str, shapes: dict[str, tuple[int, ...]] | None = None) -> ModelSource:
    """``spec`` is a built-in name, ``onnx:NAME`` from the onnx package, a path to a .onnx file,
    a torch.export program (.pt2), or ``module:factory`` returning a torch.nn.Module (with ``shapes``)."""
    if torch_spec(spec):
        return load_torch(spec, shapes or {})
    if spec.endswith(".tflite"):
        return load_tflite(spec, shapes or {})
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
        raise ModelError(f"cannot read model file {path}: {exc.strerror}", "check the path and permissions") from exc
    try:
        proto = onnx.load_model_from_string(data)
        onnx.checker.check_model(proto)
    except Exception as exc:  # protobuf DecodeError, onnx ValidationError
        raise ModelError(
            f"{path} is not a valid ONNX model ({message_line(exc)})",
            "the file may be truncated or not ONNX: export it again (torch.onnx.export, tf2onnx)",
        ) from exc
    if not proto.graph.output:
        raise ModelError(f"{path} has no graph outputs", "export the model with its outputs")
    return _source(name, str(path), data, proto, shapes)


def load_model_variant(spec: str, shapes: dict[str, tuple[int, ...]] | None = None) -> ModelSource:
    """``NAME`` or ``NAME@VARIANT`` (int8 calibrated with min-max on generated inputs)."""
    base, variant = split_variant(spec)
    if base != spec:
        model = load_model(base, shapes)
        made = make_variant(model, variant)
        identity = hashlib.sha256(f"{model.identity_digest}@{variant}".encode()).hexdigest()
        return dataclasses.replace(made, identity=identity)  # its base's identity: the variant is made from it
    return load_model(spec, shapes)


def reference_outputs(model: ModelSource, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of onnxruntime on the CPU, the reference farm checks TVM against.

    For a variant: the fp32 model's outputs on the same inputs in fp32, so the check measures
    the variant's accuracy drift."""
    if model.frontend == "tflite":
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError as exc:
            raise ModelError("LiteRT (ai-edge-litert) is not installed: no TFLite reference", TFLITE_HINT) from exc
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
        raise ModelError(f"onnxruntime could not run {model.name}: {message_line(exc)}", "the check will be skipped") from exc


def shipped_test_data(model: ModelSource) -> Path | None:
    """The ``test_data_set_0`` folder beside an ONNX model file (the onnx package's and the ONNX model zoo's
    layout: ``input_N.pb`` / ``output_N.pb``), when there is one: the model's own inputs and expected outputs."""
    if model.frontend != "onnx" or model.variant != "fp32" or model.origin.startswith(("builtin:", "module:")):
        return None
    folder = Path(model.origin).parent / "test_data_set_0"
    return folder if (folder / "output_0.pb").is_file() else None


def load_test_data(folder: str | Path, model: ModelSource) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """A ``test_data_set_*`` folder's inputs (by the model's input names, in order) and expected outputs."""
    from onnx import numpy_helper

    folder = Path(folder)
    hint = "a test_data_set folder holds input_0.pb … and output_0.pb … (onnx TensorProto files)"

    def tensors(prefix: str) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        while (path := folder / f"{prefix}_{len(out)}.pb").is_file():
            try:
                out.append(numpy_helper.to_array(onnx.load_tensor(str(path))))
            except Exception as exc:  # protobuf's DecodeError and friends
                raise ModelError(f"cannot read {path}: {message_line(exc)}", hint) from exc
        return out

    inputs, outputs = tensors("input"), tensors("output")
    if not outputs:
        raise ModelError(f"{folder} has no output_0.pb", hint)
    if len(inputs) != len(model.inputs):
        raise ModelError(f"{folder} has {len(inputs)} input(s), {model.name} takes {len(model.inputs)}", hint)
    for spec, value in zip(model.inputs, inputs):
        if tuple(value.shape) != tuple(spec.shape) or str(value.dtype) != spec.dtype:
            raise ModelError(f"{folder}: input {spec.name} is {value.dtype}{list(value.shape)}, the model takes "
                             f"{spec.dtype}{list(spec.shape)}", "pass the test data of this model (or --shape)")
    return {spec.name: value for spec, value in zip(model.inputs, inputs)}, outputs


def load_reference_file(path: str) -> list[np.ndarray]:
    """Expected outputs saved by the user with ``np.savez(path, out0, out1, ...)``."""
    try:
        with np.load(path) as data:
            return [data[k] for k in data.files]  # archive order is saving order
    except FileNotFoundError as exc:
        raise ModelError(f"reference file {path} does not exist", "save expected outputs with np.savez(path, out0, ...)") from exc
    except Exception as exc:
        raise ModelError(f"cannot read reference file {path}: {exc}",
                         "save expected outputs with np.savez(path, out0, ...)") from exc
