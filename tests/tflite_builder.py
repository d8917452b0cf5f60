"""Write small, real .tflite files with the flatbuffers Builder, field by field per TFLite's schema.

No TensorFlow converter installs here; this builds the same FlatBuffer a converter writes
(file identifier "TFL3", schema version 3) for a chain of FULLY_CONNECTED layers. Field
indices follow tensorflow/lite/schema/schema.fbs.
"""

from __future__ import annotations

import flatbuffers
import numpy as np

FULLY_CONNECTED = 9  # BuiltinOperator
FULLY_CONNECTED_OPTIONS = 8  # BuiltinOptions union tag
RELU = 1  # ActivationFunctionType
FLOAT32 = 0  # TensorType


def _int_vector(builder: flatbuffers.Builder, values: list[int]) -> int:
    builder.StartVector(4, len(values), 4)
    for value in reversed(values):
        builder.PrependInt32(value)
    return builder.EndVector()


def _offset_vector(builder: flatbuffers.Builder, offsets: list[int]) -> int:
    builder.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    return builder.EndVector()


def build_mlp_tflite(sizes: list[int], seed: int = 0) -> bytes:
    """x[1, sizes[0]] → FC(relu) ... → FC → y[1, sizes[-1]], deterministic random weights."""
    rng = np.random.default_rng(seed)
    builder = flatbuffers.Builder(1024)
    buffers_data: list[bytes] = [b""]  # buffer 0 is the empty sentinel
    tensors = []  # (name, shape, buffer index)
    tensors.append(("x", [1, sizes[0]], 0))
    operators = []  # (inputs, outputs, activation)
    current = 0
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        weight = (rng.standard_normal((n_out, n_in)) * np.sqrt(2.0 / n_in)).astype("<f4")
        bias = (rng.standard_normal(n_out) * 0.1).astype("<f4")
        buffers_data += [weight.tobytes(), bias.tobytes()]
        tensors.append((f"w{i}", [n_out, n_in], len(buffers_data) - 2))
        tensors.append((f"b{i}", [n_out], len(buffers_data) - 1))
        last = i == len(sizes) - 2
        tensors.append(("y" if last else f"h{i}", [1, n_out], 0))
        out = len(tensors) - 1
        operators.append(([current, out - 2, out - 1], [out], 0 if last else RELU))
        current = out

    buffer_offsets = []
    for data in buffers_data:
        vector = builder.CreateByteVector(data) if data else None
        builder.StartObject(3)
        if vector is not None:
            builder.PrependUOffsetTRelativeSlot(0, vector, 0)
        buffer_offsets.append(builder.EndObject())
    tensor_offsets = []
    for name, shape, buffer in tensors:
        name_offset = builder.CreateString(name)
        shape_offset = _int_vector(builder, shape)
        builder.StartObject(8)
        builder.PrependUOffsetTRelativeSlot(0, shape_offset, 0)
        builder.PrependInt8Slot(1, FLOAT32, 0)
        builder.PrependUint32Slot(2, buffer, 0)
        builder.PrependUOffsetTRelativeSlot(3, name_offset, 0)
        tensor_offsets.append(builder.EndObject())
    operator_offsets = []
    for inputs, outputs, activation in operators:
        builder.StartObject(4)  # FullyConnectedOptions
        builder.PrependInt8Slot(0, activation, 0)
        options = builder.EndObject()
        in_offset, out_offset = _int_vector(builder, inputs), _int_vector(builder, outputs)
        builder.StartObject(6)
        builder.PrependUint32Slot(0, 0, 0)  # opcode_index
        builder.PrependUOffsetTRelativeSlot(1, in_offset, 0)
        builder.PrependUOffsetTRelativeSlot(2, out_offset, 0)
        builder.PrependUint8Slot(3, FULLY_CONNECTED_OPTIONS, 0)
        builder.PrependUOffsetTRelativeSlot(4, options, 0)
        operator_offsets.append(builder.EndObject())
    tensors_vec = _offset_vector(builder, tensor_offsets)
    inputs_vec, outputs_vec = _int_vector(builder, [0]), _int_vector(builder, [len(tensors) - 1])
    operators_vec = _offset_vector(builder, operator_offsets)
    subgraph_name = builder.CreateString("main")
    builder.StartObject(5)
    builder.PrependUOffsetTRelativeSlot(0, tensors_vec, 0)
    builder.PrependUOffsetTRelativeSlot(1, inputs_vec, 0)
    builder.PrependUOffsetTRelativeSlot(2, outputs_vec, 0)
    builder.PrependUOffsetTRelativeSlot(3, operators_vec, 0)
    builder.PrependUOffsetTRelativeSlot(4, subgraph_name, 0)
    subgraph = builder.EndObject()
    builder.StartObject(4)  # OperatorCode
    builder.PrependInt8Slot(0, FULLY_CONNECTED, 0)
    builder.PrependInt32Slot(2, 1, 1)
    builder.PrependInt32Slot(3, FULLY_CONNECTED, 0)
    opcode = builder.EndObject()
    opcodes_vec = _offset_vector(builder, [opcode])
    subgraphs_vec = _offset_vector(builder, [subgraph])
    buffers_vec = _offset_vector(builder, buffer_offsets)
    description = builder.CreateString("farm test model")
    builder.StartObject(8)
    builder.PrependUint32Slot(0, 3, 0)
    builder.PrependUOffsetTRelativeSlot(1, opcodes_vec, 0)
    builder.PrependUOffsetTRelativeSlot(2, subgraphs_vec, 0)
    builder.PrependUOffsetTRelativeSlot(3, description, 0)
    builder.PrependUOffsetTRelativeSlot(4, buffers_vec, 0)
    model = builder.EndObject()
    builder.Finish(model, file_identifier=b"TFL3")
    return bytes(builder.Output())
