"""``opencl`` devices: this host's OpenCL implementation (a GPU driver, or POCL on the CPU) behind
farm's server with TVM's OpenCL runtime (``opencl_runtime.py``) loaded.

``farm serve`` starts ``python -m farm.rpc.server`` for the device with the runtime and a kernel
cache folder of its own, so a measurement can clear it for a cold first run. The host code runs on
this host's CPU: the host target defaults to llvm with the detected CPU.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from farm.devices.kind import Fail, Field, GpuHere, thread_options
from farm.devices.opencl_runtime import ensure_runtime, missing
from farm.records import Device, TrackerAddress, target_kind
from farm.procs.registry import ManagedProcess
from farm.rpc.launch import start_server

log = logging.getLogger(__name__)

# What `farm demo` adds when this host can serve OpenCL: POCL here, a GPU driver elsewhere.
DEMO_DEVICE = """
[devices.opencl-gpu]
kind = "opencl"
key = "demo-opencl"
target = { kind = "opencl" }
fallback = "cpu"
tags = ["demo", "opencl", "gpu-api"]
"""


class OpenCL(GpuHere):
    name = "opencl"
    summary = "this host's OpenCL implementation (a GPU driver, or POCL on the CPU)"
    serve_help = ("farm's server with TVM's OpenCL runtime, built from TVM's sources on first use, and a kernel "
                  "cache of its own that a measurement clears for a cold run")
    fields = {
        "server_port": Field("port", "server_port = 9095, or leave it out for a free one", "the server's port"),
        "runtime": Field("text", 'runtime = "/path/to/libtvm_runtime_opencl.so", or leave it out and farm builds '
                         "TVM's OpenCL runtime", "TVM's OpenCL runtime library to load (default: built by farm)"),
    }
    example = 'key = "pocl"\ntarget = { kind = "opencl" }'

    def validate(self, raw: dict[str, Any], target: dict[str, Any], fail: Fail) -> None:
        if target_kind(target) != "opencl":
            raise fail("target", f"kind {target_kind(target)!r} is not OpenCL",
                       'an opencl device runs OpenCL kernels: write target = { kind = "opencl" } (device = "mali" etc. allowed)')
        super().validate(raw, target, fail)

    def bring_up(self, device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
        library = Path(device.options["runtime"]) if "runtime" in device.options else \
            ensure_runtime(progress=lambda msg: log.warning("%s: %s", device.name, msg))
        kernel_cache = state_dir / f"kernel-cache-{device.name}"
        return [start_server(tracker, device.name, device.key, state_dir, port=device.options.get("server_port"),
                             options=("--load-library", str(library), "--kernel-cache", str(kernel_cache),
                                      *thread_options(device)))]

    def prerequisites(self) -> str:
        return missing()

    def demo_entry(self) -> str:
        return "" if missing() else DEMO_DEVICE
