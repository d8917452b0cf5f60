"""Series: one device × model (variant included: ``mlp@fp16``) × tuned line of runs over sweeps, and the
one rule for the value each sweep contributes to it. No TVM, no database.

A series also carries the context that must not change inside a baseline: the target, the TVM
version and farm's pipeline version (for a reference runtime's runs: that runtime and its version). A run
compiled for another target or by another TVM starts a new series (pyperf refuses to compare runs whose
metadata differ for the same reason): a TVM upgrade is a new baseline, never a regression or an improvement.

``regress`` (baselines and verdicts), ``review`` (an alert's history) and ``drift`` (change points)
all take their values from ``by_sweep``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from farm.runs import Run

SeriesKey = tuple[str, str, bool, str]  # device, model, tuned, context (JSON: target, tvm, pipeline)


def context_of(context: dict[str, Any], tvm_version: str | None, runtime: str = "tvm", runtime_version: str = "") -> str:
    """What must be equal for two runs to share a baseline, as one comparable string: ``Run.series_context``.
    TVM's runs: the target, TVM version and farm's pipeline version. A reference runtime's runs (onnxruntime …):
    that runtime and its version, never TVM's: they are the control that tells whether the device or the model
    changed when TVM did."""
    if runtime != "tvm":
        return json.dumps({"runtime": runtime, "version": runtime_version}, sort_keys=True)
    return json.dumps({"target": context.get("target"), "tvm": tvm_version,
                       "pipeline": context.get("pipeline_version")}, sort_keys=True)


def series_key(run: "Run") -> SeriesKey:
    return run.device, run.model, run.tuned, run.series_context


def by_sweep(runs: Iterable["Run"], keep_unstable_of: int | None = None) -> dict[SeriesKey, dict[int, "Run"]]:
    """Each series' accepted run per sweep: the last ok, stable run of that sweep.

    ``keep_unstable_of``: a sweep whose last ok run counts even when unstable (the sweep being judged)."""
    series: dict[SeriesKey, dict[int, Run]] = {}
    for run in sorted(runs, key=lambda r: r.run_id):
        if run.sweep_id is None or run.status != "ok":
            continue
        if run.unstable and run.sweep_id != keep_unstable_of:
            continue
        series.setdefault(series_key(run), {})[run.sweep_id] = run
    return series
