"""CUDA device code, compiled when farm compiles a model, never when a device loads it.

TVM 0.27 puts CUDA C *source* into an exported library and compiles it when the module loads, through the Python
callback ``tvm_callback_cuda_compile``: a device without Python (farm's native server, an app) cannot load it, and
a TX2 (sm_62) or Xavier (sm_72) cannot have it compiled by today's NVRTC. farm compiles the source to a cubin for the
device's arch on the build host and puts that in the library instead (``tvm_private.pack_imports_with_cubin``), with
a note saying which compiler made it and the oldest driver that loads it (``artifacts.inspect_artifact`` reads both
back from the bytes).

The compiler, per device (``compiler_for``):

==================================  ===========================================================================
the device says                     the compiler
==================================  ===========================================================================
nothing (the default)               NVRTC from PyPI's wheels (``devices/nvidia_wheels.py``): CUDA 12.9's for
                                    sm_50 to sm_72, CUDA 13.0's from sm_75 (CUDA 13 dropped sm_50-sm_72)
``cuda_toolkit = "/usr/local/cuda"``  that toolkit's ``bin/nvcc`` (a Jetson's JetPack, whose driver is older than
                                    CUDA 12: a cubin loads only on a driver of its CUDA version or newer)
==================================  ===========================================================================

An arch the chosen compiler cannot target is a ``BuildError`` before TVM compiles anything, with a hint naming the
compiler that can.
"""

from __future__ import annotations

import ctypes
import functools
import json
import re
import shlex
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from farm.devices.nvidia_wheels import WHEEL_SETS, include_path, library_path
from farm.errors import BuildError
from farm.records import Device, target_kind

# The oldest Linux driver that loads a cubin from each CUDA release (NVIDIA's "CUDA Compatibility" guide, table
# "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility"; 10.2 has no minor-version
# compatibility: its own toolkit's driver). A Jetson's driver comes with its JetPack (L4T), of one CUDA version.
MIN_DRIVER = {"10.2": "440.33", "11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}
# The archs each PyPI NVRTC compiles (checked 2026-11-28: 12.9.86 compiles sm_62, sm_72, sm_75, sm_87, sm_90;
# 13.0 refuses sm_62 and sm_72 with NVRTC_ERROR_INVALID_OPTION). CUDA 12 dropped everything below sm_50.
NVRTC_FOR = (("nvrtc-12", 50, 74), ("nvrtc-13", 75, 121))
NOTE_MARK = b"farm-cuda-device-code: "  # the note's prefix in the library's bytes (artifacts.py reads it)

# TVM's own NVRTC preamble (tvm/support/nvcc.py, _compile_cuda_nvrtc): what NVRTC lacks that TVM's kernels use
NVRTC_PREAMBLE = """#include <cuda/std/cstdint>
using cuda::std::uint8_t; using cuda::std::uint16_t; using cuda::std::uint32_t; using cuda::std::uint64_t;
using cuda::std::int8_t; using cuda::std::int16_t; using cuda::std::int32_t; using cuda::std::int64_t;
#ifndef __asm__
#define __asm__ asm
#endif
#ifndef __volatile__
#define __volatile__ volatile
#endif
#include <cuda/std/limits>
#ifndef INFINITY
#define INFINITY (::cuda::std::numeric_limits<float>::infinity())
#endif
"""
NVRTC_OPTIONS = ("-default-device", "--use_fast_math", "-D__NV_SILENCE_DEPRECATION_BEGIN=",
                 "-D__NV_SILENCE_DEPRECATION_END=", "-D__NV_SILENCE_HOST_DEPRECATION_BEGIN=",
                 "-D__NV_SILENCE_HOST_DEPRECATION_END=", "-U__CUDA_NO_HALF_OPERATORS__",
                 "-U__CUDA_NO_HALF_CONVERSIONS__")
NVCC_OPTIONS = ("-O3", "--use_fast_math")


@dataclass(frozen=True)
class CudaCompiler:
    """What compiles a device's CUDA code: NVRTC from a PyPI wheel set, or a toolkit's nvcc."""

    kind: str  # "nvrtc" | "nvcc"
    cuda_version: str  # "12.9"
    source: str  # the wheel set ("nvrtc-12") or the nvcc path

    @property
    def label(self) -> str:
        return f"NVRTC {self.cuda_version} (PyPI)" if self.kind == "nvrtc" else f"nvcc {self.cuda_version} ({self.source})"

    @property
    def min_driver(self) -> str:
        """The oldest Linux driver that loads this compiler's cubins."""
        major, _, minor = self.cuda_version.partition(".")
        return MIN_DRIVER.get(f"{major}.{minor}", MIN_DRIVER.get(major, f"CUDA {self.cuda_version}'s"))


@dataclass(frozen=True)
class DeviceCode:
    """The note a CUDA artifact carries: its arch, the CUDA that compiled it, the oldest driver that loads it."""

    arch: str  # "sm_62"
    format: str  # "cubin"
    cuda_version: str
    compiler: str  # CudaCompiler.label
    min_driver: str

    def note(self) -> bytes:
        return NOTE_MARK + json.dumps(asdict(self), sort_keys=True).encode()


def cuda_arch(target: dict[str, Any]) -> str:
    """The ``sm_XX`` an effective CUDA target compiles for: its ``arch``, else its tag's (which TVM's compiler reads:
    a host with TVM's runtime alone needs the arch written out)."""
    from farm.compile.targets import make_target

    arch = str(target["arch"] if "arch" in target else make_target(target).attrs.get("arch", ""))
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise BuildError(f"the CUDA target {json.dumps(target)} names no arch (sm_XX)",
                         'write target = { kind = "cuda", arch = "sm_90" } (the GPU\'s compute capability)')
    return arch


def _sm(arch: str) -> int:
    return int(re.sub(r"\D", "", arch))


def compiler_for(device: Device, arch: str) -> CudaCompiler:
    """The compiler for ``device``'s CUDA code (its ``cuda_toolkit``'s nvcc, else PyPI's NVRTC for ``arch``);
    BuildError, naming the compiler to use, when it cannot target ``arch``."""
    toolkit = device.options.get("cuda_toolkit")
    if toolkit:
        nvcc = Path(str(toolkit)).expanduser() / "bin" / "nvcc"
        version, archs = _nvcc_facts(str(nvcc))
        if archs and arch not in archs:
            raise BuildError(f"device {device.name!r}: {nvcc} (CUDA {version}) cannot compile for {arch}; it "
                             f"targets {archs[0]} to {archs[-1]}", _hint_for(arch))
        return CudaCompiler("nvcc", version, str(nvcc))
    for name, low, high in NVRTC_FOR:
        if low <= _sm(arch) <= high:
            return CudaCompiler("nvrtc", WHEEL_SETS[name].cuda_version, name)
    raise BuildError(f"device {device.name!r}: no CUDA compiler on PyPI targets {arch} (CUDA 12 dropped archs "
                     "below sm_50)", 'name a CUDA 11 toolkit in devices.toml: cuda_toolkit = "/usr/local/cuda-11.8"')


def _hint_for(arch: str) -> str:
    for name, low, high in NVRTC_FOR:
        if low <= _sm(arch) <= high:
            return (f"leave cuda_toolkit out and farm compiles {arch} with CUDA {WHEEL_SETS[name].cuda_version}'s "
                    f"NVRTC from PyPI, or name a toolkit that targets {arch} (a TX2's JetPack 4.6: CUDA 10.2)")
    return f"name a CUDA toolkit that targets {arch} in devices.toml: cuda_toolkit = \"/path/to/cuda\""


@functools.lru_cache(maxsize=None)
def _nvcc_facts(nvcc: str) -> tuple[str, tuple[str, ...]]:
    """(CUDA version, the sm_XX it compiles) of an nvcc; no archs where it cannot list them (CUDA 10)."""
    try:
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
        listed = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"the CUDA toolkit's nvcc {nvcc} does not run: {exc}",
                         "fix cuda_toolkit in devices.toml (the folder that holds bin/nvcc), or leave it out for "
                         "PyPI's NVRTC") from exc
    found = re.search(r"release (\d+\.\d+)", version.stdout)
    if version.returncode != 0 or found is None:
        raise BuildError(f"{nvcc} --version does not say its CUDA release", "check cuda_toolkit in devices.toml")
    archs = tuple(sorted(set(re.findall(r"\bsm_\d+[af]?\b", listed.stdout)), key=_sm)) if listed.returncode == 0 else ()
    return found.group(1), archs


def compile_cubin(compiler: CudaCompiler, source: str, arch: str, progress: Callable[[str], None] | None = None) -> bytes:
    """``source`` (CUDA C from TVM's codegen) as a cubin for ``arch``; BuildError with the compiler's log."""
    if compiler.kind == "nvcc":
        return _nvcc_cubin(compiler.source, source, arch)
    return _nvrtc_cubin(compiler.source, source, arch, progress)


def _nvrtc_cubin(wheel_set: str, source: str, arch: str, progress) -> bytes:
    library = library_path(wheel_set, progress=progress)
    try:
        # NVRTC opens its builtins library by name at its first compile; outside a toolkit (a wheel's folder, not on
        # the loader's path) only an already-loaded copy is found (NVRTC 13: "failed to open libnvrtc-builtins.so.13.0")
        for builtins in sorted(library.parent.glob("libnvrtc-builtins.so.*")):
            ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
        nvrtc = ctypes.CDLL(str(library))
    except OSError as exc:
        raise BuildError(f"NVRTC ({wheel_set}) does not load: {exc}",
                         f"remove {library_path(wheel_set).parents[2]} and farm fetches it again") from exc
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    code = NVRTC_PREAMBLE + "\n".join(line for line in source.splitlines() if line.strip() != "#include <cuda.h>")
    program = ctypes.c_void_p()
    _nvrtc_check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(program), code.encode(), b"tvm_kernels.cu", 0, None,
                                                 None), "create a program")
    try:
        options = [f"--gpu-architecture={arch}", f"-I{include_path(wheel_set)}", *NVRTC_OPTIONS]
        if "__int128" in source:
            options.append("--device-int128")
        encoded = [o.encode() for o in options]
        result = nvrtc.nvrtcCompileProgram(program, len(encoded), (ctypes.c_char_p * len(encoded))(*encoded))
        if result != 0:
            size = ctypes.c_size_t()
            nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetProgramLog(program, log)
            raise BuildError(f"NVRTC ({wheel_set}) could not compile TVM's CUDA code for {arch}: "
                             f"{nvrtc.nvrtcGetErrorString(result).decode()}: {_last_error(log.value.decode(errors='replace'))}",
                             "this is TVM's generated code: report it with the model and target")
        size = ctypes.c_size_t()
        _nvrtc_check(nvrtc, nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(size)), "size the cubin")
        cubin = ctypes.create_string_buffer(size.value)
        _nvrtc_check(nvrtc, nvrtc.nvrtcGetCUBIN(program, cubin), "read the cubin")
        return cubin.raw
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))


def _nvrtc_check(nvrtc, result: int, what: str) -> None:
    if result != 0:
        raise BuildError(f"NVRTC could not {what}: {nvrtc.nvrtcGetErrorString(result).decode()}",
                         "this is NVRTC from PyPI: remove farm's cached copy (FARM_CACHE) to fetch it again")


def _last_error(log: str) -> str:
    errors = [line.strip() for line in log.splitlines() if "error" in line]
    return (errors or [line.strip() for line in log.splitlines() if line.strip()] or ["no log"])[0][:300]


def _nvcc_cubin(nvcc: str, source: str, arch: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="farm-nvcc-") as work:
        src, out = Path(work) / "tvm_kernels.cu", Path(work) / "tvm_kernels.cubin"
        src.write_text(source)
        command = [nvcc, "--cubin", f"-arch={arch}", *NVCC_OPTIONS, "-o", str(out), str(src)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not out.exists():
            raise BuildError(f"{shlex.join(command[:3])} … failed: {_last_error(done.stderr)}",
                             "check cuda_toolkit in devices.toml, or leave it out for PyPI's NVRTC")
        return out.read_bytes()


def device_code_for(device: Device, target: dict[str, Any]) -> tuple[CudaCompiler, DeviceCode] | None:
    """For a CUDA target: its compiler and the note its artifact will carry (checked before TVM compiles); None for
    other targets."""
    if target_kind(target) != "cuda":
        return None
    arch = cuda_arch(target)
    compiler = compiler_for(device, arch)
    return compiler, DeviceCode(arch, "cubin", compiler.cuda_version, compiler.label, compiler.min_driver)
