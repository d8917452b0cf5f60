"""fp16 and int8 variants of ONNX models (onnxconverter-common, onnxruntime's static quantization)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx

from farm.errors import ModelError, message_line
from farm.models.sources import _input_specs, graph_ops, make_inputs, onnx_proto
from farm.records import CALIBRATION_METHODS, VARIANTS, ModelSource, split_variant  # noqa: F401 (the models' API)
# Accuracy drift a variant may show against fp32, as a fraction of the fp32 output's range.
VARIANT_TOLERANCE = {"fp16": 0.01, "int8": 0.05}


def make_variant(model: ModelSource, variant: str, calibration: str = CALIBRATION_METHODS[0], calibration_dir: str | None = None,
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
        except ImportError as exc:
            raise ModelError("the fp16 variant needs onnxconverter-common", "pip install onnxconverter-common") from exc
        converted = float16.convert_float_to_float16(proto, keep_io_types=False)
        origin = f"{model.origin}@fp16"
    else:
        converted, origin = _quantize_int8(model, proto, calibration, calibration_dir, samples)
    data = converted.SerializeToString()
    return ModelSource(name=f"{model.name}@{variant}", origin=origin, digest=hashlib.sha256(data).hexdigest(),
                       data=data, inputs=_input_specs(converted, {s.name: s.shape for s in model.inputs}, origin),
                       variant=variant, base_onnx=model.data, ops=graph_ops(converted))


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
            raise ModelError(f"int8 calibration of {model.name} failed: {message_line(exc)}",
                             "check the calibration inputs match the model's inputs") from exc
        quantized = onnx.load(f"{tmp}/int8.onnx")
    return quantized, f"{model.origin}@int8:{calibration}:{source}"
