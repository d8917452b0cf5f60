"""``farm tune``: MetaSchedule tuning on a device through the tracker; records kept in the store.

The only module that drives ``tvm.s_tir.meta_schedule``'s search. Candidates are built
here for the device's target (exported as shared libraries with the device's toolchain),
measured on the device by MetaSchedule's RPC runner, ranked by the XGBoost cost model.

The store is the source of truth for records: each session starts by writing the store's
records for the device's tuning key (effective target + TVM version) into a fresh
MetaSchedule JSON database, and copies every new record back after each measured batch
and in ``finally``. Ctrl-C, a crash or a lost device keeps every measured record; running
the same command again continues from them (trials add up).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderResult, LocalBuilder, PyBuilder
from tvm.s_tir.meta_schedule.builder import local_builder as ms_local_builder
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, PyRunner, RPCConfig, RPCRunner
from tvm.s_tir.meta_schedule.runner import rpc_runner as ms_rpc_runner
from tvm.ir.utils import derived_object
from tvm.support.popen_pool import PopenPoolExecutor

from farm.costmodel import FORMAT, dump_cost_model, load_cost_model, new_cost_model, samples_of
from farm.compile import (effective_target, is_schedule, make_target, toolchain_for, tuning_key, tuning_module,
                          untuned_trace)
from farm.devices import kind_of
from farm.errors import BuildError, DeviceUnavailable, FarmError, ModelError, TrackerError, message_line
from farm.records import Device, ModelSource, TrackerAddress, TuningSet, target_kind
from farm.rpc.session import request_session
from farm.rpc.tracker import query_summary
from farm.store import Store
from farm.sweep import tuning_set
from farm.task_profile import DEFAULT_MIN_SHARE, allocate_trials, profile_tasks, time_modules

log = logging.getLogger(__name__)

FAILED_RUN_S = 1e9  # MetaSchedule stores failed candidates with 1e10 s


# A candidate whose request found every server of the key taken asks again this many times (each waits
# request_timeout_s) before its measurement fails: busy devices are not a bad schedule.
BUSY_RETRIES = 4

# Searching by share, the tasks take turns in passes: each pass gives every task its share of this many trials
# (at least one batch), biggest first, until their allotments or the minutes are spent. One search per task at
# once would give a time-bounded session's whole budget to the biggest task (it plateaus, the others wait).
PASS_TRIALS = 256

# Candidates a batch for each runner measuring at once. MetaSchedule generates a task's next batch only after the
# last candidate of the batch is measured, so every device waits for the generation (and the last candidate's)
# once a batch: K runners get K times the batch, and that wait is shared by as many candidates as at K = 1
# (tools/bench_tuning.py --scaling, 48 trials: 29 % idle at K = 2 with 16 candidates a batch, 25 % with 32).
TRIALS_PER_RUNNER = 16


class _StopTuning(Exception):
    """Raised from the measure callback to end a session (time budget, interrupt, lost device)."""


@dataclass(frozen=True)
class TuneConfig:
    trials: int = 64
    per_task: int | None = None
    minutes: float | None = None
    tasks: str | None = None  # only tasks whose name contains this
    trials_per_iter: int | None = None  # candidates a batch (None: TRIALS_PER_RUNNER × the runners)
    builder_timeout_s: float = 120.0  # the first batch can be slow: workers import TVM
    runner_timeout_s: float = 60.0  # per candidate on the device (TVM's 10 s is short for phones)
    request_timeout_s: float = 30.0  # wait for a free device per candidate (then asked again: BUSY_RETRIES)
    seed: int = 0
    max_runners: int = 1  # candidates measured at once, each on its own server of the key (K = min(free, this))
    fresh_cost_model: bool = False  # ignore the cost model earlier sessions saved for this target
    candidate_cooldown_s: float = 0.0  # the device rests this long after each candidate, session held (phones)
    by_share: bool = True  # profile each task untuned on the device first, share the trials by its time
    builds_ahead: bool | None = None  # build while the devices measure (None: unless the device measures on this host's CPU)
    take_turns: bool = True  # builds ahead: a pass's tasks take turns in one search (False: one task a search)
    min_share: float = DEFAULT_MIN_SHARE  # a task below this share of the model's untuned time is not searched


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


@dataclass(frozen=True)
class TuneOutcome:
    session_id: int
    tuning_key: str
    status: str  # done | time-budget | interrupted | device-lost
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
    seeded: int = 0  # tasks whose search started from another task's record of the same anchor block (measured here)
    # (trials so far, the searched tasks' time: call sites × best measured, else untuned) after the seeds and each
    # batch: how fast the session got where it got (tools/bench_warmstart.py)
    trajectory: tuple[tuple[int, float], ...] = ()
    device_busy_seconds: float = 0.0  # the servers' time on candidates (session asked for → released), summed
    candidates_measured: int = 0  # ... over this many candidates (the search's; seeds and untuned records excluded)


Progress = Callable[[str], None]


def _build(mod, target, _params):
    """MetaSchedule's default build without importing tensor intrinsics (15-30 s per worker)."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def _export(toolchain: str, mod) -> str:
    """Export a candidate as a shared library the device can load (cross-linked when needed)."""
    return _export_to(toolchain, os.path.join(tempfile.mkdtemp(prefix="farm-cand-"), "candidate.so"), mod)


def _session(host: str, port: int, key: str, request_timeout_s: float, session_timeout_s: float, _config):
    """RPCRunner's session factory, with a bounded wait (TVM's blocks forever on a missing key).

    A key with no server at all fails at once: the device is gone, not busy."""
    tracker = TrackerAddress(host, port)
    for attempt in range(BUSY_RETRIES + 1):
        status = query_summary(tracker).keys.get(key)
        if status is None or status.servers == 0:
            raise DeviceUnavailable(f"no server registered under key {key!r}", "the device left the tracker")
        try:
            return request_session(tracker, key, request_timeout_s, session_timeout_s)
        except DeviceUnavailable:  # every server of the key busy: wait again rather than fail the candidate
            if attempt == BUSY_RETRIES:
                raise
    raise AssertionError("unreachable")


def _run_with_cooldown(cooldown_s: float, session, rt_mod, device, evaluator_config, repeated_args) -> list[float]:
    """MetaSchedule's RPC evaluator, then ``cooldown_s`` of rest with the session held: the device is busy for
    it, as a phone that must cool between candidates is (RPCRunner's own ``cooldown_sec`` is unused in 0.27)."""
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_run_evaluator

    costs = default_run_evaluator(session, rt_mod, device, evaluator_config, repeated_args)
    time.sleep(cooldown_s)
    return costs


def _export_to(toolchain: str, path: str, mod) -> str:
    """``_export`` to a path chosen before the build: written whole (a temp name, then renamed), so a runner
    waiting for it never reads half a library."""
    part = f"{path}.part.so"
    if toolchain:
        from tvm.support import cc

        mod.export_library(part, fcompile=cc.cross_compiler(toolchain))
    else:
        mod.export_library(part)
    os.replace(part, path)
    return path


BUILD_FAILED = ".build-error"  # beside a candidate's planned library: why its build failed


def _warm_worker() -> None:
    """Nothing: run in a new pool worker, unpickling it imports this module, TVM and MetaSchedule (seconds), so
    the first candidate's build or measurement does not wait for that while the devices idle."""


def warm_pool(pool: PopenPoolExecutor, workers: int) -> None:
    """Start ``workers`` of ``pool``'s processes now, each importing what candidates need (not waited for)."""
    for _ in range(workers):
        pool.submit(_warm_worker)


@derived_object
class AheadBuilder(PyBuilder):
    """Builds a batch in the background and answers at once with each candidate's planned library path, so
    MetaSchedule hands the batch to the runner while it builds: a device starts on the first candidate as soon
    as it is built instead of after the whole batch (``AfterBuildRunner`` waits for each library). A failed
    build reaches the runner as ``<path>.build-error``; its candidate is stored failed, as a builder error is."""

    def __init__(self, toolchain: str, timeout_s: float, workers: int, uses: int) -> None:
        super().__init__()
        self.toolchain = toolchain
        # workers restart after `uses` builds: MetaSchedule restarts its builders each batch for a known leak
        self.pool = PopenPoolExecutor(max_workers=workers, timeout=timeout_s, maximum_process_uses=uses + 1)
        self.timeout_s = timeout_s
        warm_pool(self.pool, workers)

    def build(self, build_inputs: list) -> list:
        results = []
        for build_input in build_inputs:
            path = os.path.join(tempfile.mkdtemp(prefix="farm-cand-"), "candidate.so")
            future = self.pool.submit(ms_local_builder._worker_func, _build,  # pylint: disable=protected-access
                                      functools.partial(_export_to, self.toolchain, path), build_input.mod,
                                      build_input.target, None)
            future.add_done_callback(functools.partial(_note_build_failure, path, self.timeout_s))
            results.append(BuilderResult(path, None))
        return results

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False)


def _note_build_failure(path: str, timeout_s: float, future) -> None:
    try:
        future.result()
        return
    except TimeoutError:
        why = f"build timed out after {timeout_s:g} s"
    except Exception as exc:  # the build's own error, from its worker process
        why = f"build failed: {message_line(exc)}"
    with contextlib.suppress(OSError):  # the candidate's folder is gone when its run already ended
        Path(path + BUILD_FAILED).write_text(why)


def _measure_when_built(build_wait_s: float, busy_log: str, *args):
    """RPCRunner's worker, once the candidate's library exists (``AheadBuilder``); the device's session is
    asked for only then, so a server is not held while its candidate builds. The time from asking for the
    session to releasing it (upload, load, runs, cooldown, clean-up) is appended to ``busy_log``."""
    artifact_path = args[8]
    deadline = time.monotonic() + build_wait_s
    while not os.path.exists(artifact_path):
        failed = Path(artifact_path + BUILD_FAILED)
        if failed.exists():
            raise RuntimeError(failed.read_text())
        if time.monotonic() > deadline:
            raise RuntimeError(f"no library after {build_wait_s:g} s of building")
        time.sleep(0.05)
    started = time.monotonic()
    try:
        return ms_rpc_runner._worker_func(*args)  # pylint: disable=protected-access
    finally:
        with open(busy_log, "a", encoding="utf-8") as out:  # one short append per candidate: atomic
            out.write(f"{time.monotonic() - started:.6f}\n")


@derived_object
class AfterBuildRunner(PyRunner):
    """MetaSchedule's RPC runner (its worker, session factory, evaluator and clean-up), with ``max_workers``
    candidates measured at once, each starting when its library is built."""

    def __init__(self, rpc: RPCRunner, workers: int, build_wait_s: float, timeout_s: float) -> None:
        super().__init__()
        self.rpc = rpc
        self.build_wait_s = build_wait_s
        self.timeout_s = timeout_s
        self.pool = PopenPoolExecutor(max_workers=workers, timeout=timeout_s + build_wait_s)
        warm_pool(self.pool, workers)
        handle, self.busy_log = tempfile.mkstemp(prefix="farm-busy-", suffix=".txt")
        os.close(handle)

    def busy_seconds(self) -> list[float]:
        """Each candidate's time on its device so far (session asked for → released): summed and divided by
        K × the search's time, the share of it the devices were busy."""
        try:
            text = Path(self.busy_log).read_text()
        except OSError:
            return []
        return [float(word) for word in text.split() if word.replace(".", "", 1).isdigit()]

    def run(self, runner_inputs: list) -> list:
        rpc = self.rpc
        return [ms_rpc_runner.RPCRunnerFuture(
            future=self.pool.submit(
                _measure_when_built, self.build_wait_s, self.busy_log, rpc.f_create_session, rpc.f_upload_module,
                rpc.f_alloc_argument, rpc.f_run_evaluator, rpc.f_cleanup, rpc.rpc_config, rpc.evaluator_config,
                rpc.alloc_repeat, str(runner_input.artifact_path), str(runner_input.device_type),
                tuple(arg_info.as_json() for arg_info in runner_input.args_info)),
            timeout_sec=self.timeout_s) for runner_input in runner_inputs]

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False)
        with contextlib.suppress(OSError):
            os.unlink(self.busy_log)


def search_passes(allotted: dict[int, int], shares: dict[int, float], batch: int,
                  pass_trials: int = PASS_TRIALS, exhausted: set[int] | None = None) -> Iterator[list[tuple[int, int]]]:
    """The by-share plan, pass after pass: each pass is a list of (task, trials), biggest share first, each task
    getting ``pass_trials`` × its share in whole batches (at least one ``batch``, at most what is left of its
    allotment). A task the caller adds to ``exhausted`` (its search measured fewer than it was given: no new
    candidate left) is not in the passes after."""
    done = exhausted if exhausted is not None else set()
    left = {i: n for i, n in allotted.items() if n > 0}
    total = sum(shares[i] for i in left) or 1.0
    order = sorted(left, key=lambda i: -shares[i])
    while any(n for i, n in left.items() if i not in done):
        searches = []
        for i in order:
            if left[i] and i not in done:
                take = min(left[i], batch * max(1, round(pass_trials * shares[i] / total / batch)))
                left[i] -= take
                searches.append((i, take))
        yield searches


def overlapped_calls(searches: list[tuple[int, int]], batch: int) -> list[list[tuple[int, int]]]:
    """A pass's searches as ``tune_tasks`` calls: the searches of whole batches together in one call (``PassScheduler``
    takes their turns, so one task's batch is generated while another's is measured), each other search alone."""
    whole = [(i, n) for i, n in searches if n % batch == 0]
    return ([whole] if whole else []) + [[(i, n)] for i, n in searches if n % batch]


@derived_object
class PassScheduler(ms.task_scheduler.PyTaskScheduler):
    """MetaSchedule's round robin over one pass's tasks, each up to its quota of trials. MetaSchedule generates a
    task's next batch only once its last batch is measured; taking turns, the next task's batch is generated (and
    built ahead) while the devices measure this one's, instead of the devices waiting for each generation.

    At most two batches are in flight (the one measured, the one queued behind it), so a stop waits for no more
    than that: once ``stopped()`` (a time budget, an interrupt, a lost device) no task gets a new batch and
    MetaSchedule joins the batches in flight (their records kept). A task gets a batch only while a whole one
    fits its quota (all tasks share one per-task cap in MetaSchedule, the largest quota, and a search may return
    a short batch), so none exceeds it; ``ended`` holds the tasks this ended, the rest ended by MetaSchedule
    (no new candidate). ``measured(i)``: the trials task ``i`` of this call has measured so far."""

    def __init__(self, quotas: list[int], batch: int, measured: Callable[[int], int],
                 stopped: Callable[[], bool]) -> None:
        super().__init__()
        self.quotas = quotas
        self.batch = batch
        self.measured = measured
        self.stopped = stopped
        self.turn = -1
        self.in_flight: list[int] = []  # tasks whose batch was handed out and not yet joined, oldest first
        self.ended: set[int] = set()

    def next_task_id(self) -> int:
        scheduler = self._outer()  # pylint: disable=no-member
        for i in range(len(self.quotas)):
            scheduler.touch_task(i)  # joins a task whose batch is all measured, without waiting
        self.in_flight = [i for i in self.in_flight if scheduler.tasks_[i].runner_futures is not None]
        while len(self.in_flight) > 1 and not self.stopped():
            self.join_running_task(self.in_flight.pop(0))  # the devices measure the other one meanwhile
        if self.stopped():
            return -1  # MetaSchedule then joins the batches in flight
        for _ in range(2 * len(self.quotas)):  # twice round: a task in flight is waited for once it is the last
            self.turn = (self.turn + 1) % len(self.quotas)
            task = scheduler.tasks_[self.turn]
            live = sum(1 for other in scheduler.tasks_ if not other.is_terminated)
            if task.is_terminated or (self.turn in self.in_flight and live > 1):
                continue
            if task.runner_futures is not None:  # the last task left: wait for its batch
                self.join_running_task(self.turn)
                self.in_flight.remove(self.turn)
                if self.stopped():
                    return -1
            if self.quotas[self.turn] - self.measured(self.turn) < min(self.batch, self.quotas[self.turn]):
                self.ended.add(self.turn)
                scheduler.terminate_task(self.turn)
                continue
            self.in_flight.append(self.turn)
            return self.turn
        return -1


def _sync(work_dir: Path, store: Store, key: str, session_id: int | None) -> int:
    """Copy the working database's records into the store; a torn last line is skipped."""
    workload_path = work_dir / "database_workload.json"
    record_path = work_dir / "database_tuning_record.json"
    if not workload_path.exists():
        return 0
    workloads = [line for line in workload_path.read_text().splitlines() if line.strip()]
    records = []
    if record_path.exists():
        for number, line in enumerate(record_path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                index, body = json.loads(line)
            except ValueError:
                log.warning("skipping torn record line %d of %s", number, record_path)
                continue
            if not 0 <= index < len(workloads):
                continue
            run_secs = [float(v) for v in body[1]] if body and body[1] else []
            best = min(run_secs) if run_secs and min(run_secs) < FAILED_RUN_S else None
            records.append((index, json.dumps(body), best))
    return store.add_tuning_lines(key, workloads, records, session_id)


# MetaSchedule's logs (per-batch tables, builder and runner errors) are kept for this many latest sessions
KEPT_SESSION_LOGS = 20


def _session_log_dir(work_root: Path, device: Device, session_id: int) -> Path:
    """WORK_ROOT/sessions/KEY-SESSION: MetaSchedule's log folder for one session, kept after it (the last
    ``KEPT_SESSION_LOGS`` sessions) so a slow or failing search can be read afterwards."""
    root = work_root / "sessions"
    root.mkdir(parents=True, exist_ok=True)
    # named KEY-SESSION-TIME (stores sharing one FARM_HOME number their sessions alike), pruned by name's time
    folders = sorted(root.iterdir(), key=lambda p: p.name.rsplit("-", 1)[-1])
    for old in folders[:max(0, len(folders) - KEPT_SESSION_LOGS + 1)]:
        shutil.rmtree(old, ignore_errors=True)
    folder = root / f"{device.key}-{session_id}-{time.strftime('%Y%m%dT%H%M%S')}"
    folder.mkdir(exist_ok=True)
    return folder


def _write_database(work_dir: Path, tuning: TuningSet) -> None:
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)  # JSONDatabase does not create its directory
    (work_dir / "database_workload.json").write_text("".join(f"{line}\n" for line in tuning.workloads))
    (work_dir / "database_tuning_record.json").write_text("".join(f"{line}\n" for line in tuning.records))


def tune_model(
    tracker: TrackerAddress, device: Device, model: ModelSource, store: Store, work_root: Path,
    config: TuneConfig, progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
) -> TuneOutcome:
    """Tune ``model`` on ``device``. ``should_stop`` is polled after every batch (the CLI sets it on Ctrl-C):
    the session then ends after the batch in flight (tasks taking turns: the two), status "interrupted", every record
    kept."""
    say = progress or (lambda message: None)
    start = time.monotonic()
    if device.export != "so":
        raise FarmError(f"device {device.name!r} exports {device.export!r}: tuning measures candidates as shared libraries",
                        "tune on a device of the same CPU/GPU that loads .so files, then compile for this one")
    target = effective_target(device)
    toolchain = toolchain_for(device, target)
    key = tuning_key(target)
    # Fail before any work when nobody serves the key: RPCRunner would wait forever.
    status = query_summary(tracker).keys.get(device.key)
    if status is None or status.servers == 0:
        raise DeviceUnavailable(f"no server is registered under key {device.key!r} at {tracker}",
                                "bring the device up first: farm serve, then farm devices")
    if "num-cores" not in target and target_kind(target.get("host") or target) == "llvm" and target_kind(target) == "llvm":
        raise FarmError(f"device {device.name!r}: MetaSchedule needs the target's core count",
                        f"add num-cores = N to the target of {device.name!r} in devices.toml")
    tvm_target = make_target(target)
    mod = tuning_module(model)
    tasks = _extract_tasks(mod, tvm_target, model)
    if config.tasks:
        tasks = [t for t in tasks if config.tasks in t.task_name]
    if not tasks:
        raise ModelError(f"no tuning tasks in {model.name}" + (f" match {config.tasks!r}" if config.tasks else ""),
                         "list them with farm tune --list-tasks")
    say("loading MetaSchedule's tensor intrinsics")
    load_tensor_intrinsics()
    work_dir = Path(work_root) / f"{device.key}-{key}"
    runners = max(1, min(config.max_runners, status.free or 1))  # each runner holds one server of the key
    batch = config.trials_per_iter or TRIALS_PER_RUNNER * runners
    cost_model = new_cost_model(os.cpu_count())
    saved = None if config.fresh_cost_model else store.cost_model(key)
    if saved is not None:
        load_cost_model(cost_model, saved[0])
    prior = tuning_set(store, device)
    _write_database(work_dir, prior)
    untuned = _profile(tracker, device, tasks, tvm_target, toolchain, config, say)
    # where the time is now: a task that earlier sessions tuned costs its best record's time, not its untuned time
    # (each session ranking by untuned time would search the same big tasks again and never reach the rest)
    known = _prior_databases(prior)  # (exact, anchor block), or None: no records yet
    recorded: list[float | None] = (_best_recorded(known[0], tasks, tvm_target) if known and untuned is not None
                                    else [None] * len(tasks))
    now = [min(u, r) if r is not None else u for u, r in zip(untuned, recorded)] if untuned is not None else None
    shares = allocate_trials([t.task_name for t in tasks], [int(t.weight) for t in tasks], now, config.trials,
                             config.min_share)
    session_id = store.start_tune_session(device, model, key, target, tvm.__version__, config.trials)
    progress_by_task = [TaskProgress(s.name, untuned_s=untuned[i] if untuned is not None else None, share=s.share,
                                     allotted=s.trials if s.share is not None else None, best_s=recorded[i])
                        for i, s in enumerate(shares)]
    for task in sorted(progress_by_task, key=lambda t: -(t.share or 0)):
        if task.share is not None and task.untuned_s is not None:
            tuned_text = f", {task.best_s * 1e6:.1f} µs with its best record" if task.best_s else ""
            say(f"  {task.name}: {task.share:6.1%} of the model's time now (untuned {task.untuned_s * 1e6:.1f} µs a "
                f"call{tuned_text}), {task.allotted} trial(s)")
    by_share = shares[0].share is not None
    current: list[int] = []  # the tasks of the tune_tasks call running (its callback's task_id indexes them)
    turns_now: list[PassScheduler | None] = [None]  # ... and its PassScheduler, if its tasks take turns
    state: dict[str, Any] = {"status": "done", "reason": "", "trials": 0, "new": 0}
    deadline = start + config.minutes * 60 if config.minutes else None

    def stopping() -> bool:
        """Whether the session must end now (time budget, interrupt, lost device); records why in ``state``."""
        if deadline and time.monotonic() > deadline and state["status"] == "done":
            state["status"], state["reason"] = "time-budget", f"stopped after {config.minutes:g} min"
        if should_stop is not None and should_stop() and state["status"] == "done":
            state["status"], state["reason"] = "interrupted", "interrupted by the user"
        return state["status"] != "done"

    @derived_object
    class FarmCallback(ms.measure_callback.PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
            task_id = current[task_id]
            task = progress_by_task[task_id]
            task.trials += len(runner_results)
            state["trials"] += len(runner_results)
            for result in runner_results:
                if result.error_msg is None and result.run_secs:
                    best = min(float(s) for s in result.run_secs)
                    task.best_s = best if task.best_s is None else min(task.best_s, best)
            state["new"] += _sync(work_dir, store, key, session_id)
            note_trajectory()
            elapsed = time.monotonic() - start
            eta = elapsed / state["trials"] * max(config.trials - state["trials"], 0) if state["trials"] else 0
            if deadline:  # a session bounded by minutes ends by then, whatever its trial budget
                eta = min(eta, max(deadline - time.monotonic(), 0.0))
            best_text = f"{task.best_s * 1e6:.1f} µs" if task.best_s else "-"
            speedup = f" ({task.speedup:.1f}x untuned)" if task.speedup else ""
            say(f"task {task_id + 1}/{len(tasks)} {task.name}: {task.trials} trials, best {best_text}{speedup} · "
                f"{state['trials']}/{config.trials} trials, ETA {eta:.0f} s")
            stop = ""
            if runner_results and all(r.error_msg for r in runner_results):
                try:
                    alive = query_summary(tracker).keys.get(device.key)
                except TrackerError as exc:
                    alive, stop = None, exc.message
                if alive is None or alive.servers == 0:
                    state["status"] = "device-lost"
                    state["reason"] = stop or f"the server for key {device.key!r} left the tracker during tuning"
            if stopping() and turns_now[0] is None:
                # Terminating tasks from a callback trips the scheduler's checks; an exception ends
                # tune_tasks cleanly instead, after this batch's records were synced above. Tasks taking turns
                # (PassScheduler) are given no new batch instead: the batches in flight are measured and kept.
                raise _StopTuning(state["reason"])

    ahead = config.builds_ahead if config.builds_ahead is not None else not kind_of(device).measures_on_this_host
    database = ms.database.JSONDatabase(str(work_dir / "database_workload.json"),
                                        str(work_dir / "database_tuning_record.json"))
    _metaschedule_logs_to_file_only()  # the contexts set up MetaSchedule's loggers ("Logging directory: …")
    log_dir = _session_log_dir(Path(work_root), device, session_id)  # the database's folder is rewritten each session
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, str(log_dir), seed=config.seed)
    searched = [i for i, share in enumerate(shares) if share.trials] if by_share else []
    seeds = _seed_by_anchor(tracker, device, contexts, searched, [t.untuned_s for t in progress_by_task], recorded,
                            known, tvm_target, toolchain, database, config, say)
    for seeded_task, secs in seeds.items():  # a seed timed and refused (slower than untuned) counts a trial too
        task = progress_by_task[seeded_task]
        task.trials += 1
        state["trials"] += 1
        if secs:
            task.best_s = float(np.mean(secs))
    try:
        baselines = _commit_untuned(database, contexts, searched, [t.untuned_s for t in progress_by_task], tvm_target)
    except Exception as exc:  # TVM's errors: the guard is lost for this session, never the session itself
        log.info("untuned records failed", exc_info=True)
        say(f"no untuned records: {message_line(exc)}")
        baselines = []
    for baseline_task in baselines:  # the profile measured it on the device: a trial, as a seed is
        progress_by_task[baseline_task].trials += 1
        state["trials"] += 1
    trajectory: list[tuple[int, float]] = []

    def note_trajectory() -> None:
        if by_share:
            trajectory.append((state["trials"], sum(
                shares[i].weight * (progress_by_task[i].best_s or progress_by_task[i].untuned_s or 0.0)
                for i in searched)))

    note_trajectory()
    say(f"MetaSchedule's own log: {log_dir / 'logs'}")
    say(f"{len(tasks)} task(s), {len(prior.records)} record(s) already in the store for this target; "
        f"cost model: {samples_of(cost_model)} sample(s) from earlier sessions; {runners} runner(s) on key {device.key!r}"
        f"; {'builds run ahead of the measurements' if ahead else 'each batch is built, then measured'}")
    # made after the seeds were timed: their pools start their processes at once (warm_pool)
    rpc = RPCRunner(
        RPCConfig(tracker.host, tracker.port, device.key, session_timeout_sec=int(config.runner_timeout_s)),
        EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20, enable_cpu_cache_flush=False),
        f_create_session=functools.partial(_session, tracker.host, tracker.port, device.key,
                                           config.request_timeout_s, config.runner_timeout_s),
        f_run_evaluator=functools.partial(_run_with_cooldown, config.candidate_cooldown_s)
        if config.candidate_cooldown_s else None,
    )
    rpc.pool.shutdown(wait=False)  # AfterBuildRunner measures with RPCRunner's functions in its own pool
    runner = AfterBuildRunner(rpc, runners, config.builder_timeout_s if ahead else 1.0,
                              config.runner_timeout_s + (BUSY_RETRIES + 1) * config.request_timeout_s)
    builder = (AheadBuilder(toolchain, config.builder_timeout_s, os.cpu_count() or 1, batch)
               if ahead else LocalBuilder(timeout_sec=config.builder_timeout_s, f_build=_build,
                                          f_export=functools.partial(_export, toolchain), max_workers=os.cpu_count()))
    exhausted: set[int] = set()  # tasks whose search ran out of new candidates (a concatenate's few schedules)

    def run_tasks(chosen: list[int], max_trials: int, per_task: int | None, turns: PassScheduler | None = None) -> None:
        """One MetaSchedule ``tune_tasks`` call over the tasks ``chosen`` with the session's builder, runner, database,
        cost model and callbacks: MetaSchedule's gradient scheduler, or ``turns``."""
        current[:], turns_now[0] = chosen, turns
        _metaschedule_logs_to_file_only()
        ms.tune.tune_tasks(
            tasks=[contexts[i] for i in chosen], task_weights=[weights[i] for i in chosen], work_dir=str(log_dir),
            max_trials_global=max_trials, max_trials_per_task=per_task, num_trials_per_iter=min(batch, max_trials),
            builder=builder, runner=runner, database=database, cost_model=cost_model,
            measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), FarmCallback()],
            task_scheduler=turns or "gradient")

    def search(call: list[tuple[int, int]]) -> None:
        """The searches ``call`` (task, trials) of a pass in one call: one task, or tasks taking turns."""
        chosen = [i for i, _ in call]
        quotas = [min(config.per_task or n, n) for _, n in call]
        before = [progress_by_task[i].trials for i in chosen]
        turns = PassScheduler(quotas, batch, lambda j: progress_by_task[chosen[j]].trials - before[j],
                              stopping) if len(call) > 1 else None
        run_tasks(chosen, sum(quotas), max(quotas), turns)
        for j, ((i, trials), trials_before) in enumerate(zip(call, before)):
            ended_by_quota = turns is not None and j in turns.ended
            if state["status"] == "done" and not ended_by_quota and progress_by_task[i].trials - trials_before < trials:
                exhausted.add(i)  # MetaSchedule ends a task's search when it finds no candidate not measured

    search_start = time.monotonic()
    try:
        if by_share:  # passes (search_passes), all sharing one cost model and database: a task's search a call, or,
            # when builds run ahead of a device that is not this host, a pass's tasks taking turns in one call
            passes = search_passes({i: s.trials - int(i in seeds) - int(i in baselines) for i, s in enumerate(shares)},
                                   {i: s.share or 0.0 for i, s in enumerate(shares)}, batch, exhausted=exhausted)
            for call in (call for searches in passes
                         for call in (overlapped_calls(searches, batch) if ahead and config.take_turns and not config.per_task
                             else [[one] for one in searches])):
                if state["status"] != "done":
                    break
                search(call)
        else:  # MetaSchedule's gradient scheduler over every task
            run_tasks(list(range(len(contexts))), config.trials, config.per_task)
    except KeyboardInterrupt:
        state["status"], state["reason"] = "interrupted", "interrupted by the user"
    except Exception:  # _StopTuning comes back wrapped by TVM's FFI; an interrupt inside C++ too
        if state["status"] == "done":
            if should_stop is None or not should_stop():
                raise
            state["status"], state["reason"] = "interrupted", "interrupted by the user"
    finally:
        busy = runner.busy_seconds()
        runner.shutdown()
        if isinstance(builder, AheadBuilder):
            builder.shutdown()
        state["new"] += _sync(work_dir, store, key, session_id)
        if samples_of(cost_model):  # the next session on this target starts from what this one learned
            store.save_cost_model(key, dump_cost_model(cost_model), FORMAT, samples_of(cost_model), session_id)
        store.finish_tune_session(session_id, state["status"], state["reason"], state["trials"])
    total = len(store.tuning_lines(key)[1])
    return TuneOutcome(session_id, key, state["status"], state["reason"], state["trials"], state["new"], total,
                       tuple(progress_by_task), time.monotonic() - start, runners,
                       saved[2] if saved else 0, samples_of(cost_model), time.monotonic() - search_start, ahead,
                       sum(1 for secs in seeds.values() if secs), tuple(trajectory), sum(busy), len(busy))


def _prior_databases(prior: TuningSet):
    """The store's records for the session as MetaSchedule databases, exact and by anchor block (``compile``'s
    pair), loaded once and only queried; None when there are none."""
    if not prior.records:
        return None
    from farm.compile import record_databases

    with tempfile.TemporaryDirectory(prefix="farm-prior-") as tmp:
        return record_databases(prior, Path(tmp))  # read whole at construction: the files are not needed after


def _best_recorded(exact, tasks: list, tvm_target) -> list[float | None]:
    """Each task's best stored record's time (mean of its run seconds), or None: no record of its own."""
    normalize = tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod")
    best: list[float | None] = []
    for task in tasks:
        record = exact.query_tuning_record(normalize(task.dispatched[0]), tvm_target, task.task_name)
        tuned = record is not None and is_schedule(record.trace)  # an untuned record: no record of its own yet
        best.append(_mean_s(record) if tuned else None)
    return best


def _commit_untuned(database, contexts: list, searched: list[int], untuned: list[float | None],
                    tvm_target) -> list[int]:
    """Each task to search whose untuned time is known, that has no record faster than it and no untuned record yet
    gets its untuned code as a record (``compile.untuned_trace``, the profile's time): the task's best record of its
    own is then not slower than its untuned code as profiled, so ``compile.apply_records`` (which applies the best)
    leaves a task whose candidates all lost (mlp's 1 µs matmuls) as it was. Tasks not searched, targets not profiled
    (GPUs, ``--no-profile``) and records transferred by anchor block get no such guard. Returns the tasks."""
    committed = []
    for index in searched:
        secs, mod = untuned[index], contexts[index].mod
        if secs is None:
            continue
        workload = database.commit_workload(mod)  # (its search commits it anyway)
        records = database.get_top_k(workload, 100_000)  # best first
        if records and (_mean_s(records[0]) or FAILED_RUN_S) < secs:
            continue  # beaten
        if any(not is_schedule(r.trace) for r in records):
            continue  # recorded once, by the first session that profiled it: a later profile's noise changes nothing
        try:
            trace = untuned_trace(mod)
        except Exception as exc:  # TVM's schedule errors: a task without a root block keeps no such record
            log.info("no untuned record for %s: %s", contexts[index].task_name, message_line(exc))
            continue
        database.commit_tuning_record(ms.database.TuningRecord(
            trace, workload, [secs], tvm_target,
            ms.arg_info.ArgInfo.from_prim_func(next(iter(mod.functions.values())))))
        committed.append(index)
    return committed


def _mean_s(record) -> float | None:
    """A record's time (mean of its run seconds), or None: its candidate failed."""
    secs = [float(getattr(v, "value", v)) for v in (record.run_secs or [])]
    return float(np.mean(secs)) if secs and max(secs) < FAILED_RUN_S else None


def _seed_by_anchor(tracker: TrackerAddress, device: Device, contexts: list, searched: list[int],
                    untuned: list[float | None], recorded: list[float | None], known, tvm_target, toolchain: str,
                    database, config: TuneConfig, say: Progress) -> dict[int, list[float]]:
    """Each task to search that has no schedule of its own but one of the same anchor block (another model's conv
    with another epilogue: what ``compile.apply_records`` would use) starts from it: the record's schedule is
    transferred to the task, timed on the device like a candidate, and committed as the task's first record, so
    MetaSchedule's search seeds its population with it. A transferred schedule slower than the task's untuned
    time is not committed (it would seed the search with a loser). Returns {task: its run seconds, [] when timed
    and refused}; a transfer or a timing that fails is said and skipped (the search starts as it would have)."""
    if not searched or known is None:
        return {}
    try:
        return _seeds(tracker, device, contexts, searched, untuned, recorded, known[1], tvm_target, toolchain,
                      database, config, say)
    except Exception as exc:  # TVM's errors, many types: seeds are a head start, never a failed session
        log.info("seeding by anchor block failed", exc_info=True)
        say(f"no seeds by anchor block: {message_line(exc)}")
        return {}


def _seeds(tracker: TrackerAddress, device: Device, contexts: list, searched: list[int], untuned: list[float | None],
           recorded: list[float | None], anchor, tvm_target, toolchain: str, database, config: TuneConfig,
           say: Progress) -> dict[int, list[float]]:
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.trace_apply import schedule_using_anchor_trace

    picked = []
    for index in searched:
        mod, name = contexts[index].mod, contexts[index].task_name
        if recorded[index] is not None:
            continue  # a schedule of its own (_best_recorded; a task with only its untuned record is seeded)
        record = anchor.query_tuning_record(mod, tvm_target, name)
        if record is None:  # (the anchor-block database holds schedules only: compile.record_databases)
            continue
        try:
            sch = Schedule(mod)
            schedule_using_anchor_trace(sch, record.trace, tvm_target)
        except Exception as exc:  # TVM's schedule errors: this task's search starts from nothing
            say(f"  {name}: the record of its anchor block does not transfer ({message_line(exc)})")
            continue
        picked.append((index, sch))
    if not picked:
        return {}
    say(f"timing {len(picked)} schedule(s) transferred by anchor block from other tasks' records")
    try:
        runs = time_modules(tracker, device, [(contexts[i].task_name, sch.mod) for i, sch in picked], tvm_target,
                            functools.partial(_export_to, toolchain), config.request_timeout_s, number=3, repeat=1,
                            build_fn=_build)
    except FarmError as exc:
        say(f"{exc.message}; the search starts without them")
        return {}
    seeds: dict[int, list[float]] = {}
    for (index, sch), secs in zip(picked, runs):
        slower = untuned[index] is not None and float(np.mean(secs)) >= (untuned[index] or 0.0)
        if slower:
            say(f"  {contexts[index].task_name}: its anchor block's record is slower here ({np.mean(secs) * 1e6:.1f} µs) "
                f"than untuned ({(untuned[index] or 0.0) * 1e6:.1f} µs): not used")
            seeds[index] = []
            continue
        workload = database.commit_workload(contexts[index].mod)
        database.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, workload, [float(s) for s in secs], tvm_target,
            ms.arg_info.ArgInfo.from_prim_func(next(iter(sch.mod.functions.values())))))
        seeds[index] = secs
        say(f"  {contexts[index].task_name}: starts from a record of its anchor block, {np.mean(secs) * 1e6:.1f} µs")
    return seeds


def _profile(tracker: TrackerAddress, device: Device, tasks: list, tvm_target, toolchain: str, config: TuneConfig,
             say: Progress) -> list[float] | None:
    """Each task's untuned time on the device, or None: not asked, a GPU target (unscheduled kernels do not
    build), or a profile that failed (said, and MetaSchedule's scheduler shares the trials)."""
    if not config.by_share or target_kind(tvm_target.export()) != "llvm":
        return None
    say(f"timing {len(tasks)} task(s) untuned on {device.name} to share {config.trials} trials by time")
    try:
        return profile_tasks(tracker, device, tasks, tvm_target, functools.partial(_export_to, toolchain),
                             config.request_timeout_s)
    except FarmError as exc:
        say(f"{exc.message}; {exc.hint}")
        return None


def _metaschedule_logs_to_file_only() -> None:
    """MetaSchedule's per-batch tables and XGBoost's lines go to its log files (WORK_DIR/logs), not to stdout.

    Each ``tune_tasks`` call sets its console handler's level from the package logger's level, then sets that
    logger to DEBUG (for its files): so before every call the package logger goes back to WARNING."""
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)


def load_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` (which each tune context needs) in seconds instead of ~40 s.

    Its ~250 TVMScript functions each call ``inspect.stack()``, which looks up the module of every
    frame on the stack; for the import machinery's frames (``<frozen importlib._bootstrap>``) no
    module matches, and ``inspect.getmodule`` scans all of ``sys.modules`` (~2000 after importing
    TVM) again each time. Those pseudo-files have no module, whatever the scan finds: answering
    ``None`` at once gives ``inspect.stack()`` the same frames and source lines."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    with _pseudo_files_have_no_module():
        importlib.import_module("tvm.s_tir.tensor_intrin")


@contextlib.contextmanager
def _pseudo_files_have_no_module():
    scan = inspect.getmodule

    def getmodule(obj, _filename=None):
        if _filename is not None and _filename.startswith("<") and _filename.endswith(">") and inspect.isframe(obj):
            return None
        return scan(obj, _filename)

    inspect.getmodule = getmodule
    try:
        yield
    finally:
        inspect.getmodule = scan


def _extract_tasks(mod, target, model: ModelSource) -> list:
    """MetaSchedule's tuning tasks of ``mod``; TVM's errors become a BuildError naming the model (cause kept: -v)."""
    try:
        return list(ms.relax_integration.extract_tasks(mod, target))
    except Exception as exc:  # tvm.error.TVMError and the FFI's own: TVM raises many types here
        log.info("extracting tuning tasks of %s failed", model.name, exc_info=True)
        raise BuildError(f"cannot extract tuning tasks from {model.name}: {message_line(exc)}",
                         "check that farm compile works for this model and device; -v shows TVM's trace") from exc


def list_tasks(device: Device, model: ModelSource) -> list[str]:
    target = make_target(effective_target(device))
    return [t.task_name for t in _extract_tasks(tuning_module(model), target, model)]


PACK_MANIFEST = "farm-pack.json"  # a records pack: what it was tuned for, what it holds (data only, never code)
PACK_FORMAT = 1


def replay_earlier_records(store: Store, device: Device, model: ModelSource) -> tuple[int, int, str, str] | None:
    """On a tuning key that never had records (the night of a TVM upgrade: keys include the TVM version), the same
    target's records under the newest older TVM version, copied into this version's key as a session of their own:
    (session id, records copied, that TVM version, this key); None when the key has records or nothing earlier
    exists. The caller validates them (``nightly``) and rejects the session if they make the model slower."""
    from packaging.version import InvalidVersion, Version

    def older(version: str) -> bool:  # a farm sharing one database across TVM versions never replays a newer one's
        try:
            return Version(version) < Version(tvm.__version__)
        except InvalidVersion:
            return False

    target = effective_target(device)
    key = tuning_key(target)
    if store.ever_had_records(key):  # records of its own, or a replay that was rejected: never replayed (again)
        return None
    earlier = next(((k, v) for k, v in store.other_tunings(target, tvm.__version__) if older(v)), None)
    if earlier is None:
        return None
    from_key, version = earlier
    session_id = store.start_tune_session(device, model, key, target, tvm.__version__, 0)
    copied = store.copy_tuning(from_key, key, session_id)
    store.finish_tune_session(session_id, "done", f"replayed {copied} record(s) of TVM {version}", 0)
    return session_id, copied, version, key


def export_database(store: Store, device: Device, out_dir: Path) -> TuningSet:
    """Write the store's records for ``device`` as a pack: MetaSchedule's JSON database files (any MetaSchedule
    reads them), the cost model (``costmodel``'s .npz: plain arrays and xgboost's own model file) and a manifest
    naming the target, the TVM version and what is inside."""
    target = effective_target(device)
    key = tuning_key(target)
    tuning = tuning_set(store, device)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "database_workload.json").write_text("".join(f"{line}\n" for line in tuning.workloads))
    (out_dir / "database_tuning_record.json").write_text("".join(f"{line}\n" for line in tuning.records))
    saved = store.cost_model(key)
    if saved is not None:
        (out_dir / "cost_model.npz").write_bytes(saved[0])
    manifest = {"format": PACK_FORMAT, "tuning_key": key, "target": target, "tvm_version": tvm.__version__,
                "workloads": len(tuning.workloads), "records": len(tuning.records),
                "cost_model": {"file": "cost_model.npz", "format": saved[1], "samples": saved[2]} if saved else None,
                "exported_from": device.name, "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}
    (out_dir / PACK_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return tuning


def import_database(store: Store, device: Device, in_dir: Path) -> int:
    """Merge a pack or a plain MetaSchedule JSON database folder (from another farm) into the store; returns new
    records. A pack for another target or TVM version is refused: its records would not apply. Its cost model
    is read as data (no pickle) and kept when the store has none for the target, or a smaller one."""
    in_dir = Path(in_dir)
    if not (in_dir / "database_workload.json").exists():
        raise FarmError(f"{in_dir} has no database_workload.json", "point --import at a MetaSchedule database folder")
    target = effective_target(device)
    key = tuning_key(target)
    manifest_path = in_dir / PACK_MANIFEST
    if manifest_path.exists():
        try:
            manifest = json.loads(manifest_path.read_text())
            theirs = (manifest["target"], manifest["tvm_version"])
        except (ValueError, KeyError, TypeError) as exc:
            raise FarmError(f"{manifest_path} is not a farm pack manifest ({exc})",
                            "export the pack again with farm tune --export DIR") from exc
        if theirs[1] != tvm.__version__:
            raise FarmError(f"{in_dir} was tuned with TVM {theirs[1]}; this farm runs TVM {tvm.__version__}",
                            "import it into a farm with that TVM, or tune here: records do not carry across versions")
        if theirs[0] != target:
            raise FarmError(f"{in_dir} was tuned for target {json.dumps(theirs[0], sort_keys=True)}, not "
                            f"{device.name!r}'s {json.dumps(target, sort_keys=True)}",
                            "import it for a device with that target (farm devices shows each device's target)")
        model_file = in_dir / ((manifest.get("cost_model") or {}).get("file") or "cost_model.npz")
        if model_file.exists():
            blob = model_file.read_bytes()
            probe = new_cost_model(1)
            samples = load_cost_model(probe, blob)  # read and checked as data before it is kept
            ours = store.cost_model(key)
            if ours is None or ours[2] < samples:
                store.save_cost_model(key, blob, FORMAT, samples, None)
    return _sync(in_dir, store, key, None)
