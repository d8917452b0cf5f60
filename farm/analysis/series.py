"""Series: one device × model (variant included: ``mlp@fp16``) × tuned line of runs over sweeps, and the
one rule for the value each sweep contributes to it. No TVM, no database.

A series also carries the context that must not change inside a baseline: the target, the TVM
version and farm's pipeline version (for a reference runtime's runs: that runtime and its version), and the CPU
threads the run used, where known. A run compiled for another target, by another TVM, or run on another number of
threads starts a new series (never a slowdown) (pyperf refuses to compare runs whose
metadata differ for the same reason): its baseline restarts.

The upgrade rule (#22), here and nowhere else: beside the restarted baseline, a context change is compared.
``context_changes`` pairs each series whose context changed (a new TVM, pipeline or target; a reference
runtime's new version) with the old context's last accepted nights, for the new context's first nights (until
it has a baseline of its own), so a review can say "TVM 0.27.0 → 0.28.0: 12 models 9.8 % slower". Such a
comparison cannot be confirmed by interleaved rounds (a device's server runs one TVM); its control is the
reference runtime's series on the same devices, whose context did not change.

``regress`` (baselines and verdicts), ``review`` (an alert's history) and ``drift`` (change points)
all take their values from ``by_sweep``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from farm.analysis.runs import Run

SeriesKey = tuple[str, str, bool, str]  # device, model, tuned, context (JSON: target, tvm, pipeline)


def context_of(context: dict[str, Any], tvm_version: str | None, runtime: str = "tvm", runtime_version: str = "",
               threads: int | None = None) -> str:
    """What must be equal for two runs to share a baseline, as one comparable string: ``Run.series_context``.
    TVM's runs: the target, TVM version and farm's pipeline version. A reference runtime's runs (onnxruntime …):
    that runtime and its version, never TVM's: they are the control that tells whether the device or the model
    changed when TVM did. Both: the threads, where known (runs stored before farm knew them have none, and keep
    their context unchanged)."""
    key: dict[str, Any] = {"runtime": runtime, "version": runtime_version} if runtime != "tvm" else \
        {"target": context.get("target"), "tvm": tvm_version, "pipeline": context.get("pipeline_version")}
    if threads is not None:
        key["threads"] = threads
    return json.dumps(key, sort_keys=True)


def describe_change(old: str, new: str) -> str:
    """What differs between two series contexts (``context_of``'s strings), in words: "TVM 0.27.0 → 0.28.0",
    "pipeline 2 → 3", "onnxruntime 1.19 → 1.20"; '' when they are equal."""
    before, after = json.loads(old), json.loads(new)
    names = {"tvm": "TVM", "pipeline": "pipeline", "target": "target", "runtime": "runtime"}
    parts = []
    for key in sorted(set(before) | set(after)):
        if before.get(key) == after.get(key):
            continue
        if key == "version":  # a reference runtime's own version: name the runtime
            parts.append(f"{after.get('runtime') or before.get('runtime')} {before.get(key)} → {after.get(key)}")
        elif key == "target":
            parts.append(f"target {_target_text(before.get(key))} → {_target_text(after.get(key))}")
        else:
            parts.append(f"{names.get(key, key)} {_known(before.get(key))} → {_known(after.get(key))}")
    return ", ".join(parts)


def _known(value: Any) -> str:
    return "unknown" if value is None else str(value)  # e.g. threads of runs stored before farm recorded them


def _target_text(target: Any) -> str:
    if not isinstance(target, dict):
        return str(target)
    return " ".join(f"{k}={v}" if k != "kind" else str(v) for k, v in sorted(target.items(), key=lambda kv: kv[0] != "kind"))


@dataclass(frozen=True)
class ContextChange:
    """One series across a context change: the new context's nights up to the judged sweep, the old context's
    last accepted nights (oldest first), and what changed."""

    device: str
    model: str
    tuned: bool
    runtime: str
    old_context: str
    new_context: str
    change: str  # describe_change(old_context, new_context)
    old_runs: tuple["Run", ...]
    new_runs: tuple["Run", ...]


def context_changes(accepted: dict[SeriesKey, dict[int, "Run"]], sweep_id: int, old_nights: int = 20,
                    until_nights: int = 5) -> list[ContextChange]:
    """Series of ``sweep_id`` whose new context has fewer than ``until_nights`` accepted nights before it (the new
    context has no baseline of its own yet), each with its previous context's last ``old_nights`` accepted runs.
    ``accepted``: ``by_sweep(runs, keep_unstable_of=sweep_id)``. A series is the same across the change when its
    device, model and runtime are (TVM's runs and a reference runtime's are never paired); its previous context is
    the one seen last before the new one started, the same tuned flag only breaking a tie (both measured that
    night). Recency comes first: an upgrade whose tuning records no longer apply makes the runs untuned, and they
    are compared with the tuned nights just before it, never with untuned nights from before the model was tuned
    (which would hide the records dropped)."""
    lines: dict[tuple[str, str, str], list[SeriesKey]] = {}
    for key, nights in accepted.items():
        lines.setdefault((key[0], key[1], next(iter(nights.values())).runtime), []).append(key)
    out = []
    for (device, model, runtime), keys in sorted(lines.items()):
        for now in sorted(key for key in keys if sweep_id in accepted[key]):
            new_nights = sorted(s for s in accepted[now] if s <= sweep_id)
            if len(new_nights) > until_nights:  # the new context has a baseline of its own: regress judges it
                continue
            started = new_nights[0]
            before = [(max(s for s in accepted[key] if s < started), key[2] == now[2], key) for key in keys
                      if key != now and key[3] != now[3] and any(s < started for s in accepted[key])]
            if not before:
                continue
            *_, old = max(before)
            old_runs = tuple(accepted[old][s] for s in sorted(s for s in accepted[old] if s < started)[-old_nights:])
            out.append(ContextChange(device, model, now[2], runtime, old[3], now[3], describe_change(old[3], now[3]),
                                     old_runs, tuple(accepted[now][s] for s in new_nights)))
    return out


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
