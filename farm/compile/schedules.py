"""Tuning records into a compile: MetaSchedule databases over the store's records (``record_databases``), each
PrimFunc scheduled by its own record or one of its anchor block (``apply_records``), and the rule for a task's
untuned code (``untuned_trace``, ``is_schedule``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import tvm

from farm.errors import message_line
from farm.records import TuningSet
from farm.tvm_private import normalize_mod

log = logging.getLogger("farm.compile.records")  # the name its warnings have always carried


def record_databases(tuning: TuningSet, folder: Path):
    """The records as two MetaSchedule databases over the same files: exact ("structural", as tuned) and by
    anchor block (``RECORD_MATCH``: a conv with another epilogue finds the conv's record)."""
    from tvm.s_tir import meta_schedule as ms

    workload_path, record_path = folder / "database_workload.json", folder / "database_tuning_record.json"
    workload_path.write_text("".join(line + "\n" for line in tuning.workloads))
    record_path.write_text("".join(line + "\n" for line in tuning.records))
    # by anchor block, another workload's untuned record (a cheaper epilogue) would rank above a schedule that
    # transfers: that database holds schedules only
    scheduled_path = folder / "database_scheduled_record.json"
    scheduled_path.write_text("".join(line + "\n" for line in tuning.records if not _untuned_line(line)))
    exact = ms.database.JSONDatabase(str(workload_path), str(record_path), allow_missing=False)
    anchor = ms.database.JSONDatabase(str(workload_path), str(scheduled_path), allow_missing=False,
                                      module_equality="anchor-block")
    return exact, anchor


def _untuned_line(line: str) -> bool:
    """A record line (``[workload, [trace, run_secs, …]]``) of a task's untuned code (``untuned_trace``)."""
    try:
        return _lookups_only(inst[0] for inst in json.loads(line)[1][0][0])
    except (ValueError, TypeError, IndexError, KeyError):
        return False


# Instructions that only look a block or loop up: a trace of these alone leaves its function as it was
LOOKUP_INSTRUCTIONS = frozenset({"GetSBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers",
                                 "GetOutputBlocks"})


def _lookups_only(instruction_names) -> bool:
    """The rule for a task's untuned code, by its trace's instruction names (a record line's or a Trace's)."""
    return all(name in LOOKUP_INSTRUCTIONS for name in instruction_names)


def untuned_trace(mod: tvm.IRModule):
    """A trace that leaves ``mod`` untuned: the root block looked up, nothing changed. ``farm tune`` records a searched
    task's untuned code with this trace and its profiled time, so that the task's own best record is not slower than
    its untuned code as profiled. (An empty trace would do the same, but MetaSchedule's databases drop a record with
    no instruction as invalid.)"""
    from tvm.s_tir import Schedule

    sch = Schedule(mod)
    sch.get_sblock("root")  # MetaSchedule's own rules annotate this block: every task has it
    return sch.trace


def is_schedule(trace) -> bool:
    """A record's trace changes its function; one of lookups only (``untuned_trace``) is its untuned code."""
    return not _lookups_only(inst.kind.name for inst in trace.insts)


def record_lines_by_identity(tuning: TuningSet) -> dict[tuple[float, ...], list[int]]:
    """Each record line's index by what a database's record keeps of it whatever database returned it (by anchor
    block, its workload's hash is that database's own): its measured run times (``applied_line``)."""
    out: dict[tuple[float, ...], list[int]] = {}
    for i, line in enumerate(tuning.records):
        try:
            out.setdefault(tuple(float(v) for v in json.loads(line)[1][1]), []).append(i)
        except (ValueError, TypeError, IndexError):
            continue
    return out


def applied_line(record, lines: dict[tuple[float, ...], list[int]]) -> int | None:
    """The index in ``TuningSet.records`` of a record a database returned (``record_lines_by_identity``): the line
    with its run times, where one line has them."""
    try:
        found = lines.get(tuple(float(v) for v in record.run_secs), [])
    except Exception:  # a record without run times: not one of ours
        return None
    return found[0] if len(found) == 1 else None


def apply_records(mod: tvm.IRModule, target: tvm.target.Target, tuning: TuningSet
                  ) -> tuple[tvm.IRModule, int, int, set[int]]:
    """``mod`` with each PrimFunc scheduled by its own record (replayed as tuned), else by the best record of the
    same anchor block (MetaSchedule's ``schedule_using_anchor_trace``, as its ApplyDatabase pass does when a
    database matches by anchor block); returns (module, functions scheduled, of which by anchor block).

    TVM's pass stops the whole compile when one transfer fails (a trace that asks for a consumer the function
    lacks, e.g. a conv with no epilogue): here that function stays untuned and the rest keep their records.
    Records are stored and tuned exactly ("structural"); only this lookup matches by anchor block, so the
    store never holds a record filed under another task's workload. The last item: the indexes in
    ``tuning.records`` of the records applied (a run's manifest names them: ``compile.provenance``)."""
    import tempfile

    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.trace_apply import schedule_using_anchor_trace

    from farm.compile.kernel_facts import TUNED_ATTR

    out = mod.clone()
    tuned = anchored = 0
    lines, used = record_lines_by_identity(tuning), set()
    with tempfile.TemporaryDirectory(prefix="farm-tuning-") as tmp:
        exact, anchor = record_databases(tuning, Path(tmp))
        for gv, func in mod.functions.items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            task = normalize_mod(func)
            try:
                record = exact.query_tuning_record(task, target, gv.name_hint)
                if record is not None:
                    if not is_schedule(record.trace):  # its best is its untuned code: no schedule beat it
                        continue
                    sch = Schedule(record.workload.mod)
                    record.trace.apply_to_schedule(sch, remove_postproc=False)
                else:
                    record = anchor.query_tuning_record(task, target, gv.name_hint)
                    if record is None:  # (the anchor-block database holds schedules only: record_databases)
                        continue
                    sch = Schedule(task)
                    schedule_using_anchor_trace(sch, record.trace, target)
                    anchored += 1
            except Exception as exc:  # TVM's schedule errors, many types: this function stays untuned
                log.info("the record for %s did not apply (left untuned): %s", gv.name_hint, message_line(exc))
                continue
            if (line := applied_line(record, lines)) is not None:
                used.add(line)
            scheduled = next(iter(sch.mod.functions.values()))
            out[gv] = tvm.tirx.PrimFunc(scheduled.params, scheduled.body, scheduled.ret_type,
                                        attrs=func.attrs).with_attr("tirx.is_scheduled", True).with_attr(TUNED_ATTR, True)
            tuned += 1
    return out, tuned, anchored, used
