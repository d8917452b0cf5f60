#!/usr/bin/env python3
"""The emulated aarch64 board, by hand.

    build                         build (or find in the cache) the board; print its files
    run --tracker H:P --key KEY   run it in the foreground, registered with a tracker (Ctrl-C stops it)
        [--opencl]                with TVM's OpenCL runtime and Debian's arm64 POCL as its GPU driver

`farm serve` does the same for inventory devices of kind "qemu". Needs qemu-user and
g++-aarch64-linux-gnu (bash tools/setup.sh --emulation); the first build downloads the
aarch64 apache-tvm / apache-tvm-ffi wheels from PyPI and is cached in $FARM_CACHE
(default ~/.cache/farm).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from farm.devices.board import Board
from farm.devices.emulated import board_command, check_prerequisites, ensure_board
from farm.devices.opencl_runtime import board_with_opencl
from farm.devices.pocl_arm64 import ensure_sysroot
from farm.errors import FarmError
from farm.records import TrackerAddress
from farm.procs.supervise import free_port


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("build")
    run = sub.add_parser("run")
    run.add_argument("--tracker", required=True, help="HOST:PORT")
    run.add_argument("--key", required=True)
    run.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    run.add_argument("--opencl", action="store_true", help="the OpenCL bundle on Debian's arm64 POCL")
    args = parser.parse_args()
    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    try:
        check_prerequisites()
        board = ensure_board(progress=say)
        if args.action == "run" and args.opencl:
            folder = board_with_opencl(board.server.parent, progress=say)
            board = Board(folder / board.server.name, ensure_sysroot(say), board.versions)
    except FarmError as exc:
        print(f"error: {exc.message}\nhint: {exc.hint}", file=sys.stderr)
        return 1
    if args.action == "build":
        print(f"server:  {board.server}")
        print(f"sysroot: {board.sysroot}")
        print(f"built for TVM/tvm-ffi/source {board.versions}")
        return 0
    host, _, port = args.tracker.rpartition(":")
    kernel_cache = Path(tempfile.mkdtemp(prefix="farm-kernel-cache-"))
    command = board_command(board, TrackerAddress(host, int(port)), args.key, args.port or free_port(), kernel_cache)
    print(" ".join(command), file=sys.stderr)
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
