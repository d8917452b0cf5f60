"""The emulated aarch64 board: cross-compile, push through the tracker, run under qemu, check.

Slow (builds the board on first use; cached in $FARM_CACHE afterwards), but CI runs it.
"""

import json
import shutil
import time
from pathlib import Path

import pytest

from farm.devices.emulated import ensure_board
from farm.procs.supervise import free_port
from tests.conftest import TEST_POPULATION, env_in, run_farm, write_inventory
from tests.test_report import needs_chromium, open_in_chromium

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("qemu-aarch64") is None or shutil.which("aarch64-linux-gnu-g++") is None,
                       reason="needs qemu-user and g++-aarch64-linux-gnu: bash tools/setup.sh --emulation"),
]


def test_board_server_is_an_aarch64_executable():
    board = ensure_board()
    from farm.compile.artifacts import inspect_artifact

    member = inspect_artifact(board.server).members[0]
    assert (member.format, member.arch) == ("ELF", "aarch64")


@pytest.fixture(scope="module")
def board_lab(tmp_path_factory):
    """The board served through farm's own tracker, benched (mlp, convnet), tuned (one task), compiled with the
    record, reported: each command's --json output, and the report."""
    tmp_path = tmp_path_factory.mktemp("board-lab")
    inventory = write_inventory(tmp_path / "devices.toml", """
[devices.board]
kind = "qemu"
key = "test-arm64"
target = { kind = "llvm", mtriple = "aarch64-linux-gnu" }
search_population = %d
""" % TEST_POPULATION, free_port())
    env = {**env_in(tmp_path), "FARM_DEVICES": str(inventory)}
    lab = {"report": tmp_path / "report.html"}
    try:
        assert run_farm("tracker", "start", env=env).returncode == 0
        serve = run_farm("serve", "--json", env=env)
        assert serve.returncode == 0, serve.stderr
        for model in ("mlp", "convnet"):  # convnet with where its time goes, on the emulated board's native server
            bench = run_farm("bench", "--device", "board", "--model", model, "--repeat", "3", "--min-repeat-ms", "5",
                             *(["--profile"] if model == "convnet" else []), "--json", env=env)
            assert bench.returncode == 0, bench.stderr
            lab[model] = json.loads(bench.stdout)
        # the builder cross-compiles candidates; the board runs them (one task is enough)
        tune = run_farm("tune", "--device", "board", "--model", "mlp", "--tasks", "matmul1", "--trials", "4", "--json",
                        env=env)
        assert tune.returncode == 0, tune.stderr
        lab["tuned"] = json.loads(tune.stdout)
        lab["compiled"] = json.loads(run_farm("compile", "--device", "board", "--model", "mlp", "--json", env=env).stdout)
        assert run_farm("report", "--out", str(lab["report"]), env=env).returncode == 0
        lab["rows"] = json.loads(run_farm("results", "--json", env=env).stdout)
    finally:
        run_farm("down", env=env)
    return lab


def test_emulated_board_benchmarked_through_tracker_and_reported(board_lab):
    profile = board_lab["convnet"]["profile"]  # farm's native server profiles under qemu as on a board
    assert profile["status"] == "ok" and {"conv", "pool"} <= set(profile["by_class_s"]), profile
    assert board_lab["mlp"]["profile"] is None  # not asked for
    for model in ("mlp", "convnet"):
        data = board_lab[model]
        # the aarch64 result equals onnxruntime's x86 result within tolerance
        assert data["check"]["status"] == "passed" and data["check"]["max_abs_err"] < 1e-4
        assert data["emulated"] is True and data["steady_median_s"] > 0
    tuned, compiled, rows = board_lab["tuned"], board_lab["compiled"], board_lab["rows"]
    assert tuned["status"] == "done" and tuned["new_records"] == tuned["trials"] >= 1
    assert any(t["best_s"] for t in tuned["tasks"])
    # the task compiles tuned when a candidate beat its untuned code (each is a record; compile applies the best)
    beaten = sum(1 for t in tuned["tasks"] if t["best_s"] and t["untuned_s"] and t["best_s"] < t["untuned_s"])
    assert compiled[0]["arch"] == "aarch64" and compiled[0]["tuned_tasks"] == beaten, (compiled, tuned)
    assert {r["model"] for r in rows} == {"mlp", "convnet"} and all(r["emulated"] for r in rows)
    assert {r["model"] for r in rows if r["tuned"]} == set()  # the benches ran before tuning


@needs_chromium
def test_emulated_boards_report_in_chromium(board_lab):
    text, errors, _ = open_in_chromium(board_lab["report"])
    assert errors == []
    assert "board emulated" in text and "run under qemu" in text


@pytest.fixture(scope="module")
def mixed_sweep(farm_net, tmp_path_factory):
    """A sweep of the built-in models over cpu-a, cpu-b and the board: its --json output."""
    from farm.devices import bring_up
    from farm.inventory import parse_inventory
    from farm.procs.supervise import stop_process
    from farm.rpc.tracker import wait_for_servers

    tmp_path = tmp_path_factory.mktemp("mixed-sweep")
    farm_env = env_in(tmp_path)
    inventory = tmp_path / "devices.toml"
    inventory.write_text(farm_net.inventory_text(
        '\n[devices.board]\nkind = "qemu"\nkey = "sweep-arm64"\ntarget = { kind = "llvm", mtriple = "aarch64-linux-gnu" }\n'))
    board = parse_inventory(inventory.read_text()).devices["board"]
    started = bring_up(board, farm_net.tracker, tmp_path)
    try:
        wait_for_servers(farm_net.tracker, {"sweep-arm64": 1}, timeout_s=120)
        proc = run_farm("--devices", str(inventory), "sweep", "--device", "cpu-a", "--device", "cpu-b",
                        "--device", "board", "--repeat", "3", "--min-repeat-ms", "5",
                        "--report-dir", str(tmp_path / "reports"), "--json", env=farm_env)
    finally:
        for record in started:
            stop_process(record)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_sweep_three_models_on_local_and_emulated_devices(mixed_sweep):
    cells = {(c["device"], c["model"]): c["status"] for c in mixed_sweep["cells"]}
    assert cells == {(d, m): "ok" for d in ("cpu-a", "cpu-b", "board") for m in ("mlp", "convnet", "mobile-block")}


@needs_chromium
def test_the_mixed_sweeps_report_in_chromium(mixed_sweep):
    text, errors, images = open_in_chromium(Path(mixed_sweep["report"]))
    assert errors == [] and images
    assert "board emulated" in text and "mobile-block" in text


def needs_pocl_arm64():
    """The arm64 POCL sysroot (built once: Debian's packages), or a skip saying how to get it."""
    from farm.devices.pocl_arm64 import ensure_sysroot
    from farm.errors import DeviceError

    if not Path("/usr/include/CL/cl.h").exists():
        pytest.skip("needs opencl-headers: bash tools/setup.sh --opencl")
    try:
        return ensure_sysroot()
    except DeviceError as exc:
        pytest.skip(f"{exc.message}: {exc.hint}")


def test_board_runs_opencl_kernels_on_arm64_pocl_cold_warm_kernel_wall_copies_and_fp16_falls_back(tmp_path, farm_env):
    """TVM's OpenCL runtime cross-built with opencl_wrapper (as phones need: libOpenCL.so is opened at run time)
    ships in the aarch64 bundle; the board finds Debian's arm64 POCL through its sysroot and runs the kernels.
    A cold first run really builds them: the driver's cache is emptied first and filled again by it."""
    from farm.devices.opencl_runtime import LIBRARY, board_with_opencl, ensure_runtime
    from farm.compile.artifacts import inspect_artifact

    needs_pocl_arm64()
    assert inspect_artifact(ensure_runtime("aarch64")).members[0].arch == "aarch64"
    bundle = board_with_opencl(ensure_board().server.parent)
    assert (bundle / LIBRARY).exists() and (bundle / "farm-rpc-server").exists()
    inventory = write_inventory(tmp_path / "devices.toml", """
[devices.board-gpu]
kind = "qemu"
key = "test-arm64-gpu"
target = { kind = "opencl", device = "mali" }
host = { kind = "llvm", mtriple = "aarch64-linux-gnu", mattr = ["+neon"] }
fallback = "cpu"
""", free_port())
    env = {**farm_env, "FARM_DEVICES": str(inventory)}
    home = Path(farm_env["FARM_HOME"])
    cache = home / "kernel-cache-board-gpu"
    benches, built_after = [], []
    try:
        assert run_farm("tracker", "start", env=env).returncode == 0
        serve = run_farm("serve", "--json", env=env)
        assert serve.returncode == 0, serve.stderr
        for _ in range(2):
            before = time.time()
            bench = run_farm("bench", "--device", "board-gpu", "--model", "mlp", "--repeat", "3", "--min-repeat-ms",
                             "5", "--json", env=env)
            assert bench.returncode == 0, bench.stderr
            benches.append(json.loads(bench.stdout))
            built_after.append([p.stat().st_mtime >= before for p in cache.rglob("*") if p.is_file()])
        copies = run_farm("--json", "copies", "--device", "board-gpu", "--size", "4K", "--size", "64K", "--repeat", "3",
                          "--min-repeat-ms", "2", env=env)
        fp16 = run_farm("bench", "--device", "board-gpu", "--model", "mlp", "--variant", "fp16", "--repeat", "3",
                        "--min-repeat-ms", "5", "--json", env=env)
        log = (home / "server-board-gpu.log").read_text()
    finally:
        run_farm("down", env=env)
    assert f"loaded {bundle / LIBRARY}" in log and "Using CPU OpenCL device" in log  # POCL's pthread device
    for out in benches:
        assert out["status"] == "ok" and out["check"]["status"] == "passed" and out["emulated"] is True
        assert out["kernel_cache"] == f"cleared ({cache})"
        assert out["first_run_cold_s"] > 0 and out["first_run_warm_s"] > 0
        assert out["steady_clock"] == "kernel" and len(out["steady_kernel_samples_s"]) == 3
        assert len(out["steady_wall_samples_s"]) == 3 and out["copy_s"][0]["bytes"] == 40
        # memory through the native server's farm.MemoryStats: qemu's own process, so marked emulated
        memory = out["memory"]
        assert memory["measured"].startswith("RSS of qemu's process") and "(emulated)" in memory["text"]
        assert memory["params_bytes"] == 38440 and memory["planned_device_bytes"] > 0
        assert memory["rss_peak_bytes"] >= memory["rss_after_load_bytes"] > memory["rss_before_load_bytes"] > 0
        assert memory["total_bytes"] is None  # qemu's /proc/meminfo is this host's: not passed off as the board's
    # each cold run found the cache empty and POCL built every kernel binary in it anew
    assert all(built and all(built) for built in built_after), built_after
    assert copies.returncode == 0, copies.stderr
    curve = json.loads(copies.stdout)
    assert curve["status"] == "ok" and curve["device_type"] == "opencl"
    assert [(p["direction"], p["bytes"]) for p in curve["points"]] == [
        ("d2h", 4096), ("h2d", 4096), ("d2h", 65536), ("h2d", 65536)]
    # arm64 POCL has no cl_khr_fp16 either: the driver's words are stored and the board's CPU measures it instead
    assert fp16.returncode == 1
    data = json.loads(fp16.stdout)
    assert data["status"] == "failed" and data["failed_step"] == "first"
    assert "Half precision floating point not supported" in data["reason"]
    assert data["fallback"]["status"] == "ok" and data["fallback"]["device"] == "board-gpu@cpu"
    assert data["fallback"]["check"]["status"] == "passed"
