"""The tracker's view of a key, as `farm devices` and the dashboard state it."""

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from farm.records import TrackerAddress
from farm.rpc.processes import free_port, start_tracker, stop_process
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
