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
from typing import Callable

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import LocalBuilder
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, RPCConfig, RPCRunner
from tvm.ir.utils import derived_object
from tvm.support.popen_pool import PopenPoolExecutor

from farm.compile import effective_target, make_target, toolchain_for, tuning_key, tuning_module
from farm.errors import BuildError, DeviceUnavailable, FarmError, ModelError, TrackerError, first_line
from farm.records import Device, ModelSource, TrackerAddress, TuningSet, target_kind
from farm.rpc.session import request_session
from farm.rpc.tracker import query_summary
from farm.store import Store
from farm.sweep import tuning_set

log = logging.getLogger(__name__)

FAILED_RUN_S = 1e9  # MetaSchedule stores failed candidates with 1e10 s


class _StopTuning(Exception):
    """Raised from the measure callback to end a session (time budget, interrupt, lost device)."""


@dataclass(frozen=True)
class TuneConfig:
    trials: int = 64
    per_task: int | None = None
    minutes: float | None = None
    tasks: str | None = None  # only tasks whose name contains this
    trials_per_iter: int = 16
    builder_timeout_s: float = 120.0  # the first batch can be slow: workers import TVM
    runner_timeout_s: float = 60.0  # per candidate on the device (TVM's 10 s is short for phones)
    request_timeout_s: float = 30.0  # wait for a free device per candidate
    seed: int = 0


@dataclass
class TaskProgress:
    name: str
    trials: int = 0
    best_s: float | None = None


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


Progress = Callable[[str], None]


def _build(mod, target, _params):
    """MetaSchedule's default build without importing tensor intrinsics (15-30 s per worker)."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def _export(toolchain: str, mod) -> str:
    """Export a candidate as a shared library the device can load (cross-linked when needed)."""
    path = os.path.join(tempfile.mkdtemp(prefix="farm-cand-"), "candidate.so")
    if toolchain:
        from tvm.support import cc

        mod.export_library(path, fcompile=cc.cross_compiler(toolchain))
    else:
        mod.export_library(path)
    return path


def _session(host: str, port: int, key: str, request_timeout_s: float, session_timeout_s: float, _config):
    """RPCRunner's session factory, with a bounded wait (TVM's blocks forever on a missing key).

    A key with no server at all fails at once: the device is gone, not busy."""
    tracker = TrackerAddress(host, port)
    status = query_summary(tracker).keys.get(key)
    if status is None or status.servers == 0:
        raise DeviceUnavailable(f"no server registered under key {key!r}", "the device left the tracker")
    return request_session(tracker, key, request_timeout_s, session_timeout_s)


def _sync(work_dir: Path, store: Store, key: str, session_id: int) -> int:
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
    the session then ends after the batch in flight, status "interrupted", every record kept."""
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
    prior = tuning_set(store, device)
    _write_database(work_dir, prior)
    session_id = store.start_tune_session(device, model, key, target, tvm.__version__, config.trials)
    progress_by_task = [TaskProgress(t.task_name) for t in tasks]
    state = {"status": "done", "reason": "", "trials": 0, "new": 0}
    deadline = start + config.minutes * 60 if config.minutes else None

    @derived_object
    class FarmCallback(ms.measure_callback.PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
            task = progress_by_task[task_id]
            task.trials += len(runner_results)
            state["trials"] += len(runner_results)
            for result in runner_results:
                if result.error_msg is None and result.run_secs:
                    best = min(float(s) for s in result.run_secs)
                    task.best_s = best if task.best_s is None else min(task.best_s, best)
            state["new"] += _sync(work_dir, store, key, session_id)
            elapsed = time.monotonic() - start
            eta = elapsed / state["trials"] * max(config.trials - state["trials"], 0) if state["trials"] else 0
            best = f"{task.best_s * 1e6:.1f} µs" if task.best_s else "-"
            say(f"task {task_id + 1}/{len(tasks)} {task.name}: {task.trials} trials, best {best} · "
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
            if deadline and time.monotonic() > deadline and state["status"] == "done":
                state["status"], state["reason"] = "time-budget", f"stopped after {config.minutes:g} min"
            if should_stop is not None and should_stop() and state["status"] == "done":
                state["status"], state["reason"] = "interrupted", "interrupted by the user"
            if state["status"] != "done":
                # Terminating tasks from a callback trips the scheduler's checks; an exception ends
                # tune_tasks cleanly instead, after this batch's records were synced above.
                raise _StopTuning(state["reason"])

    builder = LocalBuilder(timeout_sec=config.builder_timeout_s, f_build=_build,
                           f_export=functools.partial(_export, toolchain), max_workers=os.cpu_count())
    runner = RPCRunner(
        RPCConfig(tracker.host, tracker.port, device.key, session_timeout_sec=int(config.runner_timeout_s)),
        EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20, enable_cpu_cache_flush=False),
        f_create_session=functools.partial(_session, tracker.host, tracker.port, device.key,
                                           config.request_timeout_s, config.runner_timeout_s),
    )
    runner.pool = PopenPoolExecutor(max_workers=1, timeout=config.runner_timeout_s + config.request_timeout_s)
    database = ms.database.JSONDatabase(str(work_dir / "database_workload.json"),
                                        str(work_dir / "database_tuning_record.json"))
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, str(work_dir), seed=config.seed)
    say(f"{len(tasks)} task(s), {len(prior.records)} record(s) already in the store for this target")
    try:
        ms.tune.tune_tasks(
            tasks=contexts, task_weights=weights, work_dir=str(work_dir), max_trials_global=config.trials,
            max_trials_per_task=config.per_task, num_trials_per_iter=config.trials_per_iter,
            builder=builder, runner=runner, database=database, cost_model="xgb",
            measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), FarmCallback()],
        )
    except KeyboardInterrupt:
        state["status"], state["reason"] = "interrupted", "interrupted by the user"
    except Exception:  # _StopTuning comes back wrapped by TVM's FFI; an interrupt inside C++ too
        if state["status"] == "done":
            if should_stop is None or not should_stop():
                raise
            state["status"], state["reason"] = "interrupted", "interrupted by the user"
    finally:
        state["new"] += _sync(work_dir, store, key, session_id)
        store.finish_tune_session(session_id, state["status"], state["reason"], state["trials"])
    total = len(store.tuning_lines(key)[1])
    return TuneOutcome(session_id, key, state["status"], state["reason"], state["trials"], state["new"], total,
                       tuple(progress_by_task), time.monotonic() - start)


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
        raise BuildError(f"cannot extract tuning tasks from {model.name}: {first_line(exc)}",
                         "check that farm compile works for this model and device; -v shows TVM's trace") from exc


def list_tasks(device: Device, model: ModelSource) -> list[str]:
    target = make_target(effective_target(device))
    return [t.task_name for t in _extract_tasks(tuning_module(model), target, model)]


def export_database(store: Store, device: Device, out_dir: Path) -> TuningSet:
    """Write the store's records for ``device`` as MetaSchedule JSON database files."""
    tuning = tuning_set(store, device)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "database_workload.json").write_text("".join(f"{line}\n" for line in tuning.workloads))
    (out_dir / "database_tuning_record.json").write_text("".join(f"{line}\n" for line in tuning.records))
    return tuning


def import_database(store: Store, device: Device, in_dir: Path) -> int:
    """Merge MetaSchedule JSON database files (from another farm) into the store; returns new records."""
    in_dir = Path(in_dir)
    if not (in_dir / "database_workload.json").exists():
        raise FarmError(f"{in_dir} has no database_workload.json", "point --import at a MetaSchedule database folder")
    key = tuning_key(effective_target(device))
    return _sync(in_dir, store, key, None)
