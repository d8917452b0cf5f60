"""Two artifacts measured in interleaved rounds on one device, each round a fresh session and load of both: the
comparison a regression is confirmed or a tuned set validated by."""

from __future__ import annotations

import os

import numpy as np
import tvm

from farm.errors import FarmError, MeasurementError, message_line
from farm.measure.context import DEVICE_TYPE
from farm.measure.vm import SteadyTimer, calibrate_number, load_vm, remove_quietly
from farm.records import Artifact, BenchConfig, Device, TrackerAddress, target_kind
from farm.rpc.session import request_session
from farm.stats import nonempty_median


def interleaved_rounds(
    tracker: TrackerAddress, device: Device, old: Artifact, new: Artifact, inputs: dict[str, np.ndarray],
    rounds: int, config: BenchConfig, repeats: int = 5,
) -> tuple[list[float], list[float]]:
    """Per-round figures of two artifacts: each round opens a new session, uploads and loads both, and runs
    them alternately (``repeats`` each, the same number of calls per repeat; which goes first alternates by
    round); a round's figure is each artifact's median. Samples from one load are correlated (code placement,
    caches, clocks at load time), so the comparison is made across rounds, each a fresh load.
    Raises MeasurementError on any failure."""
    number = config.number
    old_rounds, new_rounds = [], []
    for round_index in range(rounds):
        try:
            number, (old_s, new_s) = _interleaved_round(tracker, device, (old, new), inputs, config, number, repeats,
                                                        first=round_index % 2)
        except FarmError:
            raise
        except Exception as exc:
            raise MeasurementError(f"interleaved rerun on {device.name!r} failed in round {round_index + 1}: "
                                   f"{message_line(exc)}",
                                   "check the device (farm devices) and that both artifacts still exist") from exc
        old_rounds.append(nonempty_median(old_s))
        new_rounds.append(nonempty_median(new_s))
    return old_rounds, new_rounds


def _interleaved_round(tracker: TrackerAddress, device: Device, artifacts: tuple[Artifact, Artifact],
                       inputs: dict[str, np.ndarray], config: BenchConfig, number: int | None, repeats: int,
                       first: int) -> tuple[int, tuple[list[float], list[float]]]:
    """One round in its own session (it ends when this returns: nothing of it outlives the call)."""
    session = request_session(tracker, device.key, config.timeout_s, device.session_timeout_s)
    names = [f"farm-interleave-{i}-{os.path.basename(a.path)}" for i, a in enumerate(artifacts)]
    try:
        timers = []
        for name, artifact in zip(names, artifacts):
            session.upload(artifact.path, name)
            dev = session.device(DEVICE_TYPE[target_kind(artifact.target)], 0)
            timers.append(SteadyTimer(load_vm(session, name, dev), dev,
                                      [tvm.runtime.tensor(value, dev) for value in inputs.values()]))
        if number is None:  # calibrated once, on the new artifact: every round runs the same number of calls
            number = calibrate_number(timers[1], config.min_repeat_ms)
        evaluators = [timer.evaluator(number, 1) for timer in timers]
        for evaluator in evaluators:
            evaluator()  # warm-up after load
        samples: tuple[list[float], list[float]] = ([], [])
        for _ in range(repeats):
            for which in (first, 1 - first):
                samples[which].append(evaluators[which]()[0])
        return number, samples
    finally:
        for name in names:
            remove_quietly(session, name)
