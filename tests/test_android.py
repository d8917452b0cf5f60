"""Android bring-up through the real adb server, against the stand-in phone (tests/standin_phone.py).

The phone runs in its own network namespace, so its 127.0.0.1 is not ours: the tracker is
reached only through `adb reverse` and the server only through `adb forward`. farm pushes its
aarch64 RPC server over adb sync; on the phone it runs under qemu (the device's launcher).
Needs root + iproute2 (namespace), Debian's `adb`, qemu-user and the aarch64 g++.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import psutil
import pytest

from farm.procs.supervise import free_port
from tests.conftest import REPO, run_farm, write_inventory
from tests.phone_lab import CPU_TARGET, phone_lab, standin_phone, standin_phone_table, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2 (network namespace)"),
    pytest.mark.skipif(shutil.which("adb") is None, reason="needs Debian's adb: bash tools/setup.sh --test"),
    pytest.mark.skipif(shutil.which("qemu-aarch64") is None or shutil.which("aarch64-linux-gnu-g++") is None,
                       reason="needs qemu-user and g++-aarch64-linux-gnu: bash tools/setup.sh --emulation"),
]


@pytest.fixture
def phone(tmp_path):
    """(serial, adb "HOST:PORT"): a stand-in phone in its own namespace, and our own adb server."""
    with standin_phone(tmp_path) as serial_and_adb:
        yield serial_and_adb


def standin_inventory(tmp_path, key: str, phone: tuple[str, str], tracker_port: int, tracker_host: str = "127.0.0.1",
                      extra: str = ""):
    """devices.toml with the stand-in phone as device "phone" (CPU), tracked at tracker_host:tracker_port."""
    table = standin_phone_table("phone", key, phone, tmp_path / "phone-data" / "farm",
                                rest=CPU_TARGET + "max_cooldown_s = 5\n" + extra)
    return write_inventory(tmp_path / "devices.toml", table, tracker_port, tracker_host)


def server_record(home) -> dict | None:
    path = home / "processes.json"
    records = json.loads(path.read_text()) if path.exists() else []
    return next((r for r in records if r["role"] == "server" and r["name"] == "phone"), None)


def probe_state(env) -> str:
    data = json.loads(run_farm("devices", "--probe", "--timeout", "3", "--json", env=env).stdout)
    return data["devices"][0]["state"]


def ota(tmp_path, build: str) -> None:
    """The stand-in phone's build fingerprint (its getprop reads the props file each time)."""
    props = tmp_path / "phone-system" / "bin" / "props.json"
    data = json.loads(props.read_text())
    data["props"]["ro.build.fingerprint"] = f"farm/standin/standin:14/{build}/1:user/release-keys"
    props.write_text(json.dumps(data))


def test_standin_phone_brought_up_over_adb_benchmarked_and_restarted(phone, tmp_path, farm_env):
    serial, adb = phone
    inventory = standin_inventory(tmp_path, "test-phone", phone, free_port(), extra="min_battery_pct = 20\n")
    env = {**farm_env, "FARM_DEVICES": str(inventory)}
    home = tmp_path / "home"
    watchdog = None
    try:
        assert run_farm("tracker", "start", env=env).returncode == 0
        phones = run_farm("phones", "--adb", adb, "--json", env=env)
        assert phones.returncode == 0, phones.stderr
        serve = run_farm("serve", "--json", env=env)  # pushes the server, reverse + forward, starts it
        assert serve.returncode == 0, serve.stderr
        first = server_record(home)
        assert probe_state(env) == "online"

        listed = json.loads(run_farm("phones", "--adb", adb, "--json", env=env).stdout)["phones"]
        assert [(p["serial"], p["state"], p["model"], p["abi"], p["android"], p["battery_pct"]) for p in listed] == [
            (serial, "device", "Stand-in Phone", "arm64-v8a", "14", 87)]
        assert listed[0]["opencl"] is False  # the stand-in has no libOpenCL.so

        ota(tmp_path, "QP1A.190711.020")
        bench = run_farm("bench", "--device", "phone", "--model", "mlp", "--repeat", "3", "--min-repeat-ms", "5",
                         "--profile", "--json", env=env)
        assert bench.returncode == 0, bench.stderr
        data = json.loads(bench.stdout)
        assert data["status"] == "ok" and data["check"]["status"] == "passed" and data["emulated"] is True
        # where the time goes, on the phone: farm's native server pushed over adb profiles in its own process
        assert data["profile"]["status"] == "ok" and "matmul/dense" in data["profile"]["by_class_s"], data["profile"]
        context = json.loads(run_farm("results", "--json", env=env).stdout)[0]["context"]
        assert context["device_health"]["battery_pct"] == 87 and context["device_health"]["battery_temp_c"] == 31.2
        assert context["cooldown"]["gate"] == "passed" and context["device_health_after"]["battery_pct"] == 87
        assert (tmp_path / "phone-data" / "farm" / "farm-rpc-server").exists()  # pushed over adb sync

        os.killpg(first["pid"], signal.SIGKILL)  # the server dies on the phone
        # each probe is a fresh `farm` process (TVM import); a probe that waited on the dead server would hang
        # for good, so the deadline is only there to end the test: generous for a loaded machine
        wait_until(lambda: probe_state(env) != "online", 180, "farm devices --probe to notice the dead server")

        # the watchdog: `farm serve --watch` brings the phone back, then restarts its server when it dies
        with open(tmp_path / "watch.log", "wb") as log:
            watchdog = subprocess.Popen([sys.executable, "-m", "farm.cli", "serve", "--watch", "--interval", "1"],
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
                                        env={**os.environ, **env}, start_new_session=True)
        second = wait_until(lambda: (r := server_record(home)) and r["pid"] != first["pid"] and r, 120,
                            "farm serve --watch to bring the server back")
        wait_until(lambda: "watching 1 device(s)" in (tmp_path / "watch.log").read_text(), 120, "the watch to begin")
        os.killpg(second["pid"], signal.SIGKILL)
        third = wait_until(lambda: (r := server_record(home)) and r["pid"] not in (first["pid"], second["pid"]) and r,
                           120, "the watchdog to restart the server")
        wait_until(lambda: probe_state(env) == "online", 120, "the restarted server to register")
        ota(tmp_path, "RQ3A.211001.001")  # an OTA update: the phone's build fingerprint changes
        again = run_farm("bench", "--device", "phone", "--model", "mlp", "--repeat", "3", "--min-repeat-ms", "5",
                         "--json", env=env)
        assert again.returncode == 0 and json.loads(again.stdout)["status"] == "ok", again.stderr
        # each run's manifest: the phone's software read over adb at session time, the server farm pushed
        after, before = [r["manifest"] for r in json.loads(run_farm("results", "--json", env=env).stdout)
                         if r["runtime"] == "tvm"]
        assert before["device.os_build"] == "farm/standin/standin:14/QP1A.190711.020/1:user/release-keys"
        assert after["device.os_build"] == "farm/standin/standin:14/RQ3A.211001.001/1:user/release-keys"
        assert before["device.kernel"] and before["device.server"].startswith("board-aarch64-")
        assert {k for k in before if before[k] != after.get(k)} == {"device.os_build"}, (before, after)
        assert f"server pid {second['pid']} was gone; restarted as pid {third['pid']}" in (tmp_path / "watch.log").read_text()
    finally:
        down = run_farm("down", "--json", env=env)
        if watchdog is not None:
            watchdog.wait(timeout=20)
    stopped = {r["role"] for r in json.loads(down.stdout)["stopped"]}
    assert down.returncode == 0 and stopped == {"watchdog", "server", "tracker"}, (down.stdout, down.stderr)
    assert watchdog.returncode == 0
    # the phone's server is gone: `farm down` killed it through adb (the phone's sh is dash here, mksh on Android)
    # before it stopped the tracker. A server that survived its kill would have lost the tracker, and says so
    server_log = (tmp_path / "phone-data" / "farm" / "server-test-phone.log").read_text()
    assert "lost the tracker" not in server_log, server_log
    for pid in (first["pid"], second["pid"], third["pid"]):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE \
            or "farm-rpc-server" not in " ".join(psutil.Process(pid).cmdline()), pid


def test_standin_phone_gpu_runs_opencl_on_arm64_pocl_and_a_phone_without_libopencl_falls_back(phone, tmp_path,
                                                                                                farm_env):
    """The phone's GPU path end to end over adb: farm's bundle with TVM's OpenCL runtime, pushed, run under qemu on
    a sysroot with Debian's arm64 POCL (the stand-in's vendor driver). The same phone without a driver (the plain
    cross sysroot: no libOpenCL.so) is a stored failure, measured on its CPU instead."""
    from tests.test_emulated import needs_pocl_arm64

    sysroot = needs_pocl_arm64()
    serial, adb = phone
    device_dir = tmp_path / "phone-data" / "farm"
    devices = ""
    for name, root in (("phone-gpu", sysroot), ("phone-nogpu", "/usr/aarch64-linux-gnu")):
        devices += standin_phone_table(name, f"test-{name}", phone, device_dir, root,
                                       'target = { kind = "opencl", device = "mali" }\n'
                                       'host = { kind = "llvm", mtriple = "aarch64-linux-gnu", mattr = ["+neon"] }\n'
                                       'fallback = "cpu"\n')
    env = {**farm_env, "FARM_DEVICES": str(write_inventory(tmp_path / "devices.toml", devices, free_port()))}
    try:
        assert run_farm("tracker", "start", env=env).returncode == 0
        serve = run_farm("serve", "--json", env=env)
        assert serve.returncode == 0, serve.stderr
        runs = {}
        for name in ("phone-gpu", "phone-nogpu"):
            bench = run_farm("bench", "--device", name, "--model", "mlp", "--repeat", "3", "--min-repeat-ms", "5",
                             "--profile", "--json", env=env)
            runs[name] = (bench.returncode, json.loads(bench.stdout))
    finally:
        run_farm("down", env=env)
    code, gpu = runs["phone-gpu"]
    assert code == 0 and gpu["status"] == "ok" and gpu["check"]["status"] == "passed" and gpu["emulated"] is True
    assert gpu["kernel_cache"] == f"cleared ({device_dir}/kernel-cache-test-phone-gpu)"
    assert gpu["steady_clock"] == "kernel" and len(gpu["steady_wall_samples_s"]) == 3 and gpu["first_run_warm_s"] > 0
    assert any((device_dir / "kernel-cache-test-phone-gpu").rglob("*.so"))  # POCL's built kernels, on the phone
    assert gpu["profile"]["status"] == "ok" and "opencl event timer" in gpu["profile"]["clock"], gpu["profile"]  # arm64 OpenCL
    code, nogpu = runs["phone-nogpu"]
    assert code == 1 and nogpu["status"] == "failed" and nogpu["failed_step"] == "load"
    assert "Cannot open libOpenCL" in nogpu["reason"]
    assert nogpu["fallback"]["status"] == "ok" and nogpu["fallback"]["device"] == "phone-nogpu@cpu"


def test_a_phone_on_a_lab_host_without_the_tracker_is_measured_there_in_a_sweep_queued_and_built_elsewhere(
        phone, tmp_path, farm_env):
    """The whole lab path of a phone (#30; ``phone_lab``): host A (a namespace) runs the tracker, queues the sweep
    and builds its artifacts; host B (this one) has the phone on its own adb and a local CPU device. `farm serve`
    on B relays the phone to A's tracker; B's worker measures both cells with A's artifacts from the database (it
    compiles nothing), outputs checked; `farm down` stops the phone's server, then its relay."""
    lab = phone_lab(tmp_path, phone, farm_env)
    assert not lab.failed(), lab.failed()
    assert lab.relay["name"] == "phone" and lab.relay["port"] != lab.tracker_port
    assert lab.sweep["status"] == "done", lab.sweep
    assert sorted((c["device"], c["status"]) for c in lab.sweep["cells"]) == [("b-cpu", "ok"), ("phone", "ok")]
    for device in ("phone", "b-cpu"):  # measured on B, outputs checked, with the artifact A built
        assert f"{device} · mlp · check: passed" in lab.measured, lab.measured[-3000:]
        assert f"{device} · mlp · artifact: built by builds:" in lab.measured, lab.measured[-3000:]
    assert "· compile:" not in lab.measured, lab.measured[-3000:]
    stopped = json.loads(lab.steps["down on B"].stdout)["stopped"]
    assert [r["role"] for r in stopped if r["name"] == "phone"] == ["server", "relay"]
    pid = lab.relay["pid"]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
