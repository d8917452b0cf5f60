"""The GPU check's preflight: what the lent machine must have before anything slow starts, read in its first seconds
and printed as one block; the first thing missing is one ``error:`` line with a hint (exit 1).

    python3 tools/gpu_preflight.py KIT [--json PATH] [--without-gpu]

Run by ``tools/gpu_check.sh`` with the interpreter the kit's farm will run on (the image's ``python3``, or ``VENV``'s),
before the kit is unpacked. Standard library only: a missing numpy is a line of the block, never a traceback.

What it reads (``gather``) and what it requires (``judge``, literal facts in, verdicts out; tests/test_gpu_kit.py):

=================  ======================================================  ==========================================
check              read from                                               required
=================  ======================================================  ==========================================
interpreter        ``sys.executable``, ``sys.prefix``/``base_prefix``      the Python the kit's wheels are for
                                                                           (``kit.json``'s ``python``)
imports            ``import numpy, onnxruntime`` (torch's metadata)       numpy and onnxruntime
driver             ``libcuda.so.1`` (ctypes), ``cuDriverGetVersion``       found; its CUDA >= ``BUNDLE_CUDA`` (TVM
                                                                           0.27's libtvm_runtime_cuda.so links
                                                                           libcudart.so.13) and >= every artifact's
                                                                           ``cuda_version`` (its note)
GPU                ``cuDeviceGetAttribute`` (compute capability), name     a GPU whose capability runs every
                                                                           artifact's cubin (``runs_cubin``)
memory             ``nvidia-smi --query-gpu=memory.free``                  ``MIN_GPU_FREE_MIB`` where nvidia-smi says
disk               ``shutil.disk_usage`` of the work folder                ``MIN_DISK_FREE_BYTES``
=================  ======================================================  ==========================================

``--without-gpu`` (the tests, on a host with no NVIDIA driver): the driver's, the GPU's and its memory's failures are
printed as warnings and the check goes on, so that everything after the GPU's absence is still proven there.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import asdict, dataclass, field

# TVM 0.27's CUDA runtime (the wheel's libtvm_runtime_cuda.so, which farm's native server loads) links
# libcudart.so.13: whatever CUDA compiled a cubin, the driver must be CUDA 13's (Linux >= 580.65.06)
BUNDLE_CUDA = "13.0"
MIN_DISK_FREE_BYTES = 2 * 2**30  # the kit unpacked and installed (~400 MB) and the venv's bytecode, with room
MIN_GPU_FREE_MIB = 1024  # resnet50's weights, activations and the copy curve's largest buffer (64 MiB) fit well within
GPU_FACTS = ("driver", "gpu", "gpu_memory")  # what --without-gpu lets pass as warnings
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75  # CUDA's cuda.h
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


@dataclass
class Facts:
    """What this machine is, as read (None: could not be read, with the reason in ``notes``)."""

    executable: str
    python: str  # "3.12"
    prefix: str
    base_prefix: str
    imports: dict[str, str | None]  # module -> version, None where it does not import
    import_errors: dict[str, str] = field(default_factory=dict)
    libcuda: str | None = None  # where it loaded from, None where it did not
    driver_cuda: str | None = None  # "13.0" (cuDriverGetVersion)
    driver_version: str | None = None  # "580.159" (nvidia-smi)
    gpu_name: str | None = None
    compute_capability: str | None = None  # "9.0"
    gpu_free_mib: int | None = None
    disk_free_bytes: int = 0
    disk_path: str = ""
    notes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    check: str
    ok: bool
    line: str  # the block's line
    error: str = ""
    hint: str = ""


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def runs_cubin(compute_capability: str, arch: str) -> bool:
    """Whether a GPU of ``compute_capability`` ("9.0") runs a cubin for ``arch`` ("sm_90"): a cubin runs on its own
    major version at its minor or a later one (NVIDIA's CUDA C++ Programming Guide, "Binary Compatibility")."""
    major, minor = (int(p) for p in compute_capability.split("."))
    digits = arch.removeprefix("sm_").rstrip("af")
    return (int(digits[:-1]), int(digits[-1])) <= (major, minor) and int(digits[:-1]) == major


def read_kit(path: str) -> dict:
    """``kit.json`` from the kit's tar (``tools/gpu_kit.py`` writes it first), without unpacking the rest."""
    with tarfile.open(path) as tar:
        member = tar.extractfile("kit.json")
        if member is None:
            raise KeyError("kit.json")
        return json.loads(member.read())


def gather(work_dir: str) -> Facts:
    facts = Facts(sys.executable, f"{sys.version_info.major}.{sys.version_info.minor}", sys.prefix, sys.base_prefix,
                  {})
    for module in ("numpy", "onnxruntime"):
        try:
            facts.imports[module] = str(getattr(importlib.import_module(module), "__version__", "?"))
        except Exception as exc:  # noqa: BLE001  # any failure to import is a fact to print, never a traceback
            facts.imports[module] = None
            facts.import_errors[module] = f"{type(exc).__name__}: {exc}"
    try:  # torch's version from its metadata: importing it (with CUDA) would cost seconds, and no kit model needs it
        facts.imports["torch"] = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        facts.imports["torch"] = None
    _read_driver(facts)
    _read_nvidia_smi(facts)
    os.makedirs(work_dir, exist_ok=True)
    facts.disk_path, facts.disk_free_bytes = work_dir, shutil.disk_usage(work_dir).free
    return facts


def _read_driver(facts: Facts) -> None:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        facts.notes["driver"] = str(exc)
        return
    facts.libcuda = getattr(cuda, "_name", "libcuda.so.1")
    version = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
        facts.driver_cuda = f"{version.value // 1000}.{version.value % 1000 // 10}"
    if (code := cuda.cuInit(0)) != 0:
        facts.notes["gpu"] = f"cuInit failed with CUDA error {code}"
        return
    count, device = ctypes.c_int(0), ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        facts.notes["gpu"] = "the driver sees no GPU"
        return
    major, minor, name = ctypes.c_int(0), ctypes.c_int(0), ctypes.create_string_buffer(256)
    cuda.cuDeviceGet(ctypes.byref(device), 0)
    cuda.cuDeviceGetAttribute(ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
    cuda.cuDeviceGetName(name, 256, device)
    facts.compute_capability, facts.gpu_name = f"{major.value}.{minor.value}", name.value.decode(errors="replace")


def _read_nvidia_smi(facts: Facts) -> None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        facts.notes["gpu_memory"] = "no nvidia-smi on PATH"
        return
    try:
        said = subprocess.run([smi, "--query-gpu=driver_version,memory.free", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20, check=True).stdout.splitlines()[0]
        driver, free = (part.strip() for part in said.split(","))
        facts.driver_version, facts.gpu_free_mib = driver, int(float(free))
    except (subprocess.SubprocessError, OSError, IndexError, ValueError) as exc:
        facts.notes["gpu_memory"] = f"nvidia-smi did not answer: {exc}"


def judge(facts: Facts, kit: dict) -> list[Verdict]:
    """Each check's verdict, in the block's order."""
    verdicts = [Verdict("interpreter", facts.python == kit["python"],
                        f"{facts.executable} (Python {facts.python}; prefix {facts.prefix}, base {facts.base_prefix})",
                        f"the kit's wheels are for Python {kit['python']}, this interpreter is Python {facts.python}",
                        f"rebuild the kit for this Python (tools/gpu_kit.py's PYTHON), or run with "
                        f"PYTHON=/path/to/python{kit['python']}")]
    for module in ("numpy", "onnxruntime"):
        version = facts.imports.get(module)
        verdicts.append(Verdict(module, version is not None, version or f"missing ({facts.import_errors.get(module)})",
                                f"{module} does not import in {facts.executable}: {facts.import_errors.get(module)}",
                                "run with the Python that has numpy and onnxruntime (PYTHON=..., or VENV=...)"))
    torch = facts.imports.get("torch")
    verdicts.append(Verdict("torch", True, torch or "not installed (no kit model needs it)"))
    verdicts.append(_judge_driver(facts, kit))
    verdicts.append(_judge_gpu(facts, kit))
    free = facts.gpu_free_mib
    verdicts.append(Verdict("gpu_memory", free is not None and free >= MIN_GPU_FREE_MIB,
                            f"{free} MiB free" if free is not None else f"unknown ({facts.notes.get('gpu_memory')})",
                            f"GPU memory: {facts.notes.get('gpu_memory')}" if free is None else
                            f"only {free} MiB of GPU memory free (needs {MIN_GPU_FREE_MIB})",
                            "check nvidia-smi for other processes on the GPU"))
    verdicts.append(Verdict("disk", facts.disk_free_bytes >= MIN_DISK_FREE_BYTES,
                            f"{facts.disk_free_bytes / 2**30:.1f} GiB free in {facts.disk_path}",
                            f"only {facts.disk_free_bytes / 2**30:.1f} GiB free in {facts.disk_path} "
                            f"(needs {MIN_DISK_FREE_BYTES / 2**30:.0f})", "free disk space, or set TMPDIR elsewhere"))
    return verdicts


def _judge_driver(facts: Facts, kit: dict) -> Verdict:
    needed = max([kit["bundle_cuda"], *(a["cuda_version"] for a in kit["artifacts"] if a.get("cuda_version"))],
                 key=version_tuple)
    said = f"needs CUDA {needed}: TVM's CUDA runtime links libcudart.so.{kit['bundle_cuda'].split('.')[0]}" + "".join(
        f"; {a['model']}'s cubin CUDA {a['cuda_version']}" for a in kit["artifacts"])
    if facts.libcuda is None:
        return Verdict("driver", False, f"libcuda.so.1 not found ({facts.notes.get('driver')}); {said}",
                       f"no NVIDIA driver: libcuda.so.1 does not load ({facts.notes.get('driver')})",
                       "run the check on a host with the NVIDIA driver (CUDA 13: Linux driver >= 580.65.06)")
    version = facts.driver_cuda or "unknown"
    line = f"{facts.libcuda}: driver {facts.driver_version or '?'}, CUDA {version}; {said}"
    if facts.driver_cuda is None or version_tuple(facts.driver_cuda) < version_tuple(needed):
        return Verdict("driver", False, line, f"the driver's CUDA is {version}, older than the CUDA {needed} the kit needs",
                       "use a host whose driver is CUDA 13's (Linux >= 580.65.06): TVM 0.27's CUDA runtime links "
                       "libcudart.so.13 (docs/devices.md, 'Which NVIDIA devices can run')")
    return Verdict("driver", True, line)


def _judge_gpu(facts: Facts, kit: dict) -> Verdict:
    archs = sorted({a["arch"] for a in kit["artifacts"]})
    if facts.compute_capability is None:
        reason = facts.notes.get("gpu") or facts.notes.get("driver") or "no driver"
        return Verdict("gpu", False, f"unknown ({reason}); artifacts: {', '.join(archs)}", f"no GPU: {reason}",
                       "run the check on a host with an NVIDIA GPU")
    line = f"{facts.gpu_name}, compute capability {facts.compute_capability}; artifacts: {', '.join(archs)}"
    wrong = [arch for arch in archs if not runs_cubin(facts.compute_capability, arch)]
    if wrong:
        return Verdict("gpu", False, line, f"the GPU (compute capability {facts.compute_capability}) cannot run "
                       f"cubins for {', '.join(wrong)}",
                       f"rebuild the kit for this GPU: set tools/gpu_kit.py's ARCH to sm_"
                       f"{facts.compute_capability.replace('.', '')}")
    return Verdict("gpu", True, line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kit", help="the kit (build/gpu-kit.tar.gz)")
    parser.add_argument("--work", default=os.environ.get("TMPDIR", "/tmp"), help="where the kit is unpacked")
    parser.add_argument("--json", help="write the facts and verdicts here")
    parser.add_argument("--without-gpu", action="store_true",
                        help="the driver's, GPU's and GPU memory's failures are warnings (a test host has no GPU)")
    args = parser.parse_args(argv)
    try:
        kit = read_kit(args.kit)
    except (OSError, KeyError, tarfile.TarError, ValueError) as exc:
        print(f"error: {args.kit} is not a GPU kit with a kit.json ({exc})")
        print("hint: build it where farm is set up: .venv/bin/python tools/gpu_kit.py")
        return 1
    facts = gather(args.work)
    verdicts = judge(facts, kit)
    for verdict in verdicts:
        mark = "ok" if verdict.ok else ("WARN" if args.without_gpu and verdict.check in GPU_FACTS else "MISSING")
        print(f"  {verdict.check:<12} {mark:<8} {verdict.line}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"facts": asdict(facts), "verdicts": [asdict(v) for v in verdicts], "kit": kit}, out, indent=1)
    failed = [v for v in verdicts if not v.ok]
    for verdict in failed:
        if args.without_gpu and verdict.check in GPU_FACTS:
            print(f"warning: {verdict.error} (--without-gpu: going on)")
    stop = [v for v in failed if not (args.without_gpu and v.check in GPU_FACTS)]
    if stop:
        print(f"error: {stop[0].error}")
        print(f"hint: {stop[0].hint}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
