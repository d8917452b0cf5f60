import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from farm.errors import DeviceUnavailable, TrackerError
from farm.records import TrackerAddress
from farm.procs.supervise import free_port, stop_process
from farm.rpc.launch import start_server, start_tracker
from farm.rpc.session import request_session
from farm.rpc.tracker import query_summary, wait_for_servers


def test_summary_lists_registered_servers(farm_net):
    summary = query_summary(farm_net.tracker)
    assert summary.keys["test-a"].servers >= 1 and summary.keys["test-b"].servers >= 1
    assert any(key == "test-a" for key, _, _ in summary.servers)


def test_request_session_runs_remote_code(farm_net):
    session = request_session(farm_net.tracker, "test-a", timeout_s=10, session_timeout_s=60)
    assert session.get_function("ffi.ArraySize") is not None
    assert session.cpu(0).exist


def test_request_for_absent_key_is_bounded(farm_net):
    start = time.monotonic()
    with pytest.raises(DeviceUnavailable) as info:
        request_session(farm_net.tracker, "no-such-key", timeout_s=1.5)
    elapsed = time.monotonic() - start
    assert elapsed > 1.4  # the timeout is honoured; that the wait ends at all (TVM's would not) is the test's end
    assert info.value.message == "no free device for key 'no-such-key' after 1.5 s"
    assert "farm devices" in info.value.hint


def test_unreachable_tracker_is_tracker_error():
    with pytest.raises(TrackerError) as info:
        query_summary(TrackerAddress("127.0.0.1", free_port()), timeout_s=1)
    assert "cannot reach the RPC tracker" in info.value.message
    assert "farm tracker start" in info.value.hint


def test_non_tracker_port_is_tracker_error():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        def answer_garbage():
            conn, _ = listener.accept()
            conn.recv(4)
            conn.sendall(b"HTTP")
            conn.close()

        import threading

        thread = threading.Thread(target=answer_garbage, daemon=True)
        thread.start()
        with pytest.raises(TrackerError, match="is not a TVM RPC tracker"):
            query_summary(TrackerAddress("127.0.0.1", port), timeout_s=2)
    finally:
        listener.close()


def test_tracker_on_taken_port_fails_loudly(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    # port + 1 must be taken too, or TVM slides onto it: take both
    second = socket.socket()
    try:
        second.bind(("127.0.0.1", port + 1))
        second.listen()
    except OSError:
        pytest.skip("port + 1 not free")
    try:
        with pytest.raises(TrackerError) as info:
            start_tracker("127.0.0.1", port, tmp_path, timeout_s=10)
        assert "port" in info.value.hint
    finally:
        listener.close()
        second.close()


def test_stop_process_kills_server_group_and_tracker_forgets_it(farm_net, tmp_path):
    record = start_server(farm_net.tracker, "extra", "test-extra", tmp_path)
    try:
        wait_for_servers(farm_net.tracker, {"test-extra": 1}, timeout_s=120)
        # TVM's listen loop runs in the server's own process (tvm_private.serve_rpc_here): no second interpreter
        # importing TVM again, and no child at rest (a session is a fork while it lasts)
        assert psutil.Process(record.pid).children() == []
    finally:
        assert stop_process(record) is True
    deadline = time.monotonic() + 60  # polls until forgotten; the bound only ends a failing test
    while query_summary(farm_net.tracker).keys.get("test-extra") and \
            query_summary(farm_net.tracker).keys["test-extra"].servers and time.monotonic() < deadline:
        time.sleep(0.1)
    assert query_summary(farm_net.tracker).keys["test-extra"].servers == 0
    assert stop_process(record) is False  # already gone: nothing else is touched


def test_server_outlives_a_client_killed_mid_transfer(farm_net, tmp_path):
    """TVM's own rpc_server stops serving for good when a session's child dies on a broken socket."""
    record = start_server(farm_net.tracker, "sturdy", "test-sturdy", tmp_path)
    client = tmp_path / "client.py"
    client.write_text(
        "import sys, tvm\nfrom farm.rpc.session import request_session\nfrom farm.records import TrackerAddress\n"
        f"session = request_session(TrackerAddress('127.0.0.1', {farm_net.tracker.port}), 'test-sturdy', 60)\n"
        "array = tvm.runtime.empty((256 * 2**20,), 'uint8', session.cpu(0))\n"
        "print('downloading', flush=True)\n"
        "while True:\n    array.numpy()\n")
    proc = subprocess.Popen([sys.executable, str(client)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "downloading"  # the client has its session
        time.sleep(1)
        assert proc.poll() is None  # killed while 256 MiB are on the wire
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        session = request_session(farm_net.tracker, "test-sturdy", timeout_s=60, session_timeout_s=60)
        assert session.cpu(0).exist
        assert "ended abnormally" in Path(record.log_path).read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        stop_process(record)


def test_a_free_server_counts_as_registered_before_its_info_arrives():
    from farm.rpc.tracker import parse_summary

    # what the tracker answered in a fresh clone while an iOS app had just joined through the proxy
    summary = parse_summary({"queue_info": {"iphone-standin": {"free": 1, "pending": 0}}, "server_info": []})
    assert summary.keys["iphone-standin"].servers == 1 and summary.keys["iphone-standin"].free == 1


def test_farms_tracker_protocol_constants_are_tvms():
    from tvm.rpc import base

    from farm.rpc import tracker

    assert tracker.RPC_TRACKER_MAGIC == base.RPC_TRACKER_MAGIC
    assert {c.name: int(c) for c in tracker.TrackerCode} == \
        {name: int(value) for name, value in vars(base.TrackerCode).items() if not name.startswith("_")}
