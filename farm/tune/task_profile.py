"""Where a model's time is before tuning: each tuning task's untuned time on the device, and the trials it gets.

Untuned CPU code is naive loops, and a model's time sits in a few tasks (convnet: one conv is ~90 % of it,
while MetaSchedule's first round gives ``mean`` and ``max_pool2d`` as many trials as the conv). Before a search,
``profile_tasks`` builds each task's PrimFunc as it is (TVM's default lowering, no schedule), runs it once on the
device through one session (zeros for its buffers; ``time_evaluator``, warm-up discarded: on x86-64 and aarch64
CPUs as the tuning runner times a candidate, 10 single runs each after its weights are flushed from the caches,
``records.COLD_WEIGHTS_RULE``; else 3 repeats of at least 20 ms) and ``allocate_trials`` shares the budget by each
task's share of the model's time (untuned time × call sites). The smallest tasks, together under ``min_share`` of
that time, get no search. GPU targets need a schedule to build at all: they are not profiled, and MetaSchedule's
own task scheduler shares the trials.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

from farm.errors import FarmError, message_line
from farm.records import COLD_TIMING, Device, TrackerAddress

log = logging.getLogger("farm.task_profile")  # the name its warnings have always carried

DEFAULT_MIN_SHARE = 0.01  # the smallest tasks, together under 1 % of the model's time, are not searched
PROFILE_MIN_REPEAT_MS = 20  # each of the 3 repeats runs the task for at least this long (timed warm: not cold_weights)


@dataclass(frozen=True)
class TaskShare:
    """One task's place in the model's untuned time, and its trials this session."""

    name: str
    weight: int  # call sites of the task in the model
    untuned_s: float | None  # one call, untuned, on the device (None: not profiled)
    share: float | None  # weight × untuned_s / the model's sum (None: not profiled)
    trials: int


def profile_tasks(tracker: TrackerAddress, device: Device, tasks: list, target: Any,
                  export: Callable[[str, Any], str], timeout_s: float, cold: bool) -> list[float]:
    """Each task's untuned time per call on ``device`` (seconds), in one session; ``export(path, module)`` writes a
    built module as a library the device loads (the one tuning's candidates use); ``cold``: timed as the runner
    times candidates (``time_modules``), and then its time is the mean of those runs, as a record's is
    (``tune.database.record_s``); else the fastest repeat. Raises FarmError."""
    runs = time_modules(tracker, device, [(f"{t.task_name} untuned", t.dispatched[0]) for t in tasks], target, export,
                        timeout_s, number=1, repeat=3, cold=cold,
                        hint="tuning shares the trials by MetaSchedule's own scheduler instead")
    return [sum(r) / len(r) if cold else min(r) for r in runs]


def time_modules(tracker: TrackerAddress, device: Device, modules: list[tuple[str, Any]], target: Any,
                 export: Callable[[str, Any], str], timeout_s: float, number: int, repeat: int,
                 build_fn: Callable[[Any, Any, None], Any] | None = None,
                 hint: str = "tuning goes on without this figure", *, cold: bool) -> list[list[float]]:
    """Each (name, PrimFunc module) built for ``target`` (by ``build_fn(mod, target, None)``, else TVM's default
    lowering) and timed on ``device`` in one session (zeros for its buffers; measure's ``device_timer`` with ``number``,
    ``repeat``, at least ``PROFILE_MIN_REPEAT_MS`` a repeat; ``cold``: as the tuning runner times a candidate with
    its weights flushed, ``records.COLD_WEIGHTS_RULE``: ``records.COLD_TIMING``): its results
    per module, seconds a call. Raises FarmError naming the module that failed, with ``hint``.
    (TVM is imported here: the CLI reads this module's defaults without it.)"""
    import numpy as np
    import tvm
    from tvm.driver import build
    from tvm.s_tir import meta_schedule as ms

    from farm.measure.vm import device_timer, remove_quietly
    from farm.rpc.session import request_session

    session = request_session(tracker, device.key, timeout_s, max(60.0, timeout_s))
    dev = session.cpu(0)
    times = []
    for index, (label, mod) in enumerate(modules):
        name = f"task{index}.so"
        try:
            built = build_fn(mod, target, None) if build_fn else build(mod, target=target)
            with tempfile.TemporaryDirectory(prefix="farm-profile-") as folder:
                session.upload(export(os.path.join(folder, name), built), name)
            remote = session.load_module(name)
            # build_fn (a tuning candidate's build) drops a weight-layout rewrite block, as MetaSchedule's builder
            # does: the weight is then given in its packed layout (a prepacked conv's 5-D weight), as its runner gives it
            infos = ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=build_fn is not None)
            args = [tvm.runtime.tensor(np.zeros([int(d) for d in info.shape], dtype=str(info.dtype)), dev)
                    for info in infos]
            timer = (device_timer(remote, remote.entry_name, dev, COLD_TIMING.number, COLD_TIMING.repeat,
                                  COLD_TIMING.min_repeat_ms, COLD_TIMING.f_preproc)
                     if cold else device_timer(remote, remote.entry_name, dev, number, repeat, PROFILE_MIN_REPEAT_MS))
            times.append(list(timer(*args)))
        except Exception as exc:  # TVM's errors: the profile is advice, the search goes on without it
            raise FarmError(f"could not time task {label} on {device.name}: {message_line(exc)}",
                            hint) from exc
        finally:
            remove_quietly(session, name)
    return times


def allocate_trials(names: list[str], weights: list[int], times: list[float] | None, budget: int,
                    min_share: float) -> list[TaskShare]:
    """Share ``budget`` trials by each task's share of the model's time (``times``: each task's time a call now;
    largest remainders); the smallest tasks that together make less than ``min_share`` of it get none
    (``small_tail``). Without ``times`` (not profiled) every task is left to MetaSchedule (trials 0, share None)."""
    if times is None:
        return [TaskShare(n, w, None, None, 0) for n, w in zip(names, weights)]
    costs = [w * t for w, t in zip(weights, times)]
    total = sum(costs) or 1.0
    shares = [c / total for c in costs]
    eligible = sorted(set(range(len(shares))) - set(small_tail(shares, min_share)))
    eligible_total = sum(shares[i] for i in eligible) or 1.0
    exact = {i: budget * shares[i] / eligible_total for i in eligible}
    trials = {i: math.floor(v) for i, v in exact.items()}
    for i in sorted(exact, key=lambda i: exact[i] - trials[i], reverse=True)[:budget - sum(trials.values())]:
        trials[i] += 1
    return [TaskShare(n, w, t, s, trials.get(i, 0))
            for i, (n, w, t, s) in enumerate(zip(names, weights, times, shares))]


def small_tail(shares: list[float], min_share: float) -> list[int]:
    """The smallest tasks, smallest first, whose shares add up to less than ``min_share``: what a search leaves out.

    A bound on the tail's sum, not on each task: once the convs are tuned, a model's pools and concatenates are
    each under 1 % of its time but together a tenth of it (onnx:squeezenet after 30 minutes here), and a rule
    per task never searched any of them."""
    tail, total = [], 0.0
    for i in sorted(range(len(shares)), key=lambda i: shares[i]):
        if total + shares[i] >= min_share:
            break
        tail.append(i)
        total += shares[i]
    return tail
