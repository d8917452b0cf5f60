"""A session's tuning records: the store's copied into MetaSchedule's working database and back, and the records
farm adds before the search (the untuned guard, the seeds by anchor block).

The store is the source of truth: each session writes the store's records for its tuning key into a fresh
MetaSchedule JSON database (``write_database``) and copies every new record back (``sync``) after each measured
batch and when it ends, so a crash keeps every measured record. A record's time is one rule, ``record_s``.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tvm.s_tir import meta_schedule as ms

from farm.compile import is_schedule, record_databases, untuned_trace
from farm.errors import FarmError, message_line
from farm.records import Device, Say, TrackerAddress, TuningSet, cold_weights
from farm.store import Store
from farm.tune.task_profile import time_modules
from farm.tune.config import TuneConfig
from farm.tune.metaschedule import build_candidate, export_to
from farm.tune.plan import Plan, Tuning
from farm.tvm_private import normalize_mod

log = logging.getLogger("farm.tune.records")  # the name its warnings have always carried

FAILED_RUN_S = 1e9  # MetaSchedule stores failed candidates with 1e10 s


def record_s(run_secs: Any) -> float | None:
    """A record's time: the mean of its run seconds; None when its candidate failed (or has none).

    The mean because MetaSchedule ranks a database's records by it (``get_top_k``), and so ``compile.apply_records``
    applies the best by it: the store's ``run_s``, a task's best so far, the untuned guard and the seeds all use
    this rule, so the time farm shows for a task is the time of the record that compiles."""
    secs = [float(getattr(v, "value", v)) for v in (run_secs or [])]
    return sum(secs) / len(secs) if secs and max(secs) < FAILED_RUN_S else None


def write_database(work_dir: Path, tuning: TuningSet) -> None:
    """``tuning`` as MetaSchedule's JSON database files in a fresh ``work_dir``."""
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)  # JSONDatabase does not create its directory
    write_database_files(work_dir, tuning)


def write_database_files(folder: Path, tuning: TuningSet) -> None:
    (folder / "database_workload.json").write_text("".join(f"{line}\n" for line in tuning.workloads))
    (folder / "database_tuning_record.json").write_text("".join(f"{line}\n" for line in tuning.records))


def sync(work_dir: Path, store: Store, key: str, session_id: int | None) -> int:
    """Copy the working database's records into the store (each with its ``record_s``); a torn last line is
    skipped. Returns the records new to the store."""
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
            records.append((index, json.dumps(body), record_s(body[1] if body else None)))
    return store.add_tuning_lines(key, workloads, records, session_id)


def prior_databases(prior: TuningSet):
    """The store's records for the session as MetaSchedule databases, exact and by anchor block (``compile``'s
    pair), loaded once and only queried; None when there are none."""
    if not prior.records:
        return None
    with tempfile.TemporaryDirectory(prefix="farm-prior-") as tmp:
        return record_databases(prior, Path(tmp))  # read whole at construction: the files are not needed after


def best_recorded(exact, tasks: tuple, tvm_target) -> tuple[float | None, ...]:
    """Each task's best stored record's time (``record_s``), or None: no record of its own."""
    best: list[float | None] = []
    for task in tasks:
        record = exact.query_tuning_record(normalize_mod(task.dispatched[0]), tvm_target, task.task_name)
        tuned = record is not None and is_schedule(record.trace)  # an untuned record: no record of its own yet
        best.append(record_s(record.run_secs) if tuned else None)
    return tuple(best)


def searched_before(exact, tasks: tuple) -> tuple[bool, ...]:
    """Whether each task has a candidate of its own in the store: any record with a schedule, a failed one or one that
    lost to the task's untuned code included (its untuned record alone is not a search; a seed transferred by
    anchor block and measured is one)."""
    # every record, failed ones too (get_top_k skips those); a record holds its database's workload object
    scheduled = [record.workload for record in exact.get_all_tuning_records() if is_schedule(record.trace)]
    searched = []
    for task in tasks:
        mod = normalize_mod(task.dispatched[0])
        # commit_workload only looks up a workload the database has (these databases' files are gone: read only)
        workload = exact.commit_workload(mod) if exact.has_workload(mod) else None
        searched.append(workload is not None and any(workload.same_as(w) for w in scheduled))
    return tuple(searched)


def _commit(database, workload, trace, run_secs: list[float], tvm_target, scheduled) -> None:
    """A record of ``workload``: ``trace`` timed at ``run_secs``, its arguments those of ``scheduled``'s function."""
    database.commit_tuning_record(ms.database.TuningRecord(
        trace, workload, run_secs, tvm_target, ms.arg_info.ArgInfo.from_prim_func(next(iter(scheduled.functions.values())))))


def commit_untuned(database, contexts: list, plan: Plan, tvm_target) -> list[int]:
    """Each task to search whose untuned time is known, that has no record faster than it and no untuned record yet
    gets its untuned code as a record (``compile.untuned_trace``, the profile's time): the task's best record of its
    own is then not slower than its untuned code as profiled, so ``compile.apply_records`` (which applies the best)
    leaves a task whose candidates all lost (mlp's 1 µs matmuls) as it was. Tasks not searched, targets not profiled
    (GPUs, ``--no-profile``) and records transferred by anchor block get no such guard. Returns the tasks."""
    committed = []
    for index in plan.searched:
        secs, mod = plan.untuned_s(index), contexts[index].mod
        if secs is None:
            continue
        workload = database.commit_workload(mod)  # (its search commits it anyway)
        records = database.get_top_k(workload, 100_000)  # best first
        if records and (record_s(records[0].run_secs) or FAILED_RUN_S) < secs:
            continue  # beaten
        if any(not is_schedule(r.trace) for r in records):
            continue  # recorded once, by the first session that profiled it: a later profile's noise changes nothing
        try:
            trace = untuned_trace(mod)
        except Exception as exc:  # TVM's schedule errors: a task without a root block keeps no such record
            log.info("no untuned record for %s: %s", contexts[index].task_name, message_line(exc))
            continue
        _commit(database, workload, trace, [secs], tvm_target, mod)
        committed.append(index)
    return committed


def seed_by_anchor(tracker: TrackerAddress, device: Device, tuning: Tuning, plan: Plan, contexts: list, database,
                   config: TuneConfig, say: Say) -> dict[int, list[float]]:
    """Each task to search that has no schedule of its own but one of the same anchor block (another model's conv
    with another epilogue: what ``compile.apply_records`` would use) starts from it: the record's schedule is
    transferred to the task, timed on the device like a candidate, and committed as the task's first record, so
    MetaSchedule's search seeds its population with it. A transferred schedule slower than the task's untuned
    time is not committed (it would seed the search with a loser). Returns {task: its run seconds, [] when timed
    and refused}; a transfer or a timing that fails is said and skipped (the search starts as it would have)."""
    if not plan.searched or plan.known is None:
        return {}
    try:
        picked = _transferred(tuning, plan, contexts, say)
        return _seeds(tracker, device, tuning, plan, contexts, picked, database, config, say) if picked else {}
    except Exception as exc:  # TVM's errors, many types: seeds are a head start, never a failed session
        log.info("seeding by anchor block failed", exc_info=True)
        say(f"no seeds by anchor block: {message_line(exc)}")
        return {}


def _transferred(tuning: Tuning, plan: Plan, contexts: list, say: Say) -> list[tuple[int, Any]]:
    """(task, its schedule) for each task to search without a schedule of its own whose anchor block has a record
    that transfers to it."""
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.trace_apply import schedule_using_anchor_trace

    anchor = plan.known[1]
    picked = []
    for index in plan.searched:
        mod, name = contexts[index].mod, contexts[index].task_name
        if plan.recorded[index] is not None:
            continue  # a schedule of its own (best_recorded; a task with only its untuned record is seeded)
        record = anchor.query_tuning_record(mod, tuning.tvm_target, name)
        if record is None:  # (the anchor-block database holds schedules only: compile.record_databases)
            continue
        try:
            sch = Schedule(mod)
            schedule_using_anchor_trace(sch, record.trace, tuning.tvm_target)
        except Exception as exc:  # TVM's schedule errors: this task's search starts from nothing
            say(f"  {name}: the record of its anchor block does not transfer ({message_line(exc)})")
            continue
        picked.append((index, sch))
    return picked


def _seeds(tracker: TrackerAddress, device: Device, tuning: Tuning, plan: Plan, contexts: list,
           picked: list[tuple[int, Any]], database, config: TuneConfig, say: Say) -> dict[int, list[float]]:
    """``picked``'s schedules timed on the device; each not slower than its task's untuned code is committed."""
    say(f"timing {len(picked)} schedule(s) transferred by anchor block from other tasks' records")
    try:
        runs = time_modules(tracker, device, [(contexts[i].task_name, sch.mod) for i, sch in picked], tuning.tvm_target,
                            functools.partial(export_to, tuning.toolchain), config.request_timeout_s, number=3, repeat=1,
                            build_fn=build_candidate, cold=cold_weights(tuning.target))
    except FarmError as exc:
        say(f"{exc.message}; the search starts without them")
        return {}
    seeds: dict[int, list[float]] = {}
    for (index, sch), secs in zip(picked, runs):
        name, untuned, seed_s = contexts[index].task_name, plan.untuned_s(index), record_s(secs) or FAILED_RUN_S
        if untuned is not None and seed_s >= untuned:
            say(f"  {name}: its anchor block's record is slower here ({seed_s * 1e6:.1f} µs) "
                f"than untuned ({untuned * 1e6:.1f} µs): not used")
            seeds[index] = []
            continue
        _commit(database, database.commit_workload(contexts[index].mod), sch.trace, [float(s) for s in secs],
                tuning.tvm_target, sch.mod)
        seeds[index] = secs
        say(f"  {name}: starts from a record of its anchor block, {seed_s * 1e6:.1f} µs")
    return seeds
