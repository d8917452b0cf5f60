"""The read model: every stored run as one frozen ``Run`` with its summaries, read in three queries.

A run's summaries (``stats.Summary``: the one median, percentile, CV and "unstable" rule) were computed
when it was stored (``Store.record_result``); reading 50,000 runs reads no raw sample. Everything that
reads results (report, review, regress, drift, dashboard, confirmation, CLI) takes ``Run`` records
from ``run_rows``; ``series`` groups them, ``regress`` judges them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from farm.records import Record
from farm.analysis.runs import Run
from farm.analysis.series import context_of
from farm.stats import versus_text
from farm.store import Store
from farm.store.runs import RUN_TABLE

__all__ = ["COLUMNS", "Run", "Versus", "run_rows", "rows_frame", "versus_reference"]

COLUMNS = [
    "run_id", "started_at", "device", "key", "model", "status", "failed_step", "reason",
    "upload_s", "load_s", "first_run_s", "load_warm_s", "first_run_warm_s", "steady_clock", "steady_number",
    "steady_n", "steady_median_s", "steady_p10_s",
    "steady_p90_s", "steady_ci_low_s", "steady_ci_high_s", "steady_cv", "unstable",
    "steady_wall_number", "steady_wall_n", "steady_wall_median_s", "steady_wall_p10_s", "steady_wall_p90_s",
    "copy_s", "copy_bytes", "copy_share", "fallback_of",
    "check", "max_abs_err", "emulated", "tuned", "tuned_tasks", "total_tasks", "sweep_id", "attempt",
    "artifact_key", "tvm_version",
    "farm_version", "runtime", "runtime_version", "threads", "manifest",
    "params_bytes", "planned_host_bytes", "planned_device_bytes", "planned_bytes", "rss_before_load_bytes",
    "rss_after_load_bytes", "rss_peak_bytes", "rss_load_increase_bytes", "rss_peak_increase_bytes", "memory_total_bytes",
]


# Positions in a Store.run_table row, by column
_ID, _EMULATED, _TUNED, _TVM, _RUNTIME, _RUNTIME_VERSION, _CONTEXT, _THREADS = (RUN_TABLE.index(f"r.{name}") for name in (
    "id", "emulated", "tuned", "tvm_version", "runtime", "runtime_version", "context", "threads"))


def run_rows(store: Store, device: str | None = None, model: str | None = None, latest_only: bool = False,
             sweep_id: int | None = None, limit: int | None = None, status: str | None = None) -> list[Run]:
    """Every selected run, newest first, with its stored summaries: three queries (runs, summaries, copies)
    whatever the number of runs; the runs as plain tuples in ``Run``'s field order (``Store.run_table``)."""
    selection: dict[str, Any] = dict(device=device, model=model, latest_only=latest_only, sweep_id=sweep_id, limit=limit,
                                     status=status)
    table = store.run_table(**selection)
    summaries = store.run_summaries(**selection)
    copies_of = store.run_copies(**selection)
    rows = []
    contexts: dict[tuple, str] = {}  # series contexts met so far: a lab has a few targets, not one per run
    # each distinct stored context parsed once, and its series context found once (a Run is read, never changed;
    # a 50,000-run store has a few contexts a device, not one a run)
    parsed: dict[tuple, tuple[dict[str, Any], str]] = {}
    for run in table:
        run_id, tvm_version, runtime, runtime_version, stored_context, threads = (
            run[_ID], run[_TVM], run[_RUNTIME], run[_RUNTIME_VERSION], run[_CONTEXT], run[_THREADS])
        stored = (stored_context, tvm_version, runtime, runtime_version, threads)
        if (known := parsed.get(stored)) is None:
            context = json.loads(stored_context)
            seen = (tvm_version, context.get("pipeline_version"), repr(context.get("target")), runtime,
                    runtime_version, threads)
            if (series_context := contexts.get(seen)) is None:
                series_context = contexts[seen] = context_of(context, tvm_version, runtime, runtime_version, threads)
            known = parsed[stored] = (context, series_context)
        copies = copies_of.get(run_id)  # most runs have none: no generators to make for them
        copy_s = () if not copies else tuple(
            s.median if (s := summaries.get((run_id, "copy", c["output_index"]))) else None for c in copies)
        fields = (*run[:_EMULATED], bool(run[_EMULATED]), bool(run[_TUNED]), *run[_TUNED + 1:_CONTEXT], *known,
                  summaries.get((run_id, "steady", 0)), summaries.get((run_id, "steady_wall", 0)), copy_s,
                  () if not copies else tuple(c["nbytes"] for c in copies), *run[_CONTEXT + 1:])
        rows.append(Run(*fields))
    return rows


# a run's profile, as ``Store.profile_sums`` reads it: CSV's last columns (empty where the run has none)
PROFILE_COLUMNS = ["profile_status", "profile_main_s", "profile_kernel_sum_s", "profile_by_class_s"]


def rows_frame(rows: list[Run], profiles: dict[int, dict[str, Any]] | None = None):
    """A pandas DataFrame of ``rows`` (lists joined with ';' so CSV stays one cell per value), with each run's profile
    sums where ``profiles`` (``Store.profile_sums``) has them: 'conv=0.0031;pool=0.0004' by op class."""
    import pandas as pd

    columns = {c: [getattr(row, c) for row in rows] for c in COLUMNS}  # by column: 3× faster at 50,000 runs
    if profiles is not None:
        sums = [profiles.get(row.run_id) or {} for row in rows]
        columns["profile_status"] = [s.get("status") for s in sums]
        columns["profile_main_s"] = [s.get("main_s") for s in sums]
        columns["profile_kernel_sum_s"] = [s.get("kernel_sum_s") for s in sums]
        columns["profile_by_class_s"] = [";".join(f"{k}={v:.9g}" for k, v in s.get("by_class_s", {}).items())
                                         for s in sums]
    columns["copy_s"] = [";".join("" if v is None else f"{v:.9g}" for v in row.copy_s) for row in rows]
    columns["copy_bytes"] = [";".join(str(v) for v in row.copy_bytes) for row in rows]
    for name in COLUMNS:  # counts stay whole numbers where some are not known (pandas would make them floats)
        if name.endswith("_bytes") and name != "copy_bytes" or name == "threads":
            columns[name] = pd.array(columns[name], dtype="Int64")
    return pd.DataFrame(columns, columns=COLUMNS + (PROFILE_COLUMNS if profiles is not None else []))


@dataclass(frozen=True, slots=True)
class Versus(Record):
    """A TVM run beside its device × model's latest reference-runtime run (onnxruntime …), or why it has none."""

    tvm: Run
    reference: Run | None
    note: str  # why there is no reference figure ('' when there is one)

    VIEWS = ("ratio", "text")

    @property
    def ratio(self) -> float | None:
        """TVM's steady median / the reference's (> 1: TVM slower)."""
        ok = self.reference is not None and self.reference.status == "ok" and self.tvm.status == "ok"
        if not ok or not self.tvm.steady_median_s or not self.reference.steady_median_s:  # type: ignore[union-attr]
            return None
        return self.tvm.steady_median_s / self.reference.steady_median_s  # type: ignore[union-attr]

    @property
    def text(self) -> str:
        if self.ratio is None:
            return self.note
        return versus_text(self.tvm.steady_median_s, self.reference.steady_median_s,  # type: ignore[union-attr]
                           self.reference.runtime, self.tvm.threads, self.reference.threads)  # type: ignore[union-attr]


def versus_reference(runs: list[Run]) -> tuple[list[Run], dict[int, Versus]]:
    """TVM's runs among ``runs`` (latest per cell), and for each (by run id) its device × model's latest reference
    run. Without one, the note says why: the device runs none (the run's context says so), it failed, or it was not
    measured with this run (older runs, ``--tvm-only``)."""
    references: dict[tuple[str, str], Run] = {}
    for run in sorted((r for r in runs if r.is_reference), key=lambda r: r.run_id):
        references[(run.device, run.model)] = run
    tvm = [r for r in runs if not r.is_reference]
    versus = {}
    for run in tvm:
        reference = references.get((run.device, run.model))
        said = run.context.get("reference_runtime", "")
        if reference is not None and reference.status != "ok":
            note = f"{reference.runtime} failed at {reference.failed_step}: {reference.reason}"
        elif reference is None and said.startswith("no reference"):
            note = said
        elif reference is None:
            note = "no reference runtime measured"
        else:
            note = ""
        versus[run.run_id] = Versus(run, reference, note)
    return tvm, versus
