"""Op classes: what kind of work a kernel does, by its name (TVM's kernels) or its op type (onnxruntime's nodes), so
two runtimes that fuse their own ways compare class by class: conv, matmul/dense, pool, layout/copy/concat, reduction,
elementwise, other; and TVM's own VM calls, "vm". No TVM."""

from __future__ import annotations

import re

VM_CALL = "vm.builtin."  # the VM's own calls: allocations, shape checks, tuples
# Op classes by the words of a kernel's name (TVM's: ``fused_conv2d_add_relu``, ``max_pool2d``, ``concatenate2``), first
# class with a word wins: a fused conv2d_add_relu is a conv. A word matches with a dimension or counter after it
# (conv2d, pool2d, matmul1); not inside another word (erfinv is no erf).
OP_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("conv", ("conv",)),
    ("matmul/dense", ("matmul", "dense", "gemm", "linear", "batch")),
    ("pool", ("pool",)),
    ("layout/copy/concat", ("concat", "concatenate", "transpose", "reshape", "layout", "copy", "split", "strided",
                            "take", "squeeze", "expand", "pad", "broadcast", "flatten", "stack", "gather")),
    ("reduction", ("sum", "mean", "max", "min", "softmax", "norm", "reduce", "argmax", "argmin", "prod")),
    ("elementwise", ("add", "multiply", "subtract", "divide", "relu", "sigmoid", "tanh", "exp", "clip", "cast",
                     "sqrt", "power", "erf", "gelu", "where", "negative", "log", "maximum", "minimum")),
)
_WORD = re.compile(r"([a-z]+)(?:\d+d?\d*)?")


def op_class(name: str) -> str:
    """A kernel's op class by its name: conv, matmul/dense, pool, layout/copy/concat, reduction, elementwise, other;
    the VM's own calls are "vm"."""
    if name.startswith(VM_CALL):
        return "vm"
    words = {m.group(1) for part in name.lower().split("_") if (m := _WORD.fullmatch(part))}
    return next((label for label, keys in OP_CLASSES if words & set(keys)), "other")


# onnxruntime's op types (its optimised graph's: FusedConv, NchwcConv, QLinearConv …) by the same op classes; a type
# not listed goes by the words of its name as TVM's kernels do (``op_class``)
ONNX_OP_CLASSES = {
    "conv": ("Conv", "FusedConv", "ConvTranspose", "QLinearConv", "ConvInteger", "NhwcFusedConv"),
    "matmul/dense": ("MatMul", "Gemm", "FusedMatMul", "FusedGemm", "MatMulInteger", "QLinearMatMul",
                     "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "Attention"),
    "pool": ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "QLinearAveragePool",
             "QLinearGlobalAveragePool"),
    "layout/copy/concat": ("Concat", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split",
                           "Gather", "Pad", "Expand", "Tile", "ReorderInput", "ReorderOutput", "Identity",
                           "DepthToSpace", "SpaceToDepth", "Resize", "Upsample", "Shape", "Cast"),
    "reduction": ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "Softmax", "LogSoftmax",
                  "LayerNormalization", "SkipLayerNormalization", "ArgMax", "ArgMin"),
    "elementwise": ("Add", "Mul", "Sub", "Div", "Relu", "Sigmoid", "Tanh", "Clip", "Exp", "Sqrt", "Pow", "Erf",
                    "Gelu", "FastGelu", "BiasGelu", "Where", "Neg", "Log", "Max", "Min", "LeakyRelu", "HardSigmoid",
                    "HardSwish", "BatchNormalization", "QuantizeLinear", "DequantizeLinear", "Sum", "PRelu"),
}
_ONNX_CLASS = {op: label for label, ops in ONNX_OP_CLASSES.items() for op in ops}


def onnx_op_class(op_type: str) -> str:
    """An onnxruntime node's op class by its op type (``ONNX_OP_CLASSES``), else by its name's words."""
    return _ONNX_CLASS.get(op_type) or op_class(re.sub(r"(?<!^)(?=[A-Z])", "_", op_type).lower())
