"""ONNX models as farm sees them: a ModelSource with its input signature, and deterministic inputs."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
from onnx import helper

from farm.errors import ModelError
from farm.records import InputSpec, ModelSource


def _source(name: str, origin: str, data: bytes, proto: onnx.ModelProto, shapes) -> ModelSource:
    return ModelSource(
        name=name, origin=origin, digest=hashlib.sha256(data).hexdigest(), data=data,
        inputs=_input_specs(proto, shapes or {}, origin), ops=graph_ops(proto),
    )


def graph_ops(proto: onnx.ModelProto) -> tuple[str, ...]:
    """The operator types of a model's main graph, sorted, each once; a grouped convolution (``group`` > 1) is named
    ``DepthwiseConv`` beside ``Conv``'s other uses, since TVM schedules it apart (what a finding names models by)."""
    ops = set()
    for node in proto.graph.node:
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        ops.add("DepthwiseConv" if node.op_type == "Conv" and group > 1 else node.op_type)
    return tuple(sorted(ops))


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
