"""``qemu`` devices: an aarch64 board emulated on this host with qemu-user.

The board (``board.py``: farm's native RPC server cross-compiled for aarch64 against the aarch64 TVM
runtime, plus TVM's OpenCL runtime where it can be built: ``opencl_runtime.board_with_opencl``) runs under
``qemu-aarch64 -L <sysroot>``, so no binfmt registration is needed, registers with the tracker under the
device's key, and runs what farm cross-compiles for ``aarch64-linux-gnu`` for real. Timings under emulation
are not a board's timings: such devices are marked emulated in the store and the report.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from farm.devices.board import SERVER, SYSROOT, Board, ensure_board, missing_tools
from farm.devices.kind import DeviceKind, Field, host_software, thread_options
from farm.devices.opencl_runtime import board_with_opencl
from farm.devices.pocl_arm64 import ensure_sysroot
from farm.errors import DeviceError
from farm.records import Device, HostCPU, TrackerAddress, target_kind
from farm.procs.registry import ManagedProcess
from farm.procs.supervise import free_port, local_process, log_tail, spawn

log = logging.getLogger(__name__)

QEMU = "qemu-aarch64"
SETUP_HINT = ("install qemu-user and g++-aarch64-linux-gnu: bash tools/setup.sh --emulation "
              "(or apt-get install qemu-user g++-aarch64-linux-gnu)")


def check_prerequisites() -> None:
    """What running the board needs here: qemu, and what building it needs (``board.missing_tools``)."""
    if missing := missing_tools(QEMU):
        raise DeviceError(f"the emulated aarch64 board needs {', '.join(missing)}", SETUP_HINT)


def board_command(board: Board, tracker: TrackerAddress, key: str, port: int, kernel_cache: Path,
                  options: tuple[str, ...] = ()) -> list[str]:
    return [QEMU, "-L", str(board.sysroot), str(board.server), "--tracker", str(tracker), "--key", key,
            "--host", "127.0.0.1", "--port", str(port), "--kernel-cache", str(kernel_cache), *options]


def sysroot_for(device: Device, progress) -> Path:
    """The arm64 POCL sysroot for a device with an OpenCL target (its GPU driver), else the cross toolchain's;
    the plain one, with a warning, where POCL cannot be had here (the OpenCL cell then fails and falls back)."""
    if target_kind(device.target) != "opencl":
        return SYSROOT
    try:
        return ensure_sysroot(progress)
    except DeviceError as exc:
        log.warning("%s: no OpenCL driver for the emulated board: %s (%s)", device.name, exc.message, exc.hint)
        return SYSROOT


class Qemu(DeviceKind):
    name = "qemu"
    summary = "an aarch64 board emulated here with qemu-user (farm's native server on the aarch64 TVM runtime)"
    serve_help = "the emulated aarch64 board (built once: cross-compiled server + the aarch64 wheel's runtime)"
    fields = {"server_port": Field("port", "server_port = 9096", "the board's server port (default: a free one)")}
    example = 'key = "board"\ntarget = { kind = "llvm", mtriple = "aarch64-linux-gnu" }'
    always_emulated = True
    measures_on_this_host = True  # qemu runs on this host's cores

    def prerequisites(self) -> str:
        try:
            check_prerequisites()
        except DeviceError as exc:
            return f"{exc.message}: {exc.hint}"
        return ""

    def software(self, device: Device) -> dict[str, Any]:
        """qemu-user runs on this host's kernel and CPU: this host's software."""
        return host_software()

    def effective_target(self, device: Device, target: dict[str, Any], host: HostCPU) -> dict[str, Any]:
        if target_kind(target) == "llvm":
            target.setdefault("num-cores", host.cores)  # this host's cores run the emulated code
        return super().effective_target(device, target, host)

    def bring_up(self, device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
        check_prerequisites()
        def say(msg: str) -> None:
            log.warning("%s: %s", device.name, msg)

        board = ensure_board(progress=say)
        folder = board_with_opencl(board.server.parent, progress=say)
        board = Board(folder / board.server.name, sysroot_for(device, say), board.versions)
        port = device.options.get("server_port") or free_port()
        log_path = state_dir / f"server-{device.name}.log"
        proc = spawn(board_command(board, tracker, device.key, port, state_dir / f"kernel-cache-{device.name}",
                                   thread_options(device)),
                     log_path)
        time.sleep(0.2)
        if proc.poll() is not None:
            raise DeviceError(f"the emulated board {device.name!r} exited at start: {log_tail(str(log_path))}", f"see {log_path}")
        return [local_process("server", device.name, device.key, proc.pid, port, str(log_path), SERVER)]
