"""Series: one device × model (variant included: ``mlp@fp16``) × tuned line of runs over sweeps, and the
one rule for the value each sweep contributes to it. No TVM, no database.

A series also carries the context that must not change inside a baseline: the target, the TVM
version and farm's pipeline version. A run compiled for another target or by another TVM starts a
new series (pyperf refuses to compare runs whose metadata differ for the same reason): a TVM
upgrade is a new baseline, never a regression or an improvement.

``regress`` (baselines and verdicts), ``review`` (an alert's history) and ``drift`` (change points)
all take their values from ``by_sweep``.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

SeriesKey = tuple[str, str, bool, str]  # device, model, tuned, context (JSON: target, tvm, pipeline)


def context_of(row: dict[str, Any]) -> str:
    """What must be equal for two runs to share a baseline, as one comparable string (kept in the row as
    ``series_context``: regress, review and drift each ask for it)."""
    if "series_context" not in row:
        context = row.get("context") or {}
        row["series_context"] = json.dumps({"target": context.get("target"), "tvm": row.get("tvm_version"),
                                            "pipeline": context.get("pipeline_version")}, sort_keys=True)
    return row["series_context"]


def series_key(row: dict[str, Any]) -> SeriesKey:
    return row["device"], row["model"], bool(row["tuned"]), context_of(row)


def by_sweep(rows: Iterable[dict[str, Any]], keep_unstable_of: int | None = None) -> dict[SeriesKey, dict[int, dict[str, Any]]]:
    """Each series' accepted run per sweep: the last ok, stable run of that sweep (rows of results.run_rows).

    ``keep_unstable_of``: a sweep whose last ok run counts even when unstable (the sweep being judged)."""
    series: dict[SeriesKey, dict[int, dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["run_id"]):
        if row["sweep_id"] is None or row["status"] != "ok":
            continue
        if row["unstable"] and row["sweep_id"] != keep_unstable_of:
            continue
        series.setdefault(series_key(row), {})[row["sweep_id"]] = row
    return series
