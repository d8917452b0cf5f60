"""TFLite models through TVM's Relax TFLite frontend, checked against LiteRT's own output."""

import json

import pytest

pytest.importorskip("tflite", reason="TFLite is the optional extra farm[tflite]")
pytest.importorskip("ai_edge_litert", reason="TFLite is the optional extra farm[tflite]")

from tests.conftest import run_farm  # noqa: E402
from tests.tflite_builder import build_mlp_tflite  # noqa: E402


def test_tflite_file_benchmarked_and_checked_against_litert(farm_net, inventory_file, farm_env, tmp_path):
    path = tmp_path / "dense.tflite"
    path.write_bytes(build_mlp_tflite([64, 32, 10]))
    proc = run_farm("--devices", str(inventory_file), "bench", "--device", "cpu-a", "--model", str(path),
                    "--repeat", "3", "--min-repeat-ms", "5", "--json", env=farm_env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["model"] == "dense" and data["check"]["reference"] == "litert"
    assert data["check"]["status"] == "passed" and data["check"]["max_abs_err"] < 1e-4
    ref = data["reference"]  # LiteRT timed beside TVM, checked against the same outputs
    assert (ref["runtime"], ref["status"], ref["check"]["status"]) == ("litert", "ok", "passed")
    assert ref["runtime_version"] and len(ref["steady_samples_s"]) == 3 and data["versus_reference"].startswith("TVM ")


def test_truncated_tflite_is_one_error_line(inventory_file, farm_env, tmp_path):
    path = tmp_path / "cut.tflite"
    path.write_bytes(build_mlp_tflite([64, 32, 10])[:40])
    proc = run_farm("--devices", str(inventory_file), "compile", "--device", "cpu-a", "--model", str(path), env=farm_env)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[0].startswith(f"error: {path} could not be parsed as TFLite")
