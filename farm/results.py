"""Read runs from the store and add computed summaries: one flat row per run, every run summarized in one pass."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from farm.stats import summarize_rows
from farm.store import Store

COLUMNS = [
    "run_id", "started_at", "device", "key", "model", "status", "failed_step", "reason",
    "upload_s", "load_s", "first_run_s", "load_warm_s", "first_run_warm_s", "steady_clock", "steady_number",
    "steady_n", "steady_median_s", "steady_p10_s",
    "steady_p90_s", "steady_ci_low_s", "steady_ci_high_s", "steady_cv", "unstable",
    "steady_wall_number", "steady_wall_n", "steady_wall_median_s", "steady_wall_p10_s", "steady_wall_p90_s",
    "copy_s", "copy_bytes", "copy_share", "fallback_of",
    "check", "max_abs_err", "emulated", "tuned", "tuned_tasks", "total_tasks", "sweep_id", "attempt",
    "artifact_key", "tvm_version",
    "farm_version",
]


def run_rows(store: Store, device: str | None = None, model: str | None = None, latest_only: bool = False,
             sweep_id: int | None = None, limit: int | None = None, status: str | None = None,
             intervals: bool = True) -> list[dict[str, Any]]:
    """One row per run, newest first, with its summaries (``stats.summarize_rows``: the one median rule).

    Three queries whatever the number of runs (runs, their samples, their copies), and every run's
    summaries computed together, so 50,000 runs read in seconds. ``intervals=False`` leaves out the
    bootstrap interval of the median (None), which baselines and change points do not use."""
    selection = dict(device=device, model=model, latest_only=latest_only, sweep_id=sweep_id, limit=limit, status=status)
    runs = store.runs(**selection)
    summaries = _summaries(store.run_samples(**selection), 2000 if intervals else 0)
    copies_of = store.run_copies(**selection)
    rows = []
    for run in runs:
        steady = summaries.get((run["id"], "steady", 0))
        wall = summaries.get((run["id"], "steady_wall", 0))
        copies = copies_of.get(run["id"], [])
        copy_medians = [summaries[(run["id"], "copy", c["output_index"])]["median"]
                        if (run["id"], "copy", c["output_index"]) in summaries else None for c in copies]
        # get_output's cost against one run's: the wall time where a GPU has one, else the steady figure
        per_run = wall["median"] if wall else steady["median"] if steady else None
        copy_share = sum(copy_medians) / per_run if per_run and copy_medians and None not in copy_medians else None
        rows.append({
            "run_id": run["id"], "started_at": run["started_at"], "device": run["device"], "key": run["key"],
            "model": run["model"], "model_digest": run["model_digest"], "status": run["status"], "failed_step": run["failed_step"], "reason": run["reason"],
            "upload_s": run["upload_s"], "load_s": run["load_s"], "first_run_s": run["first_run_s"],
            "load_warm_s": run["load_warm_s"], "first_run_warm_s": run["first_run_warm_s"],
            "steady_clock": run["steady_clock"],
            "steady_wall_number": run["steady_wall_number"], "steady_wall_n": wall["n"] if wall else 0,
            "steady_wall_median_s": wall["median"] if wall else None,
            "steady_wall_p10_s": wall["p10"] if wall else None, "steady_wall_p90_s": wall["p90"] if wall else None,
            "copy_share": copy_share, "fallback_of": run["fallback_of"],
            "steady_number": run["steady_number"],
            "steady_n": steady["n"] if steady else 0,
            "steady_median_s": steady["median"] if steady else None,
            "steady_p10_s": steady["p10"] if steady else None,
            "steady_p90_s": steady["p90"] if steady else None,
            "steady_ci_low_s": steady["ci_low"] if steady and intervals else None,
            "steady_ci_high_s": steady["ci_high"] if steady and intervals else None,
            "steady_cv": steady["cv"] if steady else None,
            "unstable": steady["unstable"] if steady else False,
            "copy_s": copy_medians, "copy_bytes": [c["nbytes"] for c in copies],
            "check": run["check_status"] or "skipped", "max_abs_err": run["max_abs_err"],
            "emulated": bool(run["emulated"]), "artifact_key": run["artifact_key"],
            "tuned": bool(run["tuned"]), "sweep_id": run["sweep_id"], "attempt": run["attempt"], "tuned_tasks": run["tuned_tasks"] or 0, "total_tasks": run["total_tasks"] or 0,
            "tvm_version": run["tvm_version"], "farm_version": run["farm_version"],
            "context": json.loads(run["context"]),
        })
    return rows


def _summaries(samples: tuple[list[tuple[int, str, int, int]], list[float]],
               resamples: int) -> dict[tuple[int, str, int], dict[str, Any]]:
    """(run id, metric, series) -> its summary fields, from ``Store.run_samples``; groups of the same size are
    summarized together (one matrix each)."""
    groups, flat = samples
    if not groups:
        return {}
    values = np.asarray(flat, dtype=np.float64)
    sizes = np.array([g[3] for g in groups])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    out: dict[tuple[int, str, int], dict[str, Any]] = {}
    for size in np.unique(sizes):
        picked = np.flatnonzero(sizes == size)
        columns = summarize_rows(values[starts[picked][:, None] + np.arange(size)], resamples=resamples)
        fields = {name: column.tolist() for name, column in columns.items()}
        for row, group in enumerate(picked.tolist()):
            out[groups[group][:3]] = {name: column[row] for name, column in fields.items()}
    return out


def rows_frame(rows: list[dict[str, Any]]):
    """A pandas DataFrame of ``rows`` (lists joined with ';' so CSV stays one cell per value)."""
    import pandas as pd

    flat = []
    for row in rows:
        item = {c: row[c] for c in COLUMNS}
        item["copy_s"] = ";".join("" if v is None else f"{v:.9g}" for v in row["copy_s"])
        item["copy_bytes"] = ";".join(str(v) for v in row["copy_bytes"])
        flat.append(item)
    return pd.DataFrame(flat, columns=COLUMNS)
