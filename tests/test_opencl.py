"""The OpenCL device end to end: TVM's own OpenCL runtime (built from TVM's sources against the wheel)
on Debian's POCL, served by farm's GPU server, through a real tracker; real kernels, real driver errors."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from farm.devices import bring_up, opencl_runtime
from farm.errors import DeviceError, InventoryError
from farm.inventory import parse_inventory
from farm.devices import kind_of, kinds
from farm.records import HostCPU, TrackerAddress
from farm.procs.supervise import free_port, stop_process
from farm.rpc.launch import start_tracker
from farm.rpc.tracker import wait_for_servers
from tests.conftest import TEST_POPULATION, run_farm, write_inventory

needs_runtime = pytest.mark.skipif(not opencl_runtime.runtime_available(), reason=(
    "needs an OpenCL implementation, its headers and TVM's OpenCL runtime sources: bash tools/setup.sh --opencl, "
    f"and TVM_SOURCE_DIR or ../shared/tvm-src ({opencl_runtime.SOURCES_HINT})"))

DEVICE = """
[devices.pocl]
kind = "opencl"
key = "{key}"
target = {{ kind = "opencl" }}
fallback = "cpu"
search_population = %d
""" % TEST_POPULATION


@pytest.fixture(scope="module")
def gpu_farm(tmp_path_factory):
    """A tracker and one OpenCL device (farm's GPU server with TVM's OpenCL runtime on POCL)."""
    state = tmp_path_factory.mktemp("opencl-farm")
    port = free_port()
    tracker = TrackerAddress("127.0.0.1", port)
    key = f"pocl-{port}"
    inventory = write_inventory(state / "devices.toml", DEVICE.format(key=key), port)
    device = parse_inventory(inventory.read_text()).devices["pocl"]
    started = []
    try:
        started.append(start_tracker("127.0.0.1", port, state))
        started.extend(bring_up(device, tracker, state))
        wait_for_servers(tracker, {key: 1}, timeout_s=90)
        yield inventory
    finally:
        for record in reversed(started):
            stop_process(record)


def bench(inventory: Path, env: dict, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = run_farm("--devices", str(inventory), "--json", "bench", "--device", "pocl", "--repeat", "5",
                    "--min-repeat-ms", "5", *args, env=env)
    return proc, json.loads(proc.stdout) if proc.stdout.strip() else {}


@needs_runtime
def test_runtime_is_built_once_and_cached():
    first = opencl_runtime.ensure_runtime()
    assert first.name == "libtvm_runtime_opencl.so" and first.stat().st_size > 100_000
    assert opencl_runtime.ensure_runtime() == first
    assert opencl_runtime.runtime_tag("x86_64") in str(first)  # keyed by versions + source digest


@needs_runtime
def test_missing_sources_say_which_tvm_commit_to_check_out(monkeypatch, tmp_path):
    monkeypatch.setenv("TVM_SOURCE_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(DeviceError) as caught:
        opencl_runtime.ensure_runtime()
    assert "nowhere" in caught.value.message and opencl_runtime.TVM_COMMIT[:12] in caught.value.hint


@needs_runtime
def test_builtin_convnet_on_opencl_cold_warm_kernel_wall_and_copies(gpu_farm, farm_env):
    proc, out = bench(gpu_farm, farm_env, "--model", "convnet", "--profile")
    assert proc.returncode == 0, proc.stderr
    assert out["status"] == "ok" and out["check"]["status"] == "passed" and out["check"]["reference"] == "onnxruntime"
    # where the time goes on the GPU, in farm's GPU server's own process: each kernel's own time on the OpenCL event
    # timer (not wall between syncs), every kernel timed; the kernels' time is under main's wall (outcomes, not a
    # ratio of two timings: this machine may be loaded)
    profile = out["profile"]
    assert profile["status"] == "ok" and profile["clock"].startswith("device: each kernel on the opencl event timer")
    assert all(k["time_s"] > 0 for k in profile["kernels"] if k["op_class"] != "vm"), profile["kernels"]
    assert 0 < profile["kernel_sum_s"] < profile["main_s"]
    assert {"conv", "pool"} <= set(profile["by_class_s"]), profile["by_class_s"]
    assert out["kernel_cache"].startswith("cleared (")
    # cold = kernels built by the driver after its cache was cleared; warm = a second load, kernels cached
    assert out["first_run_cold_s"] > out["first_run_warm_s"] > 0
    assert out["steady_clock"] == "kernel" and len(out["steady_kernel_samples_s"]) == 5
    assert len(out["steady_wall_samples_s"]) == 5 and out["steady_wall_number"] >= 1
    assert [(c["output"], c["bytes"]) for c in out["copy_s"]] == [(0, 40), (1, 32 * 16 * 16 * 4)]
    assert all(len(c["samples_s"]) == 10 and min(c["samples_s"]) > 0 for c in out["copy_s"])
    db = sqlite3.connect(farm_env["FARM_DB"])
    row = db.execute("SELECT steady_clock, first_run_s, first_run_warm_s FROM runs WHERE id=?", (out["run_id"],)).fetchone()
    assert row == ("kernel", out["first_run_cold_s"], out["first_run_warm_s"])
    metrics = dict(db.execute("SELECT metric, COUNT(*) FROM samples WHERE run_id=? GROUP BY metric", (out["run_id"],)))
    assert metrics == {"steady": 5, "steady_wall": 5, "copy": 20}


@needs_runtime
def test_onnx_package_model_on_opencl_passes_its_check(gpu_farm, farm_env):
    proc, out = bench(gpu_farm, farm_env, "--model", "onnx:squeezenet", "--repeat", "3")
    assert proc.returncode == 0, proc.stderr
    assert out["status"] == "ok" and out["check"]["status"] == "passed"
    assert out["steady_clock"] == "kernel" and len(out["steady_wall_samples_s"]) == 3


@needs_runtime
def test_fp16_fails_on_pocl_with_the_driver_reason_and_the_sweep_measures_the_cpu_instead(gpu_farm, farm_env, tmp_path):
    proc = run_farm("--devices", str(gpu_farm), "--json", "sweep", "--device", "pocl", "--model", "convnet",
                    "--variant", "fp16", "--repeat", "5", "--min-repeat-ms", "5", "--report-dir", str(tmp_path / "reports"),
                    env=farm_env, timeout=600)
    db = sqlite3.connect(farm_env["FARM_DB"])
    runs = db.execute("SELECT id, device, model, status, failed_step, reason, fallback_of, steady_clock FROM runs "
                      "WHERE runtime = 'tvm' ORDER BY id").fetchall()
    references = db.execute("SELECT device, model, runtime, status FROM runs WHERE runtime != 'tvm' ORDER BY id").fetchall()
    # onnxruntime on the OpenCL device's host CPU, beside each cell (the fallback's CPU cell has its own)
    assert ("pocl", "convnet@fp16", "onnxruntime", "ok") in references and ("pocl", "mlp", "onnxruntime", "ok") in references
    gpu_fp16 = [r for r in runs if r[1] == "pocl" and r[2] == "convnet@fp16"]
    assert gpu_fp16 and all(r[3] == "failed" and r[4] == "first" for r in gpu_fp16), runs
    # POCL has no cl_khr_fp16: the OpenCL compiler's own words are stored
    assert "Half precision floating point not supported" in gpu_fp16[-1][5]
    fallback = [r for r in runs if r[1] == "pocl@cpu"]
    assert [(r[2], r[3], r[6], r[7]) for r in fallback] == [("convnet@fp16", "ok", gpu_fp16[-1][0], "wall")], proc.stderr
    assert any(r[1] == "pocl" and r[2] == "mlp" and r[3] == "ok" for r in runs)  # the sweep's reference model
    curve = db.execute("SELECT status, device_type FROM copy_curves").fetchall()
    assert curve == [("ok", "opencl")]
    points = db.execute("SELECT direction, COUNT(DISTINCT nbytes) FROM copy_curve_samples GROUP BY direction").fetchall()
    assert points == [("d2h", 8), ("h2d", 8)]
    report = run_farm("report", "--out", str(tmp_path / "r.html"), env=farm_env)
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "r.html").read_text()
    assert f"CPU fallback for run {gpu_fp16[-1][0]}" in html and "Half precision" in html
    assert 'id="copy-curves"' in html and "64 MiB" in html


@needs_runtime
def test_copy_curve_by_size_is_stored_raw(gpu_farm, farm_env):
    proc = run_farm("--devices", str(gpu_farm), "--json", "copies", "--device", "pocl", "--size", "4K", "--size", "1M",
                    "--repeat", "3", "--min-repeat-ms", "2", env=farm_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "ok" and out["device_type"] == "opencl" and out["clock"].startswith("wall")
    assert [(p["direction"], p["bytes"]) for p in out["points"]] == [
        ("d2h", 4096), ("h2d", 4096), ("d2h", 1 << 20), ("h2d", 1 << 20)]
    db = sqlite3.connect(farm_env["FARM_DB"])
    assert db.execute("SELECT COUNT(*) FROM copy_curve_samples WHERE curve_id=?", (out["curve_id"],)).fetchone()[0] == 40


@needs_runtime
def test_bad_copy_size_is_a_usage_error(gpu_farm, farm_env):
    proc = run_farm("--devices", str(gpu_farm), "copies", "--device", "pocl", "--size", "lots", env=farm_env)
    assert proc.returncode == 2 and "'lots' is not a size in bytes" in proc.stderr


@needs_runtime
@pytest.mark.slow
def test_tune_on_opencl_stores_records_and_the_tuned_artifact_passes_its_check(gpu_farm, farm_env):
    tune = run_farm("--devices", str(gpu_farm), "--json", "tune", "--device", "pocl", "--model", "mlp",
                    "--tasks", "matmul1", "--trials", "4", env=farm_env, timeout=900)
    assert tune.returncode == 0, tune.stderr
    out = json.loads(tune.stdout)
    assert out["status"] == "done" and out["new_records"] == out["trials"] >= 1
    assert [t["name"] for t in out["tasks"]] == ["fused_matmul1_add1"] and out["tasks"][0]["best_s"] > 0
    proc, bench_out = bench(gpu_farm, farm_env, "--model", "mlp", "--profile")
    assert proc.returncode == 0, proc.stderr
    assert bench_out["tuned_tasks"] == 1 and bench_out["check"]["status"] == "passed"
    # its profile says which kernel the record scheduled; the others have TVM's default GPU schedules (DLight)
    schedules = {k["name"]: k["schedule"] for k in bench_out["profile"]["kernels"] if k["op_class"] != "vm"}
    assert schedules.pop("fused_matmul1_add1") == "tuned" and set(schedules.values()) == {"scheduled"}, schedules


@pytest.mark.parametrize("entry, problem", [
    ('kind = "opencl"\nkey = "g"\ntarget = { kind = "llvm" }', "is not OpenCL"),
    ('kind = "opencl"\nkey = "g"\ntarget = { kind = "opencl" }\nfallback = "gpu"', "'gpu' is unknown"),
    ('kind = "local"\nkey = "g"\ntarget = { kind = "llvm" }\nfallback = "cpu"', "needs a GPU target"),
    ('kind = "opencl"\nkey = "g"\ntarget = { kind = "opencl" }\nserver_port = "x"', "is not a port"),
])
def test_inventory_refuses_bad_opencl_entries(entry, problem):
    with pytest.raises(InventoryError) as caught:
        parse_inventory(f"[devices.g]\n{entry}\n")
    assert problem in caught.value.message and caught.value.hint


def test_the_opencl_kind_is_registered_and_targets_host_code_on_this_cpu():
    assert "opencl" in kinds()
    gpu = parse_inventory('[devices.g]\nkind = "opencl"\nkey = "g"\ntarget = { kind = "opencl" }\n').devices["g"]
    assert kind_of(gpu).effective_target(gpu, {"kind": "opencl"}, HostCPU("skylake", 8)) == {
        "kind": "opencl", "host": {"kind": "llvm", "mcpu": "skylake"}}
    assert "host" in kind_of(gpu).measurement_context(gpu)  # this host's CPU and load describe the device
