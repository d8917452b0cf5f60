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
import time

import psutil
import pytest

from farm.rpc.processes import free_port
from tests.conftest import REPO, network_namespace, run_farm, write_inventory

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2 (network namespace)"),
    pytest.mark.skipif(shutil.which("adb") is None, reason="needs Debian's adb: bash tools/setup.sh --test"),
    pytest.mark.skipif(shutil.which("qemu-aarch64") is None or shutil.which("aarch64-linux-gnu-g++") is None,
                       reason="needs qemu-user and g++-aarch64-linux-gnu: bash tools/setup.sh --emulation"),
]


def wait_until(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def port_open(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


@pytest.fixture
def phone(tmp_path):
    """(serial, adb "HOST:PORT"): a stand-in phone in its own namespace, and our own adb server."""
    adb_port = free_port()
    env = {**os.environ, "ADB_MDNS": "0", "ANDROID_SDK_HOME": str(tmp_path / "adb-home")}
    started: list[subprocess.Popen] = []
    with network_namespace("farmph", 214) as (ns, _, phone_addr):
        try:
            with open(tmp_path / "phone.log", "wb") as log:
                started.append(subprocess.Popen(
                    ["ip", "netns", "exec", ns, sys.executable, str(REPO / "tests" / "standin_phone.py"),
                     "--listen", f"{phone_addr}:5555", "--system", str(tmp_path / "phone-system")],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
            with open(tmp_path / "adb.log", "wb") as log:
                started.append(subprocess.Popen(["adb", "-P", str(adb_port), "nodaemon", "server"], stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                                start_new_session=True))
            wait_until(lambda: "listening" in (tmp_path / "phone.log").read_text(), 60, "the stand-in phone")
            # a socket, not `adb devices`: the adb client would start a daemon of its own if it came first
            wait_until(lambda: port_open(adb_port), 60, "the adb server")
            yield f"{phone_addr}:5555", f"127.0.0.1:{adb_port}"
        finally:
            for proc in reversed(started):
                stop_group(proc)


CPU_TARGET = 'target = { kind = "llvm", mtriple = "aarch64-linux-gnu" }\n'


def standin_phone_table(name: str, key: str, phone: tuple[str, str], device_dir, root: str = "/usr/aarch64-linux-gnu",
                        rest: str = CPU_TARGET) -> str:
    """devices.toml's [devices.NAME] for the stand-in phone: its server under qemu with ``root``'s libraries, its
    data in ``device_dir``; ``rest``: the target and any other fields."""
    serial, adb = phone
    return (f'\n[devices.{name}]\nkind = "android"\nkey = "{key}"\nserial = "{serial}"\nadb = "{adb}"\n'
            f'server_port = {free_port()}\ndevice_dir = "{device_dir}"\nlauncher = ["qemu-aarch64", "-L", "{root}"]\n'
            f"emulated = true\n{rest}")


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

        bench = run_farm("bench", "--device", "phone", "--model", "mlp", "--repeat", "3", "--min-repeat-ms", "5",
                         "--json", env=env)
        assert bench.returncode == 0, bench.stderr
        data = json.loads(bench.stdout)
        assert data["status"] == "ok" and data["check"]["status"] == "passed" and data["emulated"] is True
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
        again = run_farm("bench", "--device", "phone", "--model", "mlp", "--repeat", "3", "--min-repeat-ms", "5",
                         "--json", env=env)
        assert again.returncode == 0 and json.loads(again.stdout)["status"] == "ok", again.stderr
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
                             "--json", env=env)
            runs[name] = (bench.returncode, json.loads(bench.stdout))
    finally:
        run_farm("down", env=env)
    code, gpu = runs["phone-gpu"]
    assert code == 0 and gpu["status"] == "ok" and gpu["check"]["status"] == "passed" and gpu["emulated"] is True
    assert gpu["kernel_cache"] == f"cleared ({device_dir}/kernel-cache-test-phone-gpu)"
    assert gpu["steady_clock"] == "kernel" and len(gpu["steady_wall_samples_s"]) == 3 and gpu["first_run_warm_s"] > 0
    assert any((device_dir / "kernel-cache-test-phone-gpu").rglob("*.so"))  # POCL's built kernels, on the phone
    code, nogpu = runs["phone-nogpu"]
    assert code == 1 and nogpu["status"] == "failed" and nogpu["failed_step"] == "load"
    assert "Cannot open libOpenCL" in nogpu["reason"]
    assert nogpu["fallback"]["status"] == "ok" and nogpu["fallback"]["device"] == "phone-nogpu@cpu"


def test_a_phone_on_a_lab_host_without_the_tracker_is_measured_there_in_a_sweep_queued_and_built_elsewhere(
        phone, tmp_path, farm_env):
    """The whole lab path of a phone (#30). Host A (a network namespace) runs the lab's tracker, queues the sweep
    and builds its artifacts (`farm worker --builds`); host B (this one) has the phone on its own adb, a local CPU
    device and the PostgreSQL, and no tracker. `farm serve` on B starts a relay on its loopback to A's tracker and
    reverses it to the phone, whose server registers through it; B's `farm worker` measures both cells of A's
    sweep with the artifacts A built, read from the database (it compiles nothing), outputs checked. `farm down`
    stops the phone's server, then its relay."""
    import psycopg

    from tests.conftest import running_postgres

    with network_namespace("farmtr", 215) as (ns, host_addr, tracker_addr):
        tracker_port = free_port()
        devices = standin_phone_table("phone", "far-phone", phone, tmp_path / "phone-data" / "farm",
                                      rest=CPU_TARGET + 'max_cooldown_s = 5\nlab_host = "labB"\n')
        devices += '\n[devices.b-cpu]\nkind = "local"\nkey = "b-cpu"\nlab_host = "labB"\n' \
                   'target = { kind = "llvm", num-cores = 1 }\n'
        inventory = write_inventory(tmp_path / "devices.toml", devices, tracker_port, tracker_addr)
        with running_postgres(f"127.0.0.1,{host_addr}", f"{tracker_addr}/32") as server:
            with psycopg.connect(f"{server}/postgres", autocommit=True) as db:
                db.execute("CREATE DATABASE lab")
            here = {**farm_env, "FARM_DEVICES": str(inventory), "FARM_DB": f"{server}/lab"}
            there = {**here, "FARM_HOME": str(tmp_path / "home-a"),
                     "FARM_DB": f"postgresql://farm@{host_addr}:{server.rsplit(':', 1)[1]}/lab"}

            def on_a(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
                return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "farm.cli", *args],
                                      env={**os.environ, **there}, cwd=REPO, capture_output=True, text=True,
                                      timeout=timeout)

            started = on_a("tracker", "start", "--host", tracker_addr)
            assert started.returncode == 0, started.stderr
            worker = None
            try:
                serve = run_farm("serve", "--json", env=here)
                assert serve.returncode == 0, serve.stderr
                records = json.loads((tmp_path / "home" / "processes.json").read_text())
                relay = next(r for r in records if r["role"] == "relay")
                assert relay["name"] == "phone" and relay["port"] != tracker_port
                queued = on_a("sweep", "--model", "mlp", "--reference", "none", "--repeat", "3", "--min-repeat-ms",
                              "5", "--no-report", "--detach", "--json")
                assert queued.returncode == 0, queued.stderr
                sweep_id = json.loads(queued.stdout)["sweep_id"]
                built = on_a("worker", "--builds", "--until-empty", "--progress", timeout=600)
                assert built.returncode == 0, built.stderr[-3000:]
                with open(tmp_path / "worker-b.log", "wb") as log:
                    worker = subprocess.Popen([sys.executable, "-m", "farm.cli", "worker", "--lab-host", "labB",
                                               "--progress"], env={**os.environ, **here}, cwd=REPO, stdout=log,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
                followed = on_a("sweep", "--resume", str(sweep_id), "--no-report", "--json", timeout=900)
                assert followed.returncode == 0, followed.stderr[-3000:]
                out = json.loads(followed.stdout)
            finally:
                if worker is not None:
                    stop_group(worker)
                down = run_farm("down", "--json", env=here)
                on_a("down")
        measured = (tmp_path / "worker-b.log").read_text()
        assert out["status"] == "done", out
        assert sorted((c["device"], c["status"]) for c in out["cells"]) == [("b-cpu", "ok"), ("phone", "ok")], out
        for device in ("phone", "b-cpu"):  # measured on B, outputs checked, with the artifact A built
            assert f"{device} · mlp · check: passed" in measured, measured[-3000:]
            assert f"{device} · mlp · artifact: built by builds:" in measured, measured[-3000:]
        assert "· compile:" not in measured, measured[-3000:]
        assert down.returncode == 0, down.stderr
        assert [r["role"] for r in json.loads(down.stdout)["stopped"] if r["name"] == "phone"] == ["server", "relay"]
        assert not psutil.pid_exists(relay["pid"]) or psutil.Process(relay["pid"]).status() == psutil.STATUS_ZOMBIE
