"""A tuning session's state while it searches (``TuneSession``), and what it leaves (``TuneOutcome``).

MetaSchedule calls ``SessionCallback`` after each measured batch; it hands the batch to ``TuneSession.on_batch``,
which counts the trials, copies the new records into the store, says the progress and decides whether the session
must stop: a time budget spent, an interrupt (``should_stop``, which the CLI sets on Ctrl-C), a lost device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Callable

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from farm.errors import TrackerError
from farm.records import Say, TrackerAddress
from farm.rpc.tracker import query_summary
from farm.store import Store
from farm.tune.config import UNBOUNDED_TRIALS, TuneConfig
from farm.tune.database import record_s, sync


class TuneStatus(StrEnum):
    """How a session ended, as the store keeps it (``tune_sessions.status``) and ``farm tune --json`` prints it."""

    DONE = "done"  # its trials (or its tasks' candidates) were all measured
    TIME_BUDGET = "time-budget"  # its minutes were spent
    INTERRUPTED = "interrupted"  # the user stopped it (Ctrl-C)
    DEVICE_LOST = "device-lost"  # the key's servers left the tracker, or the tracker stopped answering


INTERRUPTED_BY_THE_USER = "interrupted by the user"
BATCHES_FOR_ESTIMATE = 4  # a time budget's end is foreseen from the longest of the last few batches


class StopTuning(Exception):
    """Raised from the measure callback to end a session (time budget, interrupt, lost device)."""


@dataclass
class TaskProgress:
    name: str
    trials: int = 0
    best_s: float | None = None
    untuned_s: float | None = None  # one call before any search, on the device (the profile)
    share: float | None = None  # of the model's untuned time (call sites included)
    allotted: int | None = None  # trials the profile gave it (None: MetaSchedule's scheduler decides)

    @property
    def speedup(self) -> float | None:
        """Untuned time / the best candidate's so far."""
        return self.untuned_s / self.best_s if self.untuned_s and self.best_s else None

    def measured(self, secs: float | None) -> None:
        """One more candidate timed at ``secs`` (None: it failed)."""
        self.trials += 1
        if secs is not None:
            self.best_s = secs if self.best_s is None else min(self.best_s, secs)


@dataclass(frozen=True)
class TuneOutcome:
    session_id: int
    tuning_key: str
    status: TuneStatus
    reason: str
    trials_done: int
    new_records: int
    total_records: int
    tasks: tuple[TaskProgress, ...]
    seconds: float
    runners: int = 1  # servers of the key that measured candidates at once
    cost_model_samples_before: int = 0  # what the saved cost model had learned before this session
    cost_model_samples: int = 0  # ... and after it (saved with the store's records for the target)
    search_seconds: float = 0.0  # inside MetaSchedule's search (builds and measurements), set-up and profile excluded
    builds_ahead: bool = False  # candidates were built while the device measured earlier ones
    population: int = 0  # the evolutionary search's population (config.search_population_for)
    seeded: int = 0  # tasks whose search started from another task's record of the same anchor block (measured here)
    # (trials so far, the searched tasks' time: call sites × best measured, else untuned) after the seeds and each
    # batch: how fast the session got where it got (tools/bench_warmstart.py)
    trajectory: tuple[tuple[int, float], ...] = ()
    device_busy_seconds: float = 0.0  # the servers' time on candidates (session asked for → released), summed
    candidates_measured: int = 0  # ... over this many candidates (the search's; seeds and untuned records excluded)
    ended_by: str = ""  # which budget or event ended it, in words (TuneSession.ended_by)


@dataclass
class TuneSession:
    """One session's state: its status and why it stopped, each task's progress, the trials, the records new to
    the store, and the trajectory. Its records are copied from ``work_dir`` (MetaSchedule's working database) into
    ``store`` under ``key`` as session ``session_id``."""

    tasks: list[TaskProgress]
    config: TuneConfig
    say: Say
    started: float  # time.monotonic() when tune_model began
    tracker: TrackerAddress
    device_key: str
    store: Store
    key: str
    session_id: int
    work_dir: Path
    weights: dict[int, int] | None  # each searched task's call sites, for the trajectory (None: not by share)
    should_stop: Callable[[], bool] | None = None
    status: TuneStatus = TuneStatus.DONE
    reason: str = ""
    trials: int = 0
    new_records: int = 0
    trajectory: list[tuple[int, float]] = field(default_factory=list)
    calling: list[int] = field(default_factory=list)  # the running tune_tasks call's tasks (its task_id indexes them)
    takes_turns: bool = False  # ... and whether they take turns (PassScheduler), or MetaSchedule schedules them
    last_batch_at: float | None = None  # time.monotonic() at the last measured batch
    batch_secs: list[float] = field(default_factory=list)  # the time between measured batches, latest last

    @property
    def deadline(self) -> float | None:
        return self.started + self.config.minutes * 60 if self.config.minutes else None

    @property
    def going(self) -> bool:
        return self.status is TuneStatus.DONE

    def end(self, status: TuneStatus, reason: str) -> None:
        self.status, self.reason = status, reason

    def interrupted(self) -> None:
        self.end(TuneStatus.INTERRUPTED, INTERRUPTED_BY_THE_USER)

    def stopping(self) -> bool:
        """Whether the session must end now (time budget, interrupt, lost device); records why.

        A time budget ends the session once the time left is less than half of a batch (the longest of the last
        few): one search of a big task can take minutes, and a session given 20 minutes must not take 26."""
        deadline = self.deadline
        if deadline and self.going:
            left, batch = deadline - time.monotonic(), max(self.batch_secs[-BATCHES_FOR_ESTIMATE:], default=0.0)
            if left <= 0:
                self.end(TuneStatus.TIME_BUDGET, f"stopped after {self.config.minutes:g} min")
            elif left < batch / 2:
                self.end(TuneStatus.TIME_BUDGET, f"stopped {left:.0f} s before its {self.config.minutes:g} min: "
                                                 f"a batch takes about {batch:.0f} s")
        if self.should_stop is not None and self.should_stop() and self.going:
            self.interrupted()
        return not self.going

    def ended_by_stop(self) -> bool:
        """After an error out of MetaSchedule's search: whether it is the session's planned end (``StopTuning``
        comes back wrapped by TVM's FFI; an interrupt may land inside its C++), rather than a failure."""
        if self.going and self.should_stop is not None and self.should_stop():
            self.interrupted()
        return not self.going

    def count(self, task: int, secs: float | None = None) -> None:
        """A trial measured outside the search (a seed, an untuned record): counted as the search's are."""
        self.tasks[task].measured(secs)
        self.trials += 1

    def sync_records(self) -> None:
        self.new_records += sync(self.work_dir, self.store, self.key, self.session_id)

    def note_trajectory(self) -> None:
        if self.weights is not None:
            self.trajectory.append((self.trials, sum(
                weight * (self.tasks[i].best_s or self.tasks[i].untuned_s or 0.0) for i, weight in self.weights.items())))

    def on_batch(self, task_id: int, runner_results: list) -> None:
        """A batch measured for task ``task_id`` of the running call: counted, its records stored, said; raises
        ``StopTuning`` when the session must end (terminating tasks from a callback trips MetaSchedule's checks; an
        exception ends ``tune_tasks`` cleanly instead, after this batch's records were synced). Tasks taking turns
        (``PassScheduler``) are given no new batch instead: the batches in flight are measured and kept."""
        index, now = self.calling[task_id], time.monotonic()
        if self.last_batch_at is not None:
            self.batch_secs.append(now - self.last_batch_at)
        self.last_batch_at = now
        for result in runner_results:
            self.tasks[index].measured(record_s(result.run_secs) if result.error_msg is None else None)
        self.trials += len(runner_results)
        self.sync_records()
        self.note_trajectory()
        self._say_batch(index)
        if runner_results and all(r.error_msg for r in runner_results) and (gone := self._device_gone()):
            self.end(TuneStatus.DEVICE_LOST, gone)
        if self.stopping() and not self.takes_turns:
            raise StopTuning(self.reason)

    def ended_by(self) -> str:
        """Which budget or event ended the session, in words: the output says it beside the status."""
        if self.status is TuneStatus.TIME_BUDGET:
            return f"its {self.config.minutes:g} minutes"
        if self.status is TuneStatus.INTERRUPTED:
            return "the user"
        if self.status is TuneStatus.DEVICE_LOST:
            return "the device leaving"
        if self.trials >= self.config.trials:
            return f"its {self.config.trials} trials"
        return "every task's allotment measured (or no new candidate left)"

    def _say_batch(self, index: int) -> None:
        task, trials, budget = self.tasks[index], self.trials, self.config.trials
        eta = (time.monotonic() - self.started) / trials * max(budget - trials, 0) if trials else 0
        if self.deadline:  # a session bounded by minutes ends by then, whatever its trial budget
            eta = min(eta, max(self.deadline - time.monotonic(), 0.0))
        best_text = f"{task.best_s * 1e6:.1f} µs" if task.best_s else "-"
        speedup = f" ({task.speedup:.1f}x untuned)" if task.speedup else ""
        self.say(f"task {index + 1}/{len(self.tasks)} {task.name}: {task.trials} trials, best {best_text}{speedup} · "
                 f"{trials}{'' if budget >= UNBOUNDED_TRIALS else f'/{budget}'} trials, ETA {eta:.0f} s")

    def _device_gone(self) -> str:
        """After a batch whose every candidate failed: why the device is gone, or '' when its key is still served."""
        failure = ""
        try:
            alive = query_summary(self.tracker).keys.get(self.device_key)
        except TrackerError as exc:
            alive, failure = None, exc.message
        if alive is None or alive.servers == 0:
            return failure or f"the server for key {self.device_key!r} left the tracker during tuning"
        return ""


@derived_object
class SessionCallback(ms.measure_callback.PyMeasureCallback):
    """MetaSchedule's measure callback: each measured batch goes to the session (``TuneSession.on_batch``)."""

    def __init__(self, session: TuneSession) -> None:
        super().__init__()
        self.session = session

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        self.session.on_batch(task_id, runner_results)
