"""fp16 and int8 variants: converted/calibrated, compiled, benchmarked, drift against fp32 stored and shown."""

import json
from pathlib import Path

import pytest

from farm.models import load_model, make_variant
from tests.conftest import farm_workspace, run_farm
from tests.test_report import needs_chromium, open_in_chromium


def test_variants_are_distinct_models_with_their_own_digest():
    base = load_model("convnet")
    fp16, int8 = make_variant(base, "fp16"), make_variant(base, "int8", "entropy")
    assert len({base.digest, fp16.digest, int8.digest}) == 3
    assert fp16.inputs[0].dtype == "float16" and int8.inputs[0].dtype == "float32"
    assert int8.name == "convnet@int8" and "int8:entropy:generated (16 samples" in int8.origin


@pytest.fixture(scope="module", params=["fp16", "int8"])
def variant_bench(request, farm_net, tmp_path_factory):
    """`farm bench --variant` of convnet and the report after it: (variant, bench output, report)."""
    variant = request.param
    tmp_path = tmp_path_factory.mktemp(f"bench-{variant}")
    inventory_file, farm_env = farm_workspace(farm_net, tmp_path)
    proc = run_farm("--devices", str(inventory_file), "bench", "--device", "cpu-a", "--model", "convnet",
                    "--variant", variant, "--repeat", "3", "--min-repeat-ms", "5", "--json", env=farm_env)
    assert proc.returncode == 0, proc.stderr
    report = tmp_path / "report.html"
    assert run_farm("report", "--out", str(report), env=farm_env).returncode == 0
    return variant, json.loads(proc.stdout), report


def test_variant_benchmarked_with_drift_against_fp32(variant_bench):
    variant, data, _ = variant_bench
    assert data["model"] == f"convnet@{variant}"
    check = data["check"]
    assert check["status"] == "passed" and check["reference"].startswith("onnxruntime fp32 (drift tolerance")
    assert 0 < check["max_abs_err"] <= check["atol"]  # a real, bounded drift


@needs_chromium
def test_variant_report_shows_its_drift_in_chromium(variant_bench):
    variant, _, report = variant_bench
    text, errors, _ = open_in_chromium(report)
    assert errors == [] and f"convnet@{variant}" in text and "max err" in text


@pytest.fixture(scope="module")
def variant_sweep(farm_net, tmp_path_factory):
    """A sweep of convnet in fp32, fp16 and int8: its --json output."""
    tmp_path = tmp_path_factory.mktemp("variant-sweep")
    inventory_file, farm_env = farm_workspace(farm_net, tmp_path)
    proc = run_farm("--devices", str(inventory_file), "sweep", "--device", "cpu-a", "--model", "convnet",
                    "--variant", "fp32", "--variant", "fp16", "--variant", "int8", "--reference", "none",
                    "--repeat", "3", "--min-repeat-ms", "5", "--report-dir", str(tmp_path / "reports"), "--json",
                    env=farm_env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_sweep_with_variant_axis_measures_each_variant(variant_sweep):
    assert {c["model"]: c["status"] for c in variant_sweep["cells"]} == {"convnet": "ok", "convnet@fp16": "ok",
                                                                         "convnet@int8": "ok"}


@needs_chromium
def test_sweep_with_variant_axis_shows_drift_side_by_side(variant_sweep):
    text, errors, _ = open_in_chromium(Path(variant_sweep["report"]))
    assert errors == [] and "Variants: latency and accuracy drift" in text
