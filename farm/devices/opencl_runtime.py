"""TVM's OpenCL runtime, which PyPI's wheel does not ship: for ``opencl`` devices on this host, and
in the aarch64 bundle that boards and phones run.

TVM's OpenCL runtime is ``src/backend/opencl/runtime/`` of TVM's sources compiled against the
installed wheel's headers and libraries. farm builds it once per (TVM version, tvm-ffi version,
source digest, recipe, architecture) into ``$FARM_CACHE`` (default ``~/.cache/farm``):

- for this host, linked with ``-lOpenCL`` (the ICD loader: the driver is found at run time);
- for aarch64 (phones, boards), with TVM's ``opencl_wrapper`` instead, which dlopens the phone's
  ``libOpenCL.so`` at run time, against the aarch64 wheel's libraries of the board build (``board.py``).

The sources come from ``TVM_SOURCE_DIR``, else ``../shared/tvm-src`` beside this checkout; no copy of
TVM's sources is part of farm. ``python -m farm.devices.opencl_runtime`` builds it (tools/setup.sh).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from farm.devices.board import CROSS_CXX, ensure_board
from farm.devices.cache import building, cache_root, setup_step, tvm_versions, wheel_dir
from farm.errors import DeviceError

log = logging.getLogger(__name__)

TVM_COMMIT = "5d4dc8721307cf9677becacf0395c19be130e206"
RECIPE = 1  # bump when the build below changes
LIBRARY = "libtvm_runtime_opencl.so"
CL_HEADER = Path("/usr/include/CL/cl.h")
SETUP_HINT = ("install an OpenCL driver and headers: bash tools/setup.sh --opencl "
              "(apt-get install pocl-opencl-icd ocl-icd-opencl-dev opencl-headers)")
SOURCES_HINT = (f"check out apache/tvm at commit {TVM_COMMIT[:12]} and set TVM_SOURCE_DIR to it "
                "(farm needs src/backend/opencl/runtime, src/support and include/tvm/support)")
COMPILE_FLAGS = ["-std=c++20", "-O2", "-fPIC", "-fvisibility=hidden", "-DNDEBUG", "-DTVM_INDEX_DEFAULT_I64=1"]


def source_dir() -> Path:
    """Where TVM's OpenCL runtime sources are: TVM_SOURCE_DIR, else ../shared/tvm-src beside the checkout."""
    configured = os.environ.get("TVM_SOURCE_DIR")
    candidates = [Path(configured)] if configured else [Path(__file__).resolve().parents[3] / "shared" / "tvm-src"]
    for folder in candidates:
        if (folder / "src" / "backend" / "opencl" / "runtime" / "opencl_module.cc").exists():
            return folder
    where = configured or str(candidates[0])
    raise DeviceError(f"TVM's OpenCL runtime sources are not at {where}", SOURCES_HINT)


def _source_files(root: Path) -> list[Path]:
    folders = [root / "src" / "backend" / "opencl", root / "src" / "support", root / "include"]
    return sorted(p for folder in folders if folder.exists() for p in folder.rglob("*") if p.is_file())


def check_prerequisites(cross: bool = False) -> None:
    compiler = CROSS_CXX if cross else "g++"
    missing = [] if shutil.which(compiler) else [compiler]
    if not CL_HEADER.exists():
        missing.append(f"{CL_HEADER} (opencl-headers)")
    if not cross and not any(Path(d, "libOpenCL.so").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")):
        missing.append("libOpenCL.so (ocl-icd-opencl-dev)")
    if missing:
        raise DeviceError(f"building TVM's OpenCL runtime needs {', '.join(missing)}", SETUP_HINT)


def runtime_tag(arch: str) -> str:
    root = source_dir()
    digest = hashlib.sha256()
    for path in _source_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    tvm_version, ffi_version = tvm_versions()
    return f"{arch}-{tvm_version}-{ffi_version}-{digest.hexdigest()[:12]}-r{RECIPE}"


def ensure_runtime(arch: str = "x86_64", progress=None) -> Path:
    """The path of TVM's OpenCL runtime library for ``arch`` ("x86_64" = this host, or "aarch64"),
    built on first use (about 12 s on 2 cores) and cached."""
    cross = arch != "x86_64"
    check_prerequisites(cross)
    tag = runtime_tag(arch)
    folder = cache_root() / f"opencl-runtime-{tag}"
    library = folder / LIBRARY
    if library.exists():
        return library
    if progress:
        progress(f"building TVM's OpenCL runtime for {arch} from {source_dir()}")
    with building(folder, "opencl-runtime-") as work:
        _build(work, cross)
    return library


def _build(work: Path, cross: bool) -> None:
    root = source_dir()
    tree = work / "tree"
    shutil.copytree(root / "src", tree / "src")
    # The wheel's private runtime headers match its binaries (the wheel is newer than the sources).
    shutil.copytree(wheel_dir("tvm") / "src" / "runtime", tree / "src" / "runtime", dirs_exist_ok=True)
    includes = [f"-I{root / 'include'}", f"-I{wheel_dir('tvm') / 'include'}", f"-I{wheel_dir('tvm_ffi') / 'include'}",
                f"-I{tree / 'src'}"]
    runtime = tree / "src" / "backend" / "opencl" / "runtime"
    sources = [runtime / "opencl_device_api.cc", runtime / "opencl_module.cc"]
    if cross:
        board = ensure_board()
        compiler, lib_dir = CROSS_CXX, board.server.parent
        headers = work / "cl-headers"
        headers.mkdir()
        (headers / "CL").symlink_to(CL_HEADER.parent)  # the headers only: not the host's other includes
        includes.append(f"-I{headers}")
        sources.append(runtime / "opencl_wrapper" / "opencl_wrapper.cc")
        link = ["-ltvm_runtime", "-ltvm_ffi", "-ldl", "-Wl,-rpath,$ORIGIN"]
    else:
        compiler = "g++"
        lib_dir = None
        link = [f"-L{wheel_dir('tvm') / 'lib'}", f"-L{wheel_dir('tvm_ffi') / 'lib'}", "-ltvm_runtime", "-ltvm_ffi",
                "-lOpenCL"]
    if lib_dir is not None:
        link = [f"-L{lib_dir}", *link]
    objects = [work / (src.stem + ".o") for src in sources]
    jobs = [subprocess.Popen([compiler, *COMPILE_FLAGS, *includes, "-c", str(src), "-o", str(obj)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for src, obj in zip(sources, objects)]
    for job, src in zip(jobs, sources):
        output, _ = job.communicate()
        if job.returncode != 0:
            raise DeviceError(f"compiling TVM's {src.name} failed: {output.strip()[-600:]}",
                              f"the sources may not match apache-tvm {tvm_versions()[0]}; "
                              + SOURCES_HINT)
    done = subprocess.run([compiler, "-shared", "-o", str(work / LIBRARY), *map(str, objects), "-Wl,--no-undefined", *link],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise DeviceError(f"linking TVM's OpenCL runtime failed: {done.stderr.strip()[-600:]}", SETUP_HINT)
    shutil.rmtree(tree)
    for obj in objects:
        obj.unlink()


def board_with_opencl(board_folder: Path, progress=None) -> Path:
    """The aarch64 server bundle (farm's native server and the aarch64 TVM runtime) plus TVM's OpenCL runtime
    built with opencl_wrapper, which the server loads at start; the plain bundle where it cannot be built here.

    A folder of its own beside the bundle (the cached bundle is never modified); files are copies, so adb's
    sync can push them and their mtimes say when they changed."""
    try:
        library = ensure_runtime("aarch64", progress)
    except DeviceError as exc:
        log.warning("the aarch64 bundle goes without OpenCL: %s (%s)", exc.message, exc.hint)
        return board_folder
    folder = board_folder.with_name(f"{board_folder.name}-opencl-{library.parent.name.split('-')[-2]}")
    if (folder / LIBRARY).exists():
        return folder
    with building(folder, "bundle-") as work:
        for path in board_folder.iterdir():
            if path.is_file():
                shutil.copy2(path, work / path.name)
        shutil.copy2(library, work / LIBRARY)
    return folder


def missing() -> str:
    """What this host lacks to serve an OpenCL device (prerequisites, sources, a platform), '' when nothing; no build."""
    try:
        check_prerequisites()
        source_dir()
    except DeviceError as exc:
        return f"{exc.message}: {exc.hint}"
    if not any(Path("/etc/OpenCL/vendors").glob("*.icd")):
        return f"no OpenCL platform is registered in /etc/OpenCL/vendors: {SETUP_HINT}"
    return ""


def runtime_available() -> bool:
    """Whether an OpenCL device can be served here (see ``missing``)."""
    return missing() == ""


def main() -> int:
    """Build (or find) the runtime, as tools/setup.sh does; missing sources are a warning (exit 0)."""
    try:
        source_dir()
    except DeviceError as exc:
        print(f"warning: {exc.message}; OpenCL devices are skipped until {exc.hint}", file=sys.stderr)
        return 0
    return setup_step("TVM's OpenCL runtime", lambda: ensure_runtime(progress=print))


if __name__ == "__main__":
    sys.exit(main())
