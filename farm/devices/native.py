"""farm's native RPC server (``farm/native/rpc_server.cc``) built for this host, against the installed TVM runtime.

A fleet of devices on one host (``tools/bench_fleet.py``: 100 servers) cannot be 100 Python servers, each
importing TVM twice (server and worker, ~300 MB); the native server is one small process per device that
loads the wheel's ``libtvm_runtime.so``. Same protocol, same forked session per connection, and it puts
its key back on the tracker only after its session has ended. Built once (g++, a few seconds), cached.

``ensure_native_server(cuda=True)`` is the same server in a folder of its own with the apache-tvm wheel's
``libtvm_runtime_cuda.so`` and PyPI's ``libcudart.so.13`` beside it, which the server loads at start. The NVIDIA
driver (``libcuda.so.1``) is the host's: where there is none, the server still starts and serves CPU sessions,
logs why CUDA is not loaded, and refuses a CUDA session with that reason (``farm.DeviceRuntimes`` reports it).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from farm.devices.board import SERVER, SOURCE, build_define
from farm.devices.cache import building, cache_root, tvm_versions, wheel_dir
from farm.devices.nvidia_wheels import library_path
from farm.errors import DeviceError
from farm.records import TrackerAddress
from farm.procs.registry import ManagedProcess
from farm.procs.supervise import free_port, local_process, spawn

HOST_CXX = "g++"


# The build's recipe, in its cache folder's name: r2 carries its TVM libraries beside it ($ORIGIN). r1 pointed its
# RUNPATH into the venv that built it, so a host's other checkouts found `libtvm_runtime.so => not found` once that
# checkout was removed (#30: every server of a fleet then "did not register").
RECIPE = 2
LIBRARIES = ("libtvm_runtime.so", "libtvm_ffi.so")  # what the server links, copied from the installed wheels
CUDA_RUNTIME = "libtvm_runtime_cuda.so"  # the wheel's CUDA runtime, which a CUDA bundle's server loads at start


def _library_dirs() -> tuple[Path, Path, Path]:
    """(tvm/lib, tvm_ffi/lib, tvm_ffi/include) of the installed wheels."""
    tvm_dir, ffi_dir = wheel_dir("tvm"), wheel_dir("tvm_ffi")
    return tvm_dir / "lib", ffi_dir / "lib", ffi_dir / "include"


def ensure_native_server(cuda: bool = False) -> Path:
    """The host build of farm's native server, building it on first use, checked before it is returned (it
    starts, and the loader finds its libraries); returns the executable. ``cuda``: the CUDA bundle (the module's
    docstring), which starts on a host without the NVIDIA driver too. A bundle already in the cache is used as it
    is, with no compiler here (``tools/gpu_kit.py`` carries one to a host that has no g++)."""
    tvm_version, ffi_version = tvm_versions()
    tag = f"{tvm_version}-{ffi_version}-{hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]}-r{RECIPE}"
    if cuda:
        bundled = cache_root() / f"native-host-cuda-{tag}" / SERVER
        if not bundled.exists():
            _bundle_cuda(ensure_native_server(), bundled.parent)
        check_native_server(bundled)
        return bundled
    folder = cache_root() / f"native-host-{tag}"
    server = folder / SERVER
    if not server.exists():
        if shutil.which(HOST_CXX) is None:
            raise DeviceError("building farm's native RPC server needs g++", "install it: apt-get install g++")
        tvm_lib, ffi_lib, include = _library_dirs()
        with building(folder, "native-") as work:
            for name, lib in zip(LIBRARIES, (tvm_lib, ffi_lib)):
                shutil.copy2(lib / name, work / name)
            build = subprocess.run(
                [HOST_CXX, "-std=c++17", "-O2", f"-I{include}", build_define(f"native-host-{tag}"), str(SOURCE), "-o",
                 str(work / SERVER),
                 f"-L{work}", "-Wl,--no-as-needed", "-ltvm_runtime", "-ltvm_ffi", "-Wl,-rpath,$ORIGIN"],
                capture_output=True, text=True)
            if build.returncode != 0:
                raise DeviceError(f"building the native RPC server failed: {build.stderr.strip()[-500:]}",
                                  "check that g++ and the apache-tvm wheel are installed")
    check_native_server(server)
    return server


def _bundle_cuda(server: Path, folder: Path) -> None:
    """The host build ``server`` copied with its libraries into ``folder`` (``native-host-cuda-<its tag>``), with TVM's
    CUDA runtime and the cudart it needs beside them (the runtime's RUNPATH is ``$ORIGIN``)."""
    cudart = library_path("cudart-13")
    with building(folder, "native-cuda-") as work:
        for path in (*server.parent.iterdir(), _library_dirs()[0] / CUDA_RUNTIME, cudart):
            shutil.copy2(path, work / path.name)


def check_native_server(server: Path) -> None:
    """Start ``server`` without arguments: it prints its usage and exits once the loader has found its libraries.
    DeviceError with the loader's own message when it cannot start."""
    try:
        done = subprocess.run([str(server)], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeviceError(f"farm's native RPC server {server} does not start: {exc}",
                          f"remove {server.parent} and farm builds it again") from exc
    if "usage:" not in done.stderr:
        said = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}, nothing printed"]
        raise DeviceError(f"farm's native RPC server {server} does not start: {said[0]}",
                          f"remove {server.parent} and farm builds it again")


def native_command(server: Path, tracker: TrackerAddress, key: str, port: int) -> list[str]:
    return [str(server), "--tracker", str(tracker), "--key", key, "--host", "127.0.0.1", "--port", str(port)]


def start_native_server(server: Path, tracker: TrackerAddress, name: str, key: str, state_dir: Path,
                        port: int | None = None, options: tuple[str, ...] = ()) -> ManagedProcess:
    """One native server on loopback (``port``, else a free one) with extra ``options`` (``--threads N``), in its own
    process group, its log in ``state_dir``; the record ``stop_process`` stops it by."""
    port = port or free_port()
    log_path = state_dir / f"server-{name}.log"
    proc = spawn([*native_command(server, tracker, key, port), *options], log_path)
    return local_process("server", name, key, proc.pid, port, str(log_path), SERVER)
