"""What built an artifact, as a run's manifest names it (``farm.manifest``; ``Artifact.built_with``): TVM's build (the
digest of its libraries: the wheel's ``libinfo()`` holds only USE_* flags), LLVM's version (the compiler library's),
the compiler that linked the library and its NDK, CUDA's compiler, and the tuning records applied."""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import tvm

from farm.compile.cuda import CudaCompiler
from farm.records import TuningSet

log = logging.getLogger(__name__)

def default_cc() -> str:
    """What TVM's export links with when no toolchain is named: its own choice (``$CXX``, ``$CC``, then g++ …)."""
    from tvm.support.cc import get_cc

    return get_cc() or "g++"


def built_with(linker: str, cuda: CudaCompiler | None, tuning: TuningSet | None, used: set[int]) -> dict[str, Any]:
    """The artifact's part of a run's manifest; fields it cannot read are left out (unknown). ``linker``: the
    compiler that linked the library ('' for an export of object files: nothing linked here)."""
    found: dict[str, Any] = {"tvm.build": tvm_build(), "llvm.version": llvm_version()}
    if linker:
        found["toolchain.compiler"] = compiler_version(linker)
        found["toolchain.ndk"] = ndk_version(linker)
    if cuda is not None:
        found["cuda.compiler"], found["cuda.version"] = cuda.label, cuda.cuda_version
    lines = sorted(used)
    found["records.count"] = len(lines)
    if tuning is not None and lines:  # each record by its workload's line and its body: not where the set lists it
        found["records.digest"] = hashlib.sha256("\n".join(sorted(_identity(tuning, i) for i in lines)).encode()).hexdigest()
        if tuning.sessions:
            found["records.sessions"] = sorted({s for i in lines if (s := tuning.sessions[i]) is not None})
    return {k: v for k, v in found.items() if v is not None}


def _identity(tuning: TuningSet, line: int) -> str:
    """A record line as its workload's line and its body (the line's index into the workloads dropped)."""
    import json

    workload, body = json.loads(tuning.records[line])
    return tuning.workloads[workload] + "\n" + json.dumps(body)


@functools.cache
def tvm_build() -> str | None:
    """sha256 over TVM's and tvm-ffi's libraries as installed here (name and bytes), once per process."""
    import tvm_ffi

    libraries = sorted(Path(tvm.__file__).parent.glob("lib/lib*.so")) + sorted(
        Path(tvm_ffi.__file__).parent.glob("lib/libtvm_ffi.so"))
    if not libraries:
        return None
    digest = hashlib.sha256()
    for lib in libraries:
        digest.update(lib.name.encode() + b"\0")
        with open(lib, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def llvm_version() -> int | None:
    try:
        return int(tvm.target.codegen.llvm_version_major())
    except Exception:  # a TVM built without LLVM
        return None


@functools.cache
def compiler_version(compiler: str) -> str | None:
    """The first line of ``compiler --version`` ("aarch64-linux-gnu-g++ (Debian 12.2.0-14) 12.2.0")."""
    path = shutil.which(compiler) or compiler
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("the version of %s is not known: %s", compiler, exc)
        return None
    first = (done.stdout or done.stderr).strip().splitlines()[:1]
    return first[0] if done.returncode == 0 and first else None


@functools.cache
def ndk_version(compiler: str) -> str | None:
    """An Android NDK's revision (its ``source.properties``' Pkg.Revision) when ``compiler`` lies inside one."""
    path = Path(shutil.which(compiler) or compiler).resolve()
    for folder in path.parents:
        properties = folder / "source.properties"
        if properties.is_file():
            match = re.search(r"^Pkg\.Revision\s*=\s*(\S+)", properties.read_text(errors="replace"), re.M)
            return match.group(1) if match else None
    return None
