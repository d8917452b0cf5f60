"""``cuda`` devices: this host's NVIDIA GPU behind farm's native server with TVM's CUDA runtime.

``farm serve`` starts the CUDA bundle of farm's native server (``native.ensure_native_server(cuda=True)``: the wheel's
``libtvm_runtime_cuda.so`` and PyPI's ``libcudart.so.13`` beside it; ``libcuda.so.1`` is the driver's). No Python
runs on the device side, so the artifact must carry compiled device code: farm compiles CUDA targets to cubins
(``compile/cuda.py``). The host code runs on this host's CPU: the host target defaults to llvm with its CPU; a host
that runs artifacts compiled elsewhere names it (``host = { kind = "llvm" }``), so both compute one artifact key.

Where the driver is missing, the server still starts and refuses CUDA sessions with the reason; ``farm devices
--kinds`` says what this host lacks.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from farm.devices.kind import Fail, Field, GpuHere, thread_options
from farm.records import Device, TrackerAddress, target_kind
from farm.procs.registry import ManagedProcess

DRIVER = "libcuda.so.1"
# TVM 0.27's CUDA runtime as the apache-tvm wheels ship it, x86-64 and aarch64 alike (read from both 0.27.0.post1
# wheels, 2026-11-29): libtvm_runtime_cuda.so NEEDS libcudart.so.13 and calls cuLaunchKernelEx, so it runs only where
# the driver is CUDA 13's or newer (Linux >= 580.65.06), whatever CUDA compiled the cubin. A TX2 (JetPack 4.6: CUDA
# 10.2) or an Orin on JetPack 6 (CUDA 12.x) needs that runtime built from TVM's sources against its own CUDA
# (docs/devices.md, "Which NVIDIA devices can run").
RUNTIME_CUDA = "13.0"


def runtime_refusal(device: Device) -> tuple[str, str] | None:
    """Why ``device`` cannot run TVM's CUDA runtime as shipped, and what to do (None where it can, or where its
    inventory does not say its driver's CUDA: ``cuda_driver``)."""
    driver = device.options.get("cuda_driver")
    if driver is None or target_kind(device.target) != "cuda" or _version(driver) >= _version(RUNTIME_CUDA):
        return None
    return (f"device {device.name!r}: its driver is CUDA {driver} (cuda_driver in the inventory), and TVM 0.27's CUDA "
            f"runtime as shipped (libtvm_runtime_cuda.so, linked to libcudart.so.13) needs a driver of CUDA "
            f"{RUNTIME_CUDA} or newer",
            f"farm compile still works for it (its cubins load on CUDA {driver}'s driver); to run them, build TVM's "
            f"CUDA runtime from source against CUDA {driver}, or move the device to a driver of CUDA "
            f"{RUNTIME_CUDA} (docs/devices.md, 'Which NVIDIA devices can run')")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in str(text).split("."))


def driver_missing() -> str:
    """Why this host's NVIDIA driver cannot be loaded ('' when it can)."""
    try:
        ctypes.CDLL(DRIVER)
    except OSError as exc:
        return f"{exc} (the NVIDIA driver is not installed here)"
    return ""


class Cuda(GpuHere):
    name = "cuda"
    summary = "this host's NVIDIA GPU, served by farm's native server with TVM's CUDA runtime (no Python there)"
    serve_help = ("farm's native server with the wheel's libtvm_runtime_cuda.so and PyPI's libcudart beside it; "
                  "artifacts carry cubins compiled by farm compile (NVRTC from PyPI, or the device's cuda_toolkit)")
    fields = {"server_port": Field("port", "server_port = 9095, or leave it out for a free one", "the server's port")}
    example = 'key = "h100"\ntarget = { kind = "cuda", arch = "sm_90" }'

    def validate(self, raw: dict[str, Any], target: dict[str, Any], fail: Fail) -> None:
        if target_kind(target) != "cuda":
            raise fail("target", f"kind {target_kind(target)!r} is not CUDA",
                       'a cuda device runs CUDA kernels: write target = { kind = "cuda", arch = "sm_90" } '
                       "(the GPU's compute capability)")
        super().validate(raw, target, fail)

    def bring_up(self, device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
        from farm.devices.native import ensure_native_server, start_native_server

        return [start_native_server(ensure_native_server(cuda=True), tracker, device.name, device.key, state_dir,
                                    port=device.options.get("server_port"), options=thread_options(device))]

    def prerequisites(self) -> str:
        return driver_missing()
