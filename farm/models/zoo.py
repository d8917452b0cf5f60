"""The built-in zoo (deterministic random weights, a fixed seed per model) and the onnx package's architectures."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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


def leaky_variant(spec: str, folder: Path) -> Path:
    """A built-in or ``onnx:NAME`` model with every Relu made a LeakyRelu, saved in ``folder``: the same convs with
    another epilogue, so none of its tasks is another model's (records reach it by anchor block only). For tests
    and benches of record reuse."""
    proto = BUILTINS[spec]() if spec in BUILTINS else onnx.load(LIGHT_DIR / f"light_{spec.removeprefix('onnx:')}.onnx")
    for node in proto.graph.node:
        if node.op_type == "Relu":
            node.op_type = "LeakyRelu"
    path = Path(folder) / f"{spec.removeprefix('onnx:')}-leaky.onnx"
    onnx.save(proto, path)
    return path


def list_models() -> list[dict[str, str]]:
    rows = [{"name": n, "kind": "builtin", "about": (f.__doc__ or "").strip().splitlines()[0]} for n, f in BUILTINS.items()]
    for path in sorted(LIGHT_DIR.glob("light_*.onnx")):
        name = path.stem.removeprefix("light_")
        rows.append({"name": f"onnx:{name}", "kind": "onnx-package", "about": "constant weights: timing only, outputs are flat"})
    return rows
