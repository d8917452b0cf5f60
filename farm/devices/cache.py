"""What farm builds once and keeps in ``$FARM_CACHE`` (default ``~/.cache/farm``): the emulated board,
TVM's OpenCL runtime, bundles. Each is built in a temp folder beside its place and renamed into it, so
a killed build leaves nothing half-made and two farms building at once do not clash."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from farm.errors import DeviceError


def cache_root() -> Path:
    return Path(os.environ.get("FARM_CACHE", Path.home() / ".cache" / "farm"))


def tvm_versions() -> tuple[str, str]:
    """(apache-tvm, apache-tvm-ffi) installed here: what a cached build was built against."""
    return importlib.metadata.version("apache-tvm"), importlib.metadata.version("apache-tvm-ffi")


def wheel_dir(package: str) -> Path:
    """The installed package's folder (``tvm``, ``tvm_ffi``): the headers and libraries a build compiles against.
    Found without importing it (importing TVM takes seconds)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DeviceError(f"the Python package {package} is not installed here", "run tools/setup.sh")
    return Path(spec.submodule_search_locations[0])


@contextlib.contextmanager
def building(folder: Path, prefix: str) -> Iterator[Path]:
    """Yield a temp folder to build into; on success it becomes ``folder`` (unless another process's build
    got there first); on failure it is removed."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=folder.parent))
    try:
        yield work
        if not folder.exists():
            work.rename(folder)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def setup_step(label: str, build: Callable[[], Path]) -> int:
    """A cached build run as a program (``python -m``, tools/setup.sh): print where it is, or ``error:`` and
    ``hint:`` and exit 1, as the CLI."""
    import sys

    try:
        print(f"{label}: {build()}")
    except DeviceError as exc:
        print(f"error: {exc.message}\nhint: {exc.hint}", file=sys.stderr)
        return 1
    return 0
