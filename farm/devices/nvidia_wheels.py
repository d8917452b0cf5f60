"""NVIDIA's CUDA libraries as PyPI ships them, fetched once into ``$FARM_CACHE``: CUDA 12's and 13's NVRTC (with
the CCCL headers TVM's kernels include) for compiling device code, CUDA 13's ``libcudart`` for TVM's CUDA runtime.

No CUDA toolkit is needed on the build host: each set is ``pip install --target`` of pinned wheels into a folder of
its own (``nvidia-<name>-<arch>-r<recipe>``), built beside its place and renamed into it (``cache.building``), so a
killed download leaves nothing half-made. ``python -m farm.devices.nvidia_wheels`` fetches them (tools/setup.sh).

Why two CUDA versions: NVRTC 13 returns ``NVRTC_ERROR_INVALID_OPTION`` for sm_62 (TX2) and sm_72 (Xavier), which
CUDA 13 dropped; CUDA 12.9's NVRTC compiles sm_50 to sm_90 (checked 2026-11-28 with 12.9.86 and 13.5.37).
"""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from farm.devices.cache import building, cache_root, setup_step
from farm.errors import DeviceError

RECIPE = 1  # bump when a set's packages or layout change


@dataclass(frozen=True)
class WheelSet:
    """Pinned wheels installed together, and where their files lie inside the install folder."""

    name: str  # "nvrtc-12", "nvrtc-13", "cudart-13"
    cuda_version: str  # the CUDA release these wheels are ("12.9")
    packages: tuple[str, ...]  # pip requirements, pinned
    lib_dir: str  # the shared libraries, relative to the install folder
    library: str  # the library farm opens
    include_dir: str = ""  # headers a device compile needs ('' = none)


WHEEL_SETS = {
    "nvrtc-12": WheelSet("nvrtc-12", "12.9", ("nvidia-cuda-nvrtc-cu12==12.9.86", "nvidia-cuda-cccl-cu12==12.9.27"),
                         "nvidia/cuda_nvrtc/lib", "libnvrtc.so.12", "nvidia/cuda_cccl/include"),
    "nvrtc-13": WheelSet("nvrtc-13", "13.0", ("nvidia-cuda-nvrtc==13.0.88", "nvidia-cuda-cccl==13.0.85"),
                         "nvidia/cu13/lib", "libnvrtc.so.13", "nvidia/cu13/include/cccl"),
    "cudart-13": WheelSet("cudart-13", "13.0", ("nvidia-cuda-runtime==13.0.96",), "nvidia/cu13/lib", "libcudart.so.13"),
}


def wheel_folder(name: str, arch: str = "x86_64") -> Path:
    return cache_root() / f"nvidia-{name}-{arch}-r{RECIPE}"


def ensure_wheels(name: str, arch: str = "x86_64", progress=None) -> Path:
    """The install folder of wheel set ``name`` for ``arch`` ("x86_64" = this host, "aarch64"), fetched on first use
    (pip, from the registry or its configured mirror); DeviceError with pip's last line when it cannot be had."""
    wheels = WHEEL_SETS[name]
    folder = wheel_folder(name, arch)
    if (folder / wheels.lib_dir / wheels.library).exists():
        return folder
    if progress:
        progress(f"fetching CUDA {wheels.cuda_version}'s {', '.join(wheels.packages)} for {arch} from PyPI")
    with building(folder, f"nvidia-{name}-") as work:
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(work),
                   *(["--only-binary=:all:", "--platform", f"manylinux2014_{arch}"] if arch != "x86_64" else []),
                   *wheels.packages]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not (work / wheels.lib_dir / wheels.library).exists():
            said = (done.stderr.strip().splitlines() or [f"no {wheels.library} in {wheels.lib_dir}"])[-1]
            raise DeviceError(f"could not fetch CUDA {wheels.cuda_version}'s wheels ({' '.join(wheels.packages)}): "
                              f"{said}", "farm needs PyPI (or a mirror pip is configured for) once; then they are "
                              f"cached in {folder.parent}")
    return folder


def library_path(name: str, arch: str = "x86_64", progress=None) -> Path:
    """The library wheel set ``name`` provides (``libnvrtc.so.12``, ``libcudart.so.13``), fetched on first use."""
    wheels = WHEEL_SETS[name]
    return ensure_wheels(name, arch, progress) / wheels.lib_dir / wheels.library


def include_path(name: str, arch: str = "x86_64", progress=None) -> Path:
    """The headers wheel set ``name`` provides for a device compile (CCCL's ``cuda/std``)."""
    return ensure_wheels(name, arch, progress) / WHEEL_SETS[name].include_dir


def main() -> int:
    """Fetch every set for this host, as tools/setup.sh does."""
    for name in WHEEL_SETS:
        if (code := setup_step(f"CUDA wheels {name}", functools.partial(ensure_wheels, name, progress=print))) != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
