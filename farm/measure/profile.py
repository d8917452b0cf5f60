"""Where the time goes: a model's per-kernel profile on the device, in runs of its own after the timed ones.

TVM 0.27 has no VM profiler (no ``profile=True``, no ``tvm.runtime.profiling``); the Relax VM's ``set_instrument``
calls a function around every call of ``main``. Over RPC that would be a round trip per call, so the instrument runs
in the server's own process: farm's servers offer ``farm.KernelProfile(module, dev_type, dev_id, runs, *inputs)``
(``farm/rpc/server.py``), which loads the module's VM there, times each call between device syncs, and returns the
table as JSON. CPUs give wall time; a GPU whose runtime has an event timer (OpenCL, CUDA) gives each kernel's own time
on it (TVM's ``time_evaluator`` on the kernel's first call's arguments), and the profile's ``clock`` says which. A
stock TVM server has no such helper: the profile is then "not available", and nothing else of the run changes.

Each kernel is named as TVM names it and put in an op class by its name (``op_class``); ``vm.builtin.*`` calls are
the VM's own (allocations, shape checks, tuples). The kernels' sum is set against ``main``'s time in the same runs:
the rest is the VM's overhead, and the instrument's own (a device sync and two clock reads per call).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Sequence

import numpy as np

from farm.errors import FarmError, message_line
from farm.measure.vm import remote_device_type
from farm.op_classes import op_class
from farm.records import Artifact, BenchConfig, Device, KernelProfile, KernelTime, TrackerAddress
from farm.stats import median

log = logging.getLogger(__name__)

PROFILE_RUNS = 10  # runs of main the profile averages at most (after one not counted)
MIN_PROFILE_RUNS = 3  # ... at least, when a profile is asked for (farm bench --profile, a sweep's --profile)
PROFILE_BUDGET_S = 1.0  # ... and no more than fill about this long at the steady median
# ... nor more than this share of the cell's device time before it (session to profile step): the profile's cost in
# a cell stays under 10 % (#63: squeezenet, resnet50, the stand-in phone; docs/benchmarks.md "What changed"), so a
# sweep profiles every cell by default. Where not even one run after the uncounted one fits, the profile is the
# first run alone, counted (``ONE_COUNTED_RUN``): an untuned resnet50's 4.8 s run in a 74 s cell
PROFILE_SHARE = 0.06
ONE_COUNTED_RUN = 0  # the helper's ``runs`` that counts its first run (farm/rpc/server.py, farm/native/rpc_server.cc)
# ... and where even that one run is more than this share of the cell so far (a few repeats of a slow model), the cell
# is not profiled by default: its profile says why (asked for, it is: farm sweep --profile, farm bench --profile)
PROFILE_MAX_SHARE = 0.10
HELPER = "farm.KernelProfile"


def profile_runs(steady_samples_s: Sequence[float], cell_s: float | None = None) -> int:
    """How many runs the profile averages after one not counted, by the median of the run's steady samples.
    A sweep's default profile (``cell_s``: the cell's device time so far): as many as fit in ``PROFILE_SHARE`` of it
    and ``PROFILE_BUDGET_S`` with the uncounted one, at most ``PROFILE_RUNS``; ``ONE_COUNTED_RUN`` where none fits
    (the first run, counted). A profile asked for (``cell_s`` None): about ``PROFILE_BUDGET_S``, at least
    ``MIN_PROFILE_RUNS``."""
    steady_s = median(steady_samples_s)
    if not steady_s:
        return PROFILE_RUNS
    if cell_s is None:
        return max(MIN_PROFILE_RUNS, min(PROFILE_RUNS, int(PROFILE_BUDGET_S / steady_s)))
    after_one = int(min(PROFILE_BUDGET_S, PROFILE_SHARE * cell_s) / steady_s) - 1
    return min(PROFILE_RUNS, after_one) if after_one >= 1 else ONE_COUNTED_RUN


def skipped(steady_samples_s: Sequence[float], cell_s: float) -> KernelProfile | None:
    """The profile "not available" when one run of the model is over ``PROFILE_MAX_SHARE`` of the cell's device time
    so far (``cell_s``); None when the profile fits."""
    steady_s = median(steady_samples_s)
    if not steady_s or steady_s <= PROFILE_MAX_SHARE * cell_s:
        return None
    return KernelProfile("not available", f"not profiled: one run ({steady_s:.3g} s) is over {PROFILE_MAX_SHARE:.0%} of "
                         f"the cell's device time ({cell_s:.3g} s); more repeats make room for it, or ask for the "
                         "profile (farm sweep --profile, farm bench --profile)")


def parse_profile(text: str, facts: dict[str, dict[str, Any]] | None = None) -> KernelProfile:
    """The helper's JSON (``farm.KernelProfile``) as a KernelProfile, per run of ``main``; each kernel with what the
    compile knew of it (``Artifact.kernels``: args, FLOPs, schedule) where ``facts`` names it."""
    said = json.loads(text)
    runs = int(said["runs"])
    if runs <= 0:
        raise FarmError(f"the device's server answered a profile of {runs} runs", "update farm's server on the device: "
                        "farm down, then farm serve")
    facts = facts or {}
    kernels = []
    for k in said["kernels"]:
        name = str(k["name"])
        known = facts.get(name, {})
        kernels.append(KernelTime(name, op_class(name), float(k["calls"]) / runs, float(k["time_s"]) / runs,
                                  tuple(known.get("args", ())), known.get("flops"), known.get("schedule", "")))
    return KernelProfile("ok", "", str(said["clock"]), runs, float(said["main_s"]) / runs, tuple(kernels))


def profile_loaded(session, helpers: dict[str, Any], remote_name: str, dev, args: list, artifact: Artifact,
                   runs: int = PROFILE_RUNS) -> KernelProfile:
    """``artifact``'s per-kernel profile in a bench run's session, after its timed runs (``measure.steps.profile``):
    the server's helper loads the uploaded library anew and runs it ``runs`` times on the inputs already on the
    device. A server without the helper, or a failure, is a profile "not available" with the reason: the profile is
    a side figure, never the run's fate."""
    if HELPER not in helpers:
        return KernelProfile("not available", f"the device's server has no {HELPER} (a stock TVM server): "
                             "farm's servers (farm serve) have it")
    try:
        return parse_profile(helpers[HELPER](session.load_module(remote_name), remote_device_type(dev), dev.index,
                                             runs, *args), artifact.kernels)
    except FarmError as exc:
        return KernelProfile("not available", f"{exc.message} ({exc.hint})")
    except Exception as exc:  # the device's or TVM's own errors
        log.debug("profile of %s failed", artifact.model_name, exc_info=True)
        return KernelProfile("not available", message_line(exc))


def profile_artifact(tracker: TrackerAddress, device: Device, artifact: Artifact, inputs: dict[str, np.ndarray],
                     config: BenchConfig, runs: int = PROFILE_RUNS) -> KernelProfile:
    """``artifact``'s profile on ``device`` in a session of its own (a confirmation's rerun: ``night.confirmation``); "not
    available" with the reason where the server has no helper or anything fails."""
    import tvm

    from farm.measure.context import DEVICE_TYPE, server_helpers
    from farm.measure.vm import remove_quietly
    from farm.records import target_kind
    from farm.rpc.session import request_session

    session = None
    name = f"farm-profile-{os.path.basename(artifact.path)}"
    try:
        session = request_session(tracker, device.key, config.timeout_s, device.session_timeout_s)
        session.upload(artifact.path, name)
        dev = session.device(DEVICE_TYPE[target_kind(artifact.target)], 0)
        args = [tvm.runtime.tensor(value, dev) for value in inputs.values()]
        return profile_loaded(session, server_helpers(session), name, dev, args, artifact, runs)
    except FarmError as exc:
        return KernelProfile("not available", f"{exc.message} ({exc.hint})")
    except Exception as exc:  # the device's or TVM's own errors
        log.debug("profile of %s on %s failed", artifact.model_name, device.name, exc_info=True)
        return KernelProfile("not available", message_line(exc))
    finally:
        if session is not None:
            remove_quietly(session, name)
