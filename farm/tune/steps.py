"""``tune_model``: one tuning session in five steps.

1. check    the device can be tuned (exports .so, its key is served, a CPU target names its cores); its tasks
2. profile  each task's untuned time on the device (CPU targets, unless ``by_share`` is off)
3. plan     the trials shared by each task's time now (untuned, or its best stored record's); the store's session
4. search   MetaSchedule's search (``search.Search``), every measured batch's records copied into the store
5. finish   the last records and the cost model into the store, the session's status; the outcome
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Callable

from farm.compile import (TVM_VERSION, device_tuning_key, device_tuning_module, effective_target, make_target,
                          toolchain_for)
from farm.tune.costmodel import FORMAT, dump_cost_model, load_cost_model, new_cost_model, samples_of
from farm.devices import kind_of
from farm.errors import DeviceUnavailable, FarmError, ModelError
from farm.records import Device, ModelSource, Say, TrackerAddress, cold_weights, target_kind
from farm.rpc.tracker import query_summary
from farm.store import Store
from farm.tune.tuning_set import tuning_set
from farm.tune.task_profile import allocate_trials, profile_tasks
from farm.tune.config import TRIALS_PER_RUNNER, TuneConfig, search_population_for
from farm.tune.metaschedule import export_to, extract_tasks, load_tensor_intrinsics
from farm.tune.plan import Plan, Tuning
from farm.tune.database import best_recorded, prior_databases, searched_before, write_database
from farm.tune.search import open_search
from farm.tune.session import TaskProgress, TuneOutcome, TuneSession


def _silent(_message: str) -> None:
    pass


def tune_model(
    tracker: TrackerAddress, device: Device, model: ModelSource, store: Store, work_root: Path,
    config: TuneConfig, progress: Say | None = None, should_stop: Callable[[], bool] | None = None,
) -> TuneOutcome:
    """Tune ``model`` on ``device``. ``should_stop`` is polled after every batch (the CLI sets it on Ctrl-C):
    the session then ends after the batch in flight (tasks taking turns: the two), status "interrupted", every record
    kept."""
    say = progress or _silent
    started = time.monotonic()
    tuning = _check(tracker, device, model, config, say)
    untuned = _profile(tracker, device, tuning, config, say)
    plan = _plan(store, device, tuning, untuned, config)
    session = _start(tracker, device, model, store, Path(work_root), tuning, plan, config, say, started, should_stop)
    cost_model, samples_before = _cost_model(store, tuning.key, config)
    search = open_search(tracker, device, tuning, plan, session, cost_model, Path(work_root), config)
    search_started = time.monotonic()
    try:
        search.run()
    except KeyboardInterrupt:
        session.interrupted()
    except Exception:  # StopTuning comes back wrapped by TVM's FFI; an interrupt inside C++ too
        if not session.ended_by_stop():
            raise
    finally:
        busy = search.close()
        _finish(session, cost_model)
    return TuneOutcome(
        session_id=session.session_id, tuning_key=tuning.key, status=session.status, reason=session.reason,
        trials_done=session.trials, new_records=session.new_records,
        total_records=len(store.tuning_lines(tuning.key)[1]), tasks=tuple(session.tasks),
        seconds=time.monotonic() - started, runners=tuning.runners, cost_model_samples_before=samples_before,
        cost_model_samples=samples_of(cost_model), search_seconds=time.monotonic() - search_started,
        builds_ahead=tuning.ahead, population=tuning.population, seeded=search.seeded,
        trajectory=tuple(session.trajectory),
        device_busy_seconds=sum(busy), candidates_measured=len(busy), ended_by=session.ended_by())


def _check(tracker: TrackerAddress, device: Device, model: ModelSource, config: TuneConfig, say: Say) -> Tuning:
    """Step 1: fail before any work when the device cannot be tuned; its target, tasks and runners."""
    if device.export != "so":
        raise FarmError(f"device {device.name!r} exports {device.export!r}: tuning measures candidates as shared libraries",
                        "tune on a device of the same CPU/GPU that loads .so files, then compile for this one")
    target = effective_target(device)
    toolchain = toolchain_for(device, target)
    # Fail before any work when nobody serves the key: RPCRunner would wait forever.
    status = query_summary(tracker).keys.get(device.key)
    if status is None or status.servers == 0:
        raise DeviceUnavailable(f"no server is registered under key {device.key!r} at {tracker}",
                                "bring the device up first: farm serve, then farm devices")
    if "num-cores" not in target and target_kind(target.get("host") or target) == "llvm" and target_kind(target) == "llvm":
        raise FarmError(f"device {device.name!r}: MetaSchedule needs the target's core count",
                        f"add num-cores = N to the target of {device.name!r} in devices.toml")
    tvm_target = make_target(target)
    tasks = extract_tasks(device_tuning_module(model, device, target), tvm_target, model)
    if config.tasks:
        tasks = [t for t in tasks if config.tasks in t.task_name]
    if not tasks:
        raise ModelError(f"no tuning tasks in {model.name}" + (f" match {config.tasks!r}" if config.tasks else ""),
                         "list them with farm tune --list-tasks")
    say("loading MetaSchedule's tensor intrinsics")
    load_tensor_intrinsics(target)
    runners = max(1, min(config.max_runners, status.free or 1))  # each runner holds one server of the key
    ahead = config.builds_ahead if config.builds_ahead is not None else not kind_of(device).measures_on_this_host
    batch = config.trials_per_iter or TRIALS_PER_RUNNER * runners
    return Tuning(target, tvm_target, toolchain, device_tuning_key(device, target), tuple(tasks), runners, batch,
                  ahead, search_population_for(device, config, batch))


def _profile(tracker: TrackerAddress, device: Device, tuning: Tuning, config: TuneConfig,
             say: Say) -> list[float] | None:
    """Step 2: each task's untuned time on the device, or None: not asked, a GPU target (unscheduled kernels do
    not build), or a profile that failed (said, and MetaSchedule's scheduler shares the trials)."""
    if not config.by_share or target_kind(tuning.tvm_target.export()) != "llvm":
        return None
    say(f"timing {len(tuning.tasks)} task(s) untuned on {device.name} to share {config.trials} trials by time")
    try:
        return profile_tasks(tracker, device, list(tuning.tasks), tuning.tvm_target,
                             functools.partial(export_to, tuning.toolchain), config.request_timeout_s,
                             cold_weights(tuning.target))
    except FarmError as exc:
        say(f"{exc.message}; {exc.hint}")
        return None


def _plan(store: Store, device: Device, tuning: Tuning, untuned: list[float] | None, config: TuneConfig) -> Plan:
    """Step 3: the trials shared by where the time is now: a task that earlier sessions tuned costs its best
    record's time, not its untuned time (each session ranking by untuned time would search the same big tasks
    again and never reach the rest)."""
    prior = tuning_set(store, device)
    known = prior_databases(prior)  # (exact, anchor block), or None: no records yet
    recorded = (best_recorded(known[0], tuning.tasks, tuning.tvm_target) if known and untuned is not None
                else (None,) * len(tuning.tasks))
    searched = searched_before(known[0], tuning.tasks) if known else (False,) * len(tuning.tasks)
    now = [min(u, r) if r is not None else u for u, r in zip(untuned, recorded)] if untuned is not None else None
    shares = allocate_trials([t.task_name for t in tuning.tasks], [int(t.weight) for t in tuning.tasks], now,
                             config.trials, config.min_share)
    return Plan(prior, known, tuple(untuned) if untuned is not None else None, recorded, searched, tuple(shares))


def _start(tracker: TrackerAddress, device: Device, model: ModelSource, store: Store, work_root: Path, tuning: Tuning,
           plan: Plan, config: TuneConfig, say: Say, started: float,
           should_stop: Callable[[], bool] | None) -> TuneSession:
    """Step 3's end: the store's session, the working database written from the store's records, what each task
    is given (said)."""
    session_id = store.start_tune_session(device, model, tuning.key, tuning.target, TVM_VERSION, config.trials)
    work_dir = work_root / f"{device.key}-{tuning.key}"
    write_database(work_dir, plan.prior)
    tasks = [TaskProgress(s.name, untuned_s=plan.untuned_s(i), share=s.share,
                          allotted=s.trials if s.share is not None else None, best_s=plan.recorded[i])
             for i, s in enumerate(plan.shares)]
    for task in sorted(tasks, key=lambda t: -(t.share or 0)):
        if task.share is not None and task.untuned_s is not None:
            tuned_text = f", {task.best_s * 1e6:.1f} µs with its best record" if task.best_s else ""
            say(f"  {task.name}: {task.share:6.1%} of the model's time now (untuned {task.untuned_s * 1e6:.1f} µs a "
                f"call{tuned_text}), {task.allotted} trial(s)")
    weights = {i: plan.shares[i].weight for i in plan.searched} if plan.by_share else None
    return TuneSession(tasks=tasks, config=config, say=say, started=started, tracker=tracker, device_key=device.key,
                       store=store, key=tuning.key, session_id=session_id, work_dir=work_dir, weights=weights,
                       should_stop=should_stop)


def _cost_model(store: Store, key: str, config: TuneConfig):
    """The cost model the search starts from (what earlier sessions on the target saved, unless ``fresh_cost_model``)
    and the samples it had learned."""
    cost_model = new_cost_model(os.cpu_count())
    saved = None if config.fresh_cost_model else store.cost_model(key)
    if saved is not None:
        load_cost_model(cost_model, saved.body)
    return cost_model, saved.samples if saved else 0


def _finish(session: TuneSession, cost_model) -> None:
    """Step 5: the last records and the cost model (the next session on this target starts from what this one
    learned) into the store, and the session's status."""
    session.sync_records()
    samples = samples_of(cost_model)
    if samples:
        session.store.save_cost_model(session.key, dump_cost_model(cost_model), FORMAT, samples, session.session_id)
    session.store.finish_tune_session(session.session_id, session.status.value, session.reason, session.trials)


def list_tasks(device: Device, model: ModelSource) -> list[str]:
    target = effective_target(device)
    tasks = extract_tasks(device_tuning_module(model, device, target), make_target(target), model)
    return [t.task_name for t in tasks]
