import numpy as np
import onnx
import pytest

from farm.errors import ModelError
from farm.models import build_convnet, list_models, load_model, make_inputs, reference_outputs


def test_builtin_models_are_deterministic():
    assert load_model("mlp").digest == load_model("mlp").digest
    assert load_model("convnet").digest != load_model("mlp").digest


def test_builtin_convnet_signature_and_reference():
    model = load_model("convnet")
    assert [(s.name, s.shape, s.dtype) for s in model.inputs] == [("x", (1, 3, 32, 32), "float32")]
    outputs = reference_outputs(model, make_inputs(model))
    assert [o.shape for o in outputs] == [(1, 10), (1, 32, 16, 16)]
    assert np.std(outputs[0]) > 0  # random weights: outputs are not flat


def test_onnx_package_models_listed_and_loadable():
    names = [row["name"] for row in list_models()]
    assert "mlp" in names and "onnx:squeezenet" in names
    assert load_model("onnx:squeezenet").inputs[0].shape == (1, 3, 224, 224)


def test_missing_model_file(tmp_path):
    with pytest.raises(ModelError) as info:
        load_model(str(tmp_path / "nope.onnx"))
    assert "does not exist" in info.value.message
    assert "built-in model" in info.value.hint


def test_truncated_onnx_file(tmp_path):
    data = build_convnet().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError) as info:
        load_model(str(path))
    assert "is not a valid ONNX model" in info.value.message
    assert "truncated" in info.value.hint


def test_dynamic_dimension_must_be_bound(tmp_path):
    model = build_convnet()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "dyn.onnx"
    onnx.save(model, path)
    with pytest.raises(ModelError) as info:
        load_model(str(path))
    assert "dynamic dimension (batch)" in info.value.message
    assert "--shape x=" in info.value.hint
    assert load_model(str(path), {"x": (2, 3, 32, 32)}).inputs[0].shape == (2, 3, 32, 32)
