"""``qemu`` devices: an aarch64 board emulated on this host with qemu-user.

The board is farm's native RPC server (``farm/native/rpc_server.cc``) cross-compiled for
aarch64 and linked against the aarch64 TVM runtime from PyPI's apache-tvm wheels (the same
versions as the host's TVM). It runs under ``qemu-aarch64 -L <sysroot>``, so no binfmt
registration is needed, registers with the tracker under the device's key, and runs what
farm cross-compiles for ``aarch64-linux-gnu`` for real. Timings under emulation are not a
board's timings: such devices are marked emulated in the store and the report.

Built once per (TVM version, tvm-ffi version, server source) in ``$FARM_CACHE``
(default ``~/.cache/farm``) and reused.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.devices.cache import building, cache_root, tvm_versions
from farm.devices.kind import DeviceKind, Field
from farm.errors import DeviceError
from farm.records import Device, HostCPU, TrackerAddress
from farm.rpc.processes import ManagedProcess, free_port, log_tail, spawn

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent.parent / "native" / "rpc_server.cc"
SYSROOT = Path("/usr/aarch64-linux-gnu")
CROSS_CXX = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"
PLATFORM = "manylinux_2_28_aarch64"
MARKER = "farm-rpc-server"
RECIPE = 2  # bump when the build below changes (2: + libtvm_runtime_extra for MetaSchedule's random fill)
SETUP_HINT = "install qemu-user and g++-aarch64-linux-gnu: bash tools/setup.sh --emulation (or apt-get install qemu-user g++-aarch64-linux-gnu)"


@dataclass(frozen=True)
class Board:
    server: Path  # aarch64 executable, libs beside it (rpath $ORIGIN)
    sysroot: Path
    versions: str


def check_prerequisites() -> None:
    missing = [tool for tool in (QEMU, CROSS_CXX) if shutil.which(tool) is None]
    if not (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        missing.append(f"{SYSROOT} (aarch64 libc)")
    if missing:
        raise DeviceError(f"the emulated aarch64 board needs {', '.join(missing)}", SETUP_HINT)


def ensure_board(progress=None) -> Board:
    """Return the built board, building it on first use (downloads two wheels from PyPI)."""
    check_prerequisites()
    tvm_version, ffi_version = tvm_versions()
    source_digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    tag = f"{tvm_version}-{ffi_version}-{source_digest}-r{RECIPE}"
    folder = cache_root() / f"board-aarch64-{tag}"
    server = folder / "farm-rpc-server"
    if server.exists():
        return Board(server, SYSROOT, tag)
    with building(folder, "board-") as work:
        if progress:
            progress(f"downloading aarch64 wheels of apache-tvm {tvm_version} and apache-tvm-ffi {ffi_version}")
        wheels = work / "wheels"
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--platform", PLATFORM,
               "--platform", "manylinux2014_aarch64", "-d", str(wheels),
               f"apache-tvm=={tvm_version}", f"apache-tvm-ffi=={ffi_version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise DeviceError(f"could not download the aarch64 TVM wheels: {done.stderr.strip().splitlines()[-1:]}",
                              "farm needs PyPI once to build the emulated board; it is cached afterwards")
        libs = {"libtvm_runtime.so": "tvm/lib/libtvm_runtime.so", "libtvm_ffi.so": "tvm_ffi/lib/libtvm_ffi.so",
                "libtvm_runtime_extra.so": "tvm/lib/libtvm_runtime_extra.so"}
        for wheel in wheels.glob("*.whl"):
            with zipfile.ZipFile(wheel) as zf:
                for name, inner in libs.items():
                    if inner in zf.namelist():
                        (work / name).write_bytes(zf.read(inner))
        for name in libs:
            if not (work / name).exists():
                raise DeviceError(f"the aarch64 wheels had no {name}", "report this: the wheel layout changed")
        if progress:
            progress("cross-compiling the native RPC server for aarch64")
        include = Path(importlib.util.find_spec("tvm_ffi").submodule_search_locations[0]) / "include"
        build = subprocess.run(
            [CROSS_CXX, "-std=c++17", "-O2", f"-I{include}", str(SOURCE), "-o", str(work / "farm-rpc-server"),
             f"-L{work}", "-Wl,--no-as-needed", "-ltvm_runtime_extra", "-ltvm_runtime", "-ltvm_ffi",
             "-Wl,-rpath,$ORIGIN"],
            capture_output=True, text=True)
        if build.returncode != 0:
            raise DeviceError(f"building the native RPC server failed: {build.stderr.strip()[-500:]}", SETUP_HINT)
        shutil.rmtree(wheels)
    return Board(server, SYSROOT, tag)


def board_command(board: Board, tracker: TrackerAddress, key: str, port: int) -> list[str]:
    return [QEMU, "-L", str(board.sysroot), str(board.server), "--tracker", str(tracker), "--key", key,
            "--host", "127.0.0.1", "--port", str(port)]


class Qemu(DeviceKind):
    name = "qemu"
    summary = "an aarch64 board emulated here with qemu-user (farm's native server on the aarch64 TVM runtime)"
    serve_help = "the emulated aarch64 board (built once: cross-compiled server + the aarch64 wheel's runtime)"
    fields = {"server_port": Field("port", "server_port = 9096", "the board's server port (default: a free one)")}
    example = 'key = "board"\ntarget = { kind = "llvm", mtriple = "aarch64-linux-gnu" }'
    always_emulated = True

    def prerequisites(self) -> str:
        try:
            check_prerequisites()
        except DeviceError as exc:
            return f"{exc.message}: {exc.hint}"
        return ""

    def effective_target(self, device: Device, target: dict[str, Any], host: HostCPU) -> dict[str, Any]:
        if target["kind"] == "llvm":
            target.setdefault("num-cores", host.cores)  # this host's cores run the emulated code
        return super().effective_target(device, target, host)

    def bring_up(self, device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
        from farm.devices.opencl_runtime import board_with_opencl

        board = ensure_board(progress=lambda msg: log.warning("%s: %s", device.name, msg))
        folder = board_with_opencl(board.server.parent, progress=lambda msg: log.warning("%s: %s", device.name, msg))
        board = Board(folder / board.server.name, board.sysroot, board.versions)
        port = device.options.get("server_port") or free_port()
        log_path = state_dir / f"server-{device.name}.log"
        proc = spawn(board_command(board, tracker, device.key, port), log_path)
        time.sleep(0.2)
        if proc.poll() is not None:
            raise DeviceError(f"the emulated board {device.name!r} exited at start: {log_tail(str(log_path))}", f"see {log_path}")
        return [ManagedProcess("server", device.name, device.key, proc.pid, port, str(log_path), time.time(), MARKER)]
