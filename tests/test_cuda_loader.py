"""TVM's own CUDA loader reads farm's bytes, without a GPU (#60).

farm swaps the CUDA source in TVM's packed module for a cubin (``tvm_private.rewrite_cuda_code``). Here the apache-tvm
wheel's real ``libtvm_runtime_cuda.so`` (the one farm's native CUDA server loads) parses a library farm compiled:
its ``ffi.Module.load_from_bytes.cuda`` reads the format, the function table and the code.

What this proves: TVM's parser accepts farm's layout; the format it reads is ``cubin``; the code it holds is exactly
the cubin in the library's bytes (an ELF for NVIDIA's machine, of the device's arch); its function table names every
kernel the cubin defines and nothing else.

What it does not prove: that a driver accepts the cubin (``cuModuleLoadData``, first called at a kernel's first
launch), that the arch suits a GPU (TVM's loader never reads it: farm's own check, tools/gpu_preflight.py, and the
driver's at load), or that a kernel launches with the right parameters. Those need the GPU check on a real GPU.

The library's NEEDED ``libcuda.so.1`` is a minimal one built here that exports the driver symbols the runtime imports
and answers CUDA_ERROR_NO_DEVICE to each; cudart is the bundle's (RUNPATH ``$ORIGIN``). TVM hides a failed backend
load (``tvm.backend.cuda`` catches it), so the test loads the runtime itself and a second run without the stand-in
driver shows that no other loader parses the library.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from farm.devices.native import CUDA_RUNTIME, ensure_native_server
from farm.tvm_private import runtime_only_env
from tests.conftest import run_farm

# The driver symbols the wheel's libtvm_runtime_cuda.so imports (nm -D --undefined-only)
DRIVER_SYMBOLS = ("cuDeviceGetName", "cuFuncSetAttribute", "cuGetErrorName", "cuGetErrorString", "cuLaunchKernelEx",
                  "cuModuleGetFunction", "cuModuleLoadData", "cuModuleUnload", "cuTensorMapEncodeTiled")
CUDA_ERROR_NO_DEVICE = 100

LOAD = r"""
import ctypes, json, sys
import tvm
library, runtime = sys.argv[1], sys.argv[2]
said = {}
if runtime:
    ctypes.CDLL(runtime, mode=ctypes.RTLD_LOCAL)  # an OSError here fails the test: nothing hides it
said["loader"] = tvm.get_global_func("ffi.Module.load_from_bytes.cuda", allow_missing=True) is not None
try:
    module = tvm.runtime.load_module(library)
except Exception as exc:
    said["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(said)); sys.exit(0)
def tree(m):
    yield m
    for each in m.imports:
        yield from tree(each)
(cuda,) = [m for m in tree(module) if m.kind == "cuda"]
said["tree"] = [m.kind for m in tree(module)]
try:  # TVM hands the code back as a string; a cubin is not UTF-8, and the decoding error carries its bytes
    said["cubin"] = cuda.inspect_source("cubin").encode().hex()
except UnicodeDecodeError as exc:
    said["cubin"] = exc.object.hex()
said["cuda_source"] = cuda.inspect_source("cuda")
names = json.loads(sys.argv[3])
said["functions"] = {name: cuda.implements_function(name) for name in names + ["no_such_kernel"]}
print(json.dumps(said))
"""


def _stand_in_driver(folder: Path) -> Path:
    """``libcuda.so.1`` exporting ``DRIVER_SYMBOLS``, each answering CUDA_ERROR_NO_DEVICE."""
    source = folder / "libcuda.c"
    source.write_text("".join(f"int {name}(void) {{ return {CUDA_ERROR_NO_DEVICE}; }}\n" for name in DRIVER_SYMBOLS))
    library = folder / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(library), str(source)],
                   check=True, timeout=60)
    return library


def _cubin_at(data: bytes) -> tuple[int, int]:
    """Where the library's cubin starts and its length: an ELF64 whose machine is EM_CUDA, as far as its furthest
    section, section header or program header reaches (read from its own headers, not from TVM's format)."""
    at = data.find(b"\x7fELF\x02\x01", 1)
    while at != -1 and int.from_bytes(data[at + 18:at + 20], "little") != 190:
        at = data.find(b"\x7fELF\x02\x01", at + 1)
    assert at != -1, "no cubin in the library"

    def number(offset: int, size: int) -> int:
        return int.from_bytes(data[at + offset:at + offset + size], "little")

    phoff, shoff = number(32, 8), number(40, 8)
    phentsize, phnum, shentsize, shnum = number(54, 2), number(56, 2), number(58, 2), number(60, 2)
    ends = [phoff + phentsize * phnum, shoff + shentsize * shnum]
    for i in range(shnum):
        header = shoff + i * shentsize
        if number(header + 4, 4) != 8:  # SHT_NOBITS takes no bytes in the file
            ends.append(number(header + 24, 8) + number(header + 32, 8))
    return at, max(ends)


def _kernels(cubin: bytes) -> list[str]:
    """The kernels a cubin defines: its ``.text.<kernel>`` sections, from its own section-name table."""
    shoff = int.from_bytes(cubin[40:48], "little")
    shentsize, shnum, shstrndx = (int.from_bytes(cubin[o:o + 2], "little") for o in (58, 60, 62))

    def section(i: int) -> tuple[int, int, int]:
        base = shoff + i * shentsize
        return (int.from_bytes(cubin[base:base + 4], "little"), int.from_bytes(cubin[base + 24:base + 32], "little"),
                int.from_bytes(cubin[base + 32:base + 40], "little"))

    _, names_at, _ = section(shstrndx)
    found = []
    for i in range(shnum):
        name_at = names_at + section(i)[0]
        name = cubin[name_at:cubin.index(b"\0", name_at)].decode()
        if name.startswith(".text."):
            found.append(name[len(".text."):])
    return sorted(found)


@pytest.fixture(scope="module")
def farm_cuda_library(tmp_path_factory):
    work = tmp_path_factory.mktemp("cuda-loader")
    inventory = work / "devices.toml"
    inventory.write_text('[devices.h200]\nkind = "remote"\nkey = "h200"\ntarget = { kind = "cuda", arch = "sm_90" }\n'
                         'host = { kind = "llvm" }\n')
    done = run_farm("--devices", str(inventory), "compile", "--device", "h200", "--model", "mlp", "--untuned",
                    "--json", env={"FARM_HOME": str(work / "home")})
    assert done.returncode == 0, done.stderr
    return Path(json.loads(done.stdout)[0]["path"]), work


def _load(library: Path, runtime: str, driver_dir: Path | None, kernels: list[str]) -> dict:
    bundle = ensure_native_server(cuda=True).parent  # TVM's CUDA runtime with cudart beside it
    env = {**runtime_only_env(), "PATH": "/usr/bin:/bin",
           "LD_LIBRARY_PATH": ":".join(str(p) for p in (driver_dir, bundle) if p is not None)}
    done = subprocess.run([sys.executable, "-c", LOAD, str(library), runtime, json.dumps(kernels)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_tvm_s_own_cuda_loader_parses_farm_s_cubin_library(farm_cuda_library):
    library, work = farm_cuda_library
    data = library.read_bytes()
    at, size = _cubin_at(data)
    cubin = data[at:at + size]
    kernels = _kernels(cubin)
    assert kernels, "the cubin defines no kernel"
    driver = _stand_in_driver(work).parent
    runtime = str(ensure_native_server(cuda=True).parent / CUDA_RUNTIME)
    said = _load(library, runtime, driver, kernels)
    assert said["loader"] is True and "error" not in said, said
    assert said["tree"] == ["relax.VMExecutable", "library", "cuda"]  # TVM's CUDAModuleNode, under the host library
    assert bytes.fromhex(said["cubin"]) == cubin  # the code TVM holds is the library's cubin, byte for byte
    assert said["cuda_source"] == ""  # format "cubin": no source to compile at load
    assert said["functions"] == {**{k: True for k in kernels}, "no_such_kernel": False}  # the table: exactly these


def test_without_the_cuda_runtime_nothing_else_parses_it(farm_cuda_library):
    """The control: TVM's own import of its CUDA backend fails quietly without a driver, and then no loader reads
    the library, so the test above is TVM's CUDA runtime at work."""
    library, _ = farm_cuda_library
    said = _load(library, "", None, [])
    assert said["loader"] is False
    assert "load_from_bytes.cuda" in said["error"]
