"""The emulated aarch64 board: cross-compile, push through the tracker, run under qemu, check.

Slow (builds the board on first use; cached in $FARM_CACHE afterwards), but CI runs it.
"""

import json
from pathlib import Path
import shutil

import pytest

from farm.devices.emulated import ensure_board
from farm.rpc.processes import free_port
from tests.conftest import env_in, run_farm, write_inventory
from tests.test_report import needs_chromium, open_in_chromium

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("qemu-aarch64") is None or shutil.which("aarch64-linux-gnu-g++") is None,
                       reason="needs qemu-user and g++-aarch64-linux-gnu: bash tools/setup.sh --emulation"),
]


def test_board_server_is_an_aarch64_executable():
    board = ensure_board()
    from farm.artifacts import inspect_artifact

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
""", free_port())
    env = {**env_in(tmp_path), "FARM_DEVICES": str(inventory)}
    lab = {"report": tmp_path / "report.html"}
    try:
        assert run_farm("tracker", "start", env=env).returncode == 0
        serve = run_farm("serve", "--json", env=env)
        assert serve.returncode == 0, serve.stderr
        for model in ("mlp", "convnet"):
            bench = run_farm("bench", "--device", "board", "--model", model, "--repeat", "3", "--min-repeat-ms", "5",
                             "--json", env=env)
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
    for model in ("mlp", "convnet"):
        data = board_lab[model]
        # the aarch64 result equals onnxruntime's x86 result within tolerance
        assert data["check"]["status"] == "passed" and data["check"]["max_abs_err"] < 1e-4
        assert data["emulated"] is True and data["steady_median_s"] > 0
    tuned, compiled, rows = board_lab["tuned"], board_lab["compiled"], board_lab["rows"]
    assert tuned["status"] == "done" and tuned["new_records"] == tuned["trials"] >= 1
    assert any(t["best_s"] for t in tuned["tasks"])
    assert compiled[0]["arch"] == "aarch64" and compiled[0]["tuned_tasks"] == 1, (compiled, tuned)
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
    from farm.rpc.processes import stop_process
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


@pytest.mark.skipif(not Path("/usr/include/CL/cl.h").exists(), reason="needs opencl-headers: bash tools/setup.sh --opencl")
def test_board_loads_the_aarch64_opencl_runtime_and_a_missing_platform_is_a_stored_failure(tmp_path, farm_env):
    """TVM's OpenCL runtime cross-built with opencl_wrapper (as phones need: libOpenCL.so is opened at run time)
    ships in the aarch64 bundle and loads in the board; with no OpenCL there, the GPU cell fails with the reason
    stored and its fallback measures the board's CPU."""
    from farm.devices.opencl_runtime import LIBRARY, board_with_opencl, ensure_runtime
    from farm.artifacts import inspect_artifact

    library = ensure_runtime("aarch64")
    assert inspect_artifact(library).members[0].arch == "aarch64"
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
    try:
        assert run_farm("tracker", "start", env=env).returncode == 0
        serve = run_farm("serve", "--json", env=env)
        assert serve.returncode == 0, serve.stderr
        bench = run_farm("bench", "--device", "board-gpu", "--model", "mlp", "--repeat", "3", "--min-repeat-ms", "5",
                         "--json", env=env)
        log = (Path(farm_env["FARM_HOME"]) / "server-board-gpu.log").read_text()
    finally:
        run_farm("down", env=env)
    assert f"loaded {bundle / LIBRARY}" in log
    assert bench.returncode == 1
    data = json.loads(bench.stdout)
    assert data["status"] == "failed" and data["failed_step"] == "load" and "Cannot open libOpenCL" in data["reason"]
    assert bench.stderr.splitlines()[0].startswith("error: ") and "no usable OpenCL" in bench.stderr
    assert data["fallback"]["status"] == "ok" and data["fallback"]["device"] == "board-gpu@cpu"
    assert data["fallback"]["fallback_of"] == data["run_id"] and data["fallback"]["check"]["status"] == "passed"
