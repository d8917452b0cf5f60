"""The aarch64 board build: farm's native RPC server (``farm/native/rpc_server.cc``) cross-compiled for
aarch64 Linux (glibc) and linked against the aarch64 TVM runtime from PyPI's apache-tvm wheels (the same
versions as the host's TVM).

No device kind of its own: ``qemu`` runs it under qemu-user (``emulated.py``), ``android`` pushes it to phones
(``android.py``), ``opencl_runtime.py`` cross-builds TVM's OpenCL runtime against its libraries, and
``native.py`` builds the same server source for this host. Building needs the cross compiler and the aarch64
sysroot, not qemu.

Built once per (TVM version, tvm-ffi version, server source, recipe) in ``$FARM_CACHE``
(default ``~/.cache/farm``) and reused.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from farm.devices.cache import building, cache_root, tvm_versions, wheel_dir
from farm.errors import DeviceError

SOURCE = Path(__file__).resolve().parent.parent / "native" / "rpc_server.cc"
SERVER = "farm-rpc-server"  # the server's file name in every build and bundle, and the marker farm stops it by
SYSROOT = Path("/usr/aarch64-linux-gnu")
CROSS_CXX = "aarch64-linux-gnu-g++"
PLATFORM = "manylinux_2_28_aarch64"
RECIPE = 2  # bump when the build below changes (2: + libtvm_runtime_extra for MetaSchedule's random fill)
SETUP_HINT = ("install g++-aarch64-linux-gnu: bash tools/setup.sh --emulation "
              "(or apt-get install g++-aarch64-linux-gnu)")


@dataclass(frozen=True)
class Board:
    server: Path  # aarch64 executable, libs beside it (rpath $ORIGIN)
    sysroot: Path
    versions: str


def build_define(build: str) -> str:
    """The compiler option that names what a native server binary was built from (its ``farm.ServerBuild``: a run's
    manifest field ``device.server``)."""
    return f'-DFARM_SERVER_BUILD="{build}"'


def missing_tools(*also: str) -> list[str]:
    """What this host lacks of ``also`` (e.g. qemu, to run the board), the cross compiler and the aarch64 libc."""
    missing = [tool for tool in (*also, CROSS_CXX) if shutil.which(tool) is None]
    if not (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        missing.append(f"{SYSROOT} (aarch64 libc)")
    return missing


def check_prerequisites() -> None:
    if missing := missing_tools():
        raise DeviceError(f"building the aarch64 board needs {', '.join(missing)}", SETUP_HINT)


def ensure_board(progress=None) -> Board:
    """Return the built board, building it on first use (downloads two wheels from PyPI)."""
    check_prerequisites()
    tvm_version, ffi_version = tvm_versions()
    source_digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    tag = f"{tvm_version}-{ffi_version}-{source_digest}-r{RECIPE}"
    folder = cache_root() / f"board-aarch64-{tag}"
    server = folder / SERVER
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
        include = wheel_dir("tvm_ffi") / "include"
        build = subprocess.run(
            [CROSS_CXX, "-std=c++17", "-O2", f"-I{include}", build_define(f"board-aarch64-{tag}"), str(SOURCE), "-o",
             str(work / SERVER),
             f"-L{work}", "-Wl,--no-as-needed", "-ltvm_runtime_extra", "-ltvm_runtime", "-ltvm_ffi",
             "-Wl,-rpath,$ORIGIN"],
            capture_output=True, text=True)
        if build.returncode != 0:
            raise DeviceError(f"building the native RPC server failed: {build.stderr.strip()[-500:]}", SETUP_HINT)
        shutil.rmtree(wheels)
    return Board(server, SYSROOT, tag)
