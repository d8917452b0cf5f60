"""The tracker's view of a key, as `farm devices` and the dashboard state it."""

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from farm.records import TrackerAddress
from farm.procs.supervise import free_port, stop_process
from farm.rpc.launch import start_tracker
from farm.rpc.tracker import KeyStatus, key_state, query_summary


def test_key_state_online_busy_missing():
    assert key_state(KeyStatus("phone", servers=2, free=1, pending=0)) == "online"
    assert key_state(KeyStatus("phone", servers=2, free=0, pending=3)) == "busy"
    assert key_state(KeyStatus("phone", servers=0, free=0, pending=1)) == "missing"  # requests wait, nobody serves
    assert key_state(None) == "missing"  # the summary does not list the key


def test_the_tracker_queues_a_fleets_burst_of_requests(tmp_path):
    """TVM's tracker listens with a backlog of 1: beyond two connections not yet accepted, the kernel drops the SYNs
    of a probe's or a sweep's concurrent requests, and each waits 1, 3, 7… s for a resend (test_fleet's probe saw
    free devices as busy or unreachable). farm's tracker listens with the system's largest backlog."""
    if shutil.which("ss") is None:
        pytest.skip("`ss` (iproute2) is not installed: it is how this test reads a listening socket's backlog")
    port = free_port()
    tracker = start_tracker("127.0.0.1", port, tmp_path)
    try:
        listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True)
        backlog = [int(line.split()[2]) for line in listening.stdout.splitlines() if line.startswith("LISTEN")]
        assert backlog and backlog[0] >= min(socket.SOMAXCONN, 128), listening.stdout
        # 40 connections at once, none accepted yet by the time the last is made, then the tracker answers each
        burst = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(40)]
        for sock in burst:
            sock.close()
        assert query_summary(TrackerAddress("127.0.0.1", port)).keys == {}
    finally:
        stop_process(tracker)


def test_the_tracker_loads_tvm_s_runtime_alone_never_its_compiler(tmp_path):
    """The tracker is Python over sockets: it imports TVM with its runtime library alone (tvm_private's
    runtime_only_env), half the import's time, and libtvm_compiler.so is never mapped into it."""
    tracker = start_tracker("127.0.0.1", free_port(), tmp_path)
    try:
        libraries = {Path(line.split()[-1]).name for line in Path(f"/proc/{tracker.pid}/maps").read_text().splitlines()
                     if line.rstrip().endswith(".so") or ".so." in line}
    finally:
        stop_process(tracker)
    assert "libtvm_runtime.so" in libraries, sorted(libraries)
    assert "libtvm_compiler.so" not in libraries and "libtvm.so" not in libraries, sorted(libraries)


def test_a_tracker_with_lab_hosts_takes_each_key_s_registration_only_from_its_sources(tmp_path):
    """#62: anyone on the lab's network could register a server under a device's key, and its timings would be
    stored. With [tracker] lab_hosts, farm's tracker takes a key only from where its servers run: here key
    'here-cpu' (a device of the tracker's own host) from loopback; 'lab2-phone' only from lab2's address, so a
    server on this host registering it is refused, as is one under a key no device has."""
    import json as json_module
    import time

    from farm.procs.supervise import free_port, stop_process
    from farm.rpc.launch import start_server
    from farm.devices.registrations import allowed_sources
    from farm.rpc.tracker import query_summary, wait_for_servers
    from farm.inventory import load_inventory
    from farm.records import TrackerAddress
    from tests.conftest import run_farm

    port = free_port()
    inventory = tmp_path / "devices.toml"
    inventory.write_text(f'[tracker]\nhost = "127.0.0.1"\nport = {port}\nlab_hosts = {{ lab2 = "10.77.0.2" }}\n\n'
                         '[devices.here-cpu]\nkind = "local"\nkey = "here-cpu"\ntarget = { kind = "llvm" }\n\n'
                         '[devices.lab2-phone]\nkind = "remote"\nkey = "lab2-phone"\ntarget = { kind = "llvm" }\n'
                         'lab_host = "lab2"\n\n[devices.board]\nkind = "linux"\nkey = "board"\n'
                         'target = { kind = "llvm" }\nssh = "me@10.77.0.9:2222"\n')
    assert allowed_sources(load_inventory(inventory)) == {
        "board": ["10.77.0.9"], "here-cpu": ["127.0.0.1"], "lab2-phone": ["10.77.0.2"]}
    env = {"FARM_HOME": str(tmp_path / "home")}
    started = run_farm("--devices", str(inventory), "tracker", "start", env=env)
    assert started.returncode == 0, started.stderr
    tracker, servers = TrackerAddress("127.0.0.1", port), []
    try:
        for key in ("here-cpu", "lab2-phone", "nobody-s-key"):
            servers.append(start_server(tracker, key, key, tmp_path, options=("--threads", "1")))
        wait_for_servers(tracker, {"here-cpu": 1}, timeout_s=120)
        log = tmp_path / "home" / "tracker.log"
        deadline = time.monotonic() + 60  # the bound only ends a failing test: refused servers register again
        while "key 'nobody-s-key'" not in log.read_text() or "key 'lab2-phone'" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        keys = query_summary(tracker).keys
        assert keys["here-cpu"].servers == 1 and "lab2-phone" not in keys and "nobody-s-key" not in keys
        said = log.read_text()
        assert "refused a server registering from 127.0.0.1: key 'lab2-phone' registers only from 10.77.0.2" in said
        assert "refused a server registering from 127.0.0.1: key 'nobody-s-key' is no device's in the inventory" in said
        assert json_module.loads((tmp_path / "home" / "tracker-allow.json").read_text())["lab2-phone"] == ["10.77.0.2"]
    finally:
        for server in servers:
            stop_process(server)
        run_farm("--devices", str(inventory), "tracker", "stop", env=env)
