"""What a measurement carries beside its numbers: the device type per target kind, the clock its steady timer
reads, the session's CPU threads, farm's helper functions on the device's server, and the measurement context."""

from __future__ import annotations

import time
from typing import Any

import tvm

import farm
from farm.devices import kind_of
from farm.measure.manifest import run_manifest
from farm.records import CPU_TARGETS, TARGET_KINDS, Artifact, Device, Threads

DEVICE_TYPE = {target: "cpu" if target in CPU_TARGETS else target for target in TARGET_KINDS}  # a GPU kind's type: its name
# What TVM's time_evaluator measures per device type: OpenCL sums kernel events (no launch overhead, no gaps)
STEADY_CLOCK = {"cpu": "wall", "opencl": "kernel"}
SERVER_HELPERS = ("farm.WallTimeEvaluator", "farm.ClearKernelCache", "farm.MemoryStats",
                  "farm.ThreadsSet", "farm.KernelProfile", "farm.ServerBuild")  # farm's servers have them
THREADS_BY_FARM = "farm's server (TVM_NUM_THREADS)"
THREADS_BY_ENV = "farm, in the stock server's environment (TVM_NUM_THREADS)"
THREADS_NOT_SET = "threads not set by farm: the server's own default (a stock TVM server)"


def measurement_context(device: Device, artifact: Artifact) -> dict[str, Any]:
    """What a number needs beside it to be trusted later; the device's kind adds what it can tell (this host's
    CPU, load and sensors for devices on this host)."""
    context: dict[str, Any] = {
        "farm_version": farm.__version__, "tvm_version": tvm.__version__, "target": artifact.target,
        "artifact_digest": artifact.file_digest, "export": artifact.export, "toolchain": artifact.toolchain,
        "pipeline_version": artifact.pipeline_version,
        "device_kind": device.kind, "emulated": device.emulated, "thermal": None,
    }
    started = time.perf_counter()
    context["manifest"] = run_manifest(device, artifact)
    context["manifest_s"] = time.perf_counter() - started  # its cost in the cell (docs/benchmarks.md "What changed")
    return {**context, **kind_of(device).measurement_context(device)}


def session_threads(session, helpers: dict[str, Any], device: Device) -> Threads:
    """The CPU threads TVM uses in this session, as the device reports them (``runtime.NumThreads``, never assumed),
    and who set them: farm's server (``farm.ThreadsSet``), farm through a stock server's environment (the device's
    kind starts it so: ``DeviceKind.threads_by_env``), or the server's own default."""
    count = int(session.get_function("runtime.NumThreads")())
    if "farm.ThreadsSet" in helpers:
        return Threads(count, THREADS_BY_FARM)
    return Threads(count, THREADS_BY_ENV if kind_of(device).threads_by_env else THREADS_NOT_SET)


def server_helpers(session) -> dict[str, Any]:
    """farm's own server functions, where the device's server has them (farm.rpc.server)."""
    found = {}
    for name in SERVER_HELPERS:
        try:
            found[name] = session.get_function(name)
        except AttributeError:  # a stock TVM server: no such function
            pass
    return found
