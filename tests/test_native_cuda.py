"""The native server's CUDA bundle on a host without the NVIDIA driver (#51): it starts, registers and serves CPU
sessions as before, and a session that asks for CUDA is told why there is none, in words that cross RPC.

A real tracker, the real server, TVM's own client. On a host that has ``libcuda.so.1`` the bundle loads TVM's CUDA
runtime instead, and these tests skip."""

import ctypes
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import rpc
from tvm.error import RPCError
from tvm.script import tirx as T

from farm.devices.native import ensure_native_server, start_native_server
from farm.records import TrackerAddress
from farm.procs.supervise import free_port, stop_process
from farm.rpc.launch import exited_at_start, start_tracker
from farm.rpc.session import request_session
from farm.rpc.tracker import wait_for_servers

KEY = "cuda-less"
CPU_KEY = "cpu-only"  # the plain bundle, beside it: no CUDA runtime at all
# the loader's words for the missing driver, and what the server adds; the whole reason a client reads
NO_DRIVER = ("libcuda.so.1: cannot open shared object file: No such file or directory "
             "(the NVIDIA driver is not installed)")
REFUSED = f"no CUDA device on this server (key {KEY}): {NO_DRIVER}"


def _has_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def cuda_less(tmp_path_factory):
    """(the server's log, one session on it): the CUDA bundle registered on a private tracker, beside the plain
    bundle under ``CPU_KEY``, whose sessions a test asks its ``tracker`` for."""
    if _has_driver():
        pytest.skip("this host has the NVIDIA driver (libcuda.so.1): the CUDA bundle loads TVM's CUDA runtime here")
    work = tmp_path_factory.mktemp("native-cuda")
    server = ensure_native_server(cuda=True)
    port = free_port()
    tracker = TrackerAddress("127.0.0.1", port)
    started = [start_tracker("127.0.0.1", port, work)]
    try:
        started.append(start_native_server(server, tracker, "cuda-less", KEY, work))
        started.append(start_native_server(ensure_native_server(), tracker, "cpu-only", CPU_KEY, work))
        wait_for_servers(tracker, {KEY: 1, CPU_KEY: 1}, timeout_s=60, give_up=exited_at_start(started))
        session = request_session(tracker, KEY, timeout_s=10, session_timeout_s=60)
        yield CudaLess(work / "server-cuda-less.log", session, tracker)
    finally:
        for record in reversed(started):
            stop_process(record)


@dataclass(frozen=True)
class CudaLess:
    log: Path
    session: rpc.RPCSession  # on the CUDA bundle
    tracker: TrackerAddress


def _add_one():
    @T.prim_func
    def add_one(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in T.thread_binding(4, thread="threadIdx.x"):
            b[i] = a[i] + T.float32(1)
    return add_one


def test_the_cuda_bundle_carries_tvm_s_cuda_runtime_and_cudart_beside_the_server():
    bundle = ensure_native_server(cuda=True).parent
    assert "cuda" in bundle.name and bundle != ensure_native_server().parent
    assert {"libtvm_runtime_cuda.so", "libcudart.so.13", "libtvm_runtime.so", "libtvm_ffi.so"} <= {
        p.name for p in bundle.iterdir()}


def test_without_the_driver_the_server_says_at_start_that_cuda_sessions_will_be_refused(cuda_less):
    said = [line for line in cuda_less.log.read_text().splitlines() if "CUDA" in line]
    # TVM's CUDA runtime and its cudart are found (the bundle carries both): only the driver is missing
    assert said == [f"farm-rpc-server: CUDA runtime not loaded: {NO_DRIVER}; CUDA sessions will be refused"]


def test_a_cpu_session_still_runs(cuda_less):
    session = cuda_less.session
    assert session.cpu(0).exist
    data = np.arange(4, dtype="float32")
    assert (tvm.runtime.tensor(data, session.cpu(0)).numpy() == data).all()


def test_a_cuda_device_is_refused_with_the_reason(cuda_less):
    session = cuda_less.session
    with pytest.raises(RPCError, match="no CUDA device") as asked:
        _ = session.cuda(0).exist
    assert REFUSED in str(asked.value)
    with pytest.raises(RPCError, match="no CUDA device") as allocated:
        tvm.runtime.empty((4,), "float32", session.cuda(0))
    assert REFUSED in str(allocated.value)


def test_a_library_with_cuda_code_is_refused_with_the_reason(cuda_less, tmp_path):
    session = cuda_less.session
    library = tmp_path / "add_one.so"
    tvm.compile(_add_one(), target=tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host="llvm")
                ).export_library(str(library))
    session.upload(str(library))
    with pytest.raises(RPCError, match="no CUDA device") as loaded:
        session.load_module("add_one.so")
    assert REFUSED in str(loaded.value)


def test_device_runtimes_says_cuda_is_not_loaded_and_why(cuda_less):
    session = cuda_less.session
    runtimes = json.loads(session.get_function("farm.DeviceRuntimes")())
    assert runtimes["cuda"] == f"not loaded: {NO_DRIVER}"
    assert runtimes["opencl"].startswith("not loaded: ") and "libtvm_runtime_opencl.so" in runtimes["opencl"]


def test_the_plain_bundle_refuses_cuda_saying_it_was_built_without(cuda_less):
    session = request_session(cuda_less.tracker, CPU_KEY, timeout_s=10, session_timeout_s=60)
    try:
        with pytest.raises(RPCError) as asked:
            tvm.runtime.empty((4,), "float32", session.cuda(0))
        assert f"no CUDA device on this server (key {CPU_KEY}): " in str(asked.value)
        assert "libtvm_runtime_cuda.so: cannot open shared object file" in str(asked.value)
        assert "(this server was built without CUDA support)" in str(asked.value)
    finally:
        del session
    # a server built without CUDA (boards, phones, a fleet's hundred) says nothing of it at start
    plain_log = cuda_less.log.with_name("server-cpu-only.log").read_text()
    assert "listening on" in plain_log and "CUDA" not in plain_log
