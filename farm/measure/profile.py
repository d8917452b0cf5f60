"""Where the time goes: a model's per-kernel profile on the device, in runs of its own after the timed ones.

TVM 0.27 has no VM profiler (no ``profile=True``, no ``tvm.runtime.profiling``); the Relax VM's ``set_instrument``
calls a function around every call of ``main``. Over RPC that would be a round trip per call, so the instrument runs
in the server's own process: farm's servers offer ``farm.KernelProfile(module, dev_type, dev_id, runs, *inputs)``
(``farm/rpc/server.py``), which loads the module's VM there, times each call between device syncs, and returns the
table as JSON. A stock TVM server has no such helper: the profile is then "not available", and nothing else of the run
changes.

Each kernel is named as TVM names it and put in an op class by its name (``op_class``); ``vm.builtin.*`` calls are
the VM's own (allocations, shape checks, tuples). The kernels' sum is set against ``main``'s time in the same runs:
the rest is the VM's overhead, and the instrument's own (a device sync and two clock reads per call).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm

from farm.errors import FarmError, message_line
from farm.measure.context import DEVICE_TYPE
from farm.records import Artifact, BenchConfig, Device, TrackerAddress, target_kind
from farm.measure.vm import remote_device_type, remove_quietly
from farm.rpc.session import request_session

log = logging.getLogger(__name__)

PROFILE_RUNS = 10  # runs of main the profile averages (after one not counted)
HELPER = "farm.KernelProfile"
VM_CALL = "vm.builtin."  # the VM's own calls: allocations, shape checks, tuples
# Op classes by the words of a kernel's name (TVM's: ``fused_conv2d_add_relu``, ``max_pool2d``, ``concatenate2``), first
# class with a word wins: a fused conv2d_add_relu is a conv. A word matches with a dimension or counter after it
# (conv2d, pool2d, matmul1); not inside another word (erfinv is no erf).
OP_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("conv", ("conv",)),
    ("matmul/dense", ("matmul", "dense", "gemm", "linear", "batch")),
    ("pool", ("pool",)),
    ("layout/copy/concat", ("concat", "concatenate", "transpose", "reshape", "layout", "copy", "split", "strided",
                            "take", "squeeze", "expand", "pad", "broadcast", "flatten", "stack", "gather")),
    ("reduction", ("sum", "mean", "max", "min", "softmax", "norm", "reduce", "argmax", "argmin", "prod")),
    ("elementwise", ("add", "multiply", "subtract", "divide", "relu", "sigmoid", "tanh", "exp", "clip", "cast",
                     "sqrt", "power", "erf", "gelu", "where", "negative", "log", "maximum", "minimum")),
)
_WORD = re.compile(r"([a-z]+)(?:\d+d?\d*)?")


def op_class(name: str) -> str:
    """A kernel's op class by its name: conv, matmul/dense, pool, layout/copy/concat, reduction, elementwise, other;
    the VM's own calls are "vm"."""
    if name.startswith(VM_CALL):
        return "vm"
    words = {m.group(1) for part in name.lower().split("_") if (m := _WORD.fullmatch(part))}
    return next((label for label, keys in OP_CLASSES if words & set(keys)), "other")


@dataclass(frozen=True)
class KernelTime:
    name: str
    op_class: str
    calls: float  # per run of main
    time_s: float  # per run of main


@dataclass(frozen=True)
class KernelProfile:
    """A run's per-kernel profile, or why there is none (``status`` "not available")."""

    status: str  # "ok" | "not available"
    reason: str = ""
    clock: str = ""  # what timed each call
    runs: int = 0
    main_s: float = 0.0  # one run of main, instrumented (the calls and what lies between them)
    kernels: tuple[KernelTime, ...] = ()

    @property
    def kernel_sum_s(self) -> float:
        return sum(k.time_s for k in self.kernels if k.op_class != "vm")

    def by_class(self) -> dict[str, float]:
        """Seconds per run by op class, largest first."""
        totals: dict[str, float] = {}
        for kernel in self.kernels:
            totals[kernel.op_class] = totals.get(kernel.op_class, 0.0) + kernel.time_s
        return dict(sorted(totals.items(), key=lambda item: -item[1]))

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "clock": self.clock, "runs": self.runs,
                "main_s": self.main_s, "kernel_sum_s": self.kernel_sum_s, "by_class_s": self.by_class(),
                "kernels": [vars(k) for k in sorted(self.kernels, key=lambda k: -k.time_s)]}


def parse_profile(text: str) -> KernelProfile:
    """The helper's JSON (``farm.KernelProfile``) as a KernelProfile."""
    said = json.loads(text)
    runs = int(said["runs"])
    kernels = tuple(KernelTime(str(k["name"]), op_class(str(k["name"])), float(k["calls"]) / runs,
                               float(k["time_s"]) / runs) for k in said["kernels"])
    return KernelProfile("ok", "", str(said["clock"]), runs, float(said["main_s"]) / runs, kernels)


def profile_kernels(tracker: TrackerAddress, device: Device, artifact: Artifact, inputs: dict[str, np.ndarray],
                    config: BenchConfig, runs: int = PROFILE_RUNS) -> KernelProfile:
    """``artifact``'s per-kernel profile on ``device``, in a session of its own (after the timed runs: it never moves
    them). A server without farm's helper, or a failure, is a profile "not available" with the reason."""
    session = None
    name = f"farm-profile-{os.path.basename(artifact.path)}"
    try:
        session = request_session(tracker, device.key, config.timeout_s, device.session_timeout_s)
        try:
            helper = session.get_function(HELPER)
        except Exception:  # TVM raises when the remote has no such global
            return KernelProfile("not available", f"the device's server has no {HELPER} (a stock TVM server): "
                                 "farm's servers (farm serve) have it")
        session.upload(artifact.path, name)
        dev = session.device(DEVICE_TYPE[target_kind(artifact.target)], 0)
        args = [tvm.runtime.tensor(value, dev) for value in inputs.values()]
        return parse_profile(helper(session.load_module(name), remote_device_type(dev), dev.index, runs, *args))
    except FarmError as exc:
        return KernelProfile("not available", f"{exc.message} ({exc.hint})")
    except Exception as exc:  # the device's or TVM's own errors: the profile is a side figure, never the run's fate
        log.debug("profile of %s on %s failed", artifact.model_name, device.name, exc_info=True)
        return KernelProfile("not available", message_line(exc))
    finally:
        if session is not None:
            remove_quietly(session, name)
