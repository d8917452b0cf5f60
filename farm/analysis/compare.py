"""Two runs, or two nights, side by side: what `farm compare` prints and the dashboard's compare pages draw (#64).

Two runs: their raw steady samples (``regress.compare_samples``: Mann-Whitney U and Kolmogorov-Smirnov) and, where
both were profiled, the kernels that account for the change (``kernel_diff``). A change the samples show is put on
its kernels, except where both runs ran one library: then no kernel's code changed, and every kernel moves with the
device's state (the moves are still listed).

Two nights (``compare_nights``): every series measured in both sweeps (device × model label × runtime, its accepted
run of each night: ``series.by_sweep``), its change with an interval (from the two runs' bootstrap intervals of the
median: ``[low_b / high_a − 1, high_b / low_a − 1]``), "shown" when that interval excludes 0 (the intervals do not
overlap: no raw sample is read, so a year-scale night compares in one read of its runs), sorted by size, grouped by
device and by model as findings name them, and the kernels where both runs were profiled, for the series shown moved
(the ``KERNELS_NAMED`` largest).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from farm.errors import FarmError
from farm.analysis.kernel_diff import KernelDiff, kernel_diff
from farm.records import BenchConfig
from farm.analysis.regress import compare_samples
from farm.analysis.results import run_rows
from farm.analysis.runs import Run
from farm.analysis.series import by_sweep
from farm.stats import model_label
from farm.store import Store

MIN_SAMPLES = 3  # each run's steady samples, at least, for the two-sample tests
KERNELS_NAMED = 100  # series of two nights whose kernels are compared: those the intervals show moved, largest first


def compare_runs(store: Store, run_a: int, run_b: int) -> dict[str, Any]:
    """Run A against run B: the samples' verdict and the kernels' difference, as `farm compare --json` gives it.
    FarmError when a run is missing or has too few samples."""
    runs = {run_id: store.run(run_id) for run_id in (run_a, run_b)}  # two rows, not the store's every run
    for run_id, found in runs.items():
        if found is None:
            raise FarmError(f"no run {run_id} in {store.path}", "see farm results")
    a, b = store.samples(run_a), store.samples(run_b)
    if len(a) < MIN_SAMPLES or len(b) < MIN_SAMPLES:
        raise FarmError(f"each run needs at least {MIN_SAMPLES} steady samples to compare",
                        f"bench with --repeat {BenchConfig().repeat}")
    profiles = store.profiles([run_a, run_b])
    result = compare_samples(a, b)
    same = same_library(runs[run_a], runs[run_b])
    diff, why = kernels_of(profiles, run_a, run_b, same)
    named = result.verdict in ("slower", "faster") and not same
    return {"run_a": run_a, "run_b": run_b, **asdict(result), "runs": runs,
            "kernels": {**diff.to_json(), "named": named, "same_library": same} if diff is not None else {
                "status": "not available", "reason": why}}


def same_library(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    return a is not None and b is not None and a["artifact_key"] == b["artifact_key"] != ""


def kernels_of(profiles, run_a: int, run_b: int, same: bool) -> tuple[KernelDiff | None, str]:
    """(the kernels' difference from run A to run B, '') or (None, why there is none)."""
    for run_id in (run_a, run_b):
        profile = profiles.get(run_id)
        if profile is None:
            return None, f"run {run_id} has no profile (bench it with --profile)"
        if profile.status != "ok":
            return None, f"run {run_id}'s profile is not available: {profile.reason}"
    return kernel_diff(profiles[run_a], profiles[run_b], same_artifact=same), ""


@dataclass(frozen=True)
class SeriesChange:
    """One series of two nights: its runs, its change and interval, whether the intervals say so."""

    device: str
    model: str  # model label (variant, tuned, runtime)
    run_a: int
    run_b: int
    median_a: float
    median_b: float
    change: float
    low: float
    high: float
    shown: bool
    kernels: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def compare_nights(store: Store, sweep_a: int, sweep_b: int) -> dict[str, Any]:
    """Every series of two sweeps, largest change first, with its interval and kernels; grouped by device and by model
    (each group: series moved of those compared, their geometric mean change). FarmError for a sweep with no run."""
    nights = {}
    for sweep in (sweep_a, sweep_b):
        rows = run_rows(store, sweep_id=sweep)
        if not rows:
            raise FarmError(f"sweep {sweep} has no runs in {store.path}", "farm sweep --status lists the sweeps")
        nights[sweep] = {_line(key, runs[sweep]): runs[sweep] for key, runs in by_sweep(rows, keep_unstable_of=sweep).items()}
    both = sorted(nights[sweep_a].keys() & nights[sweep_b].keys())
    pairs = [(nights[sweep_a][line], nights[sweep_b][line]) for line in both]
    pairs = [(a, b) for a, b in pairs if a.steady is not None and b.steady is not None and a.steady.median]
    changes = sorted((_change(a, b) for a, b in pairs), key=lambda c: -abs(c.change))
    # the kernels of the series the intervals show moved, the largest first (a mass night's every profile is not read)
    named = [c for c in changes if c.shown][:KERNELS_NAMED]
    profiles = store.profiles([r for c in named for r in (c.run_a, c.run_b)])
    by_run = {r.run_id: r for pair in pairs for r in pair}
    wanted = {(c.run_a, c.run_b) for c in named}
    for i, c in enumerate(changes):
        if (c.run_a, c.run_b) in wanted:
            diff, _ = kernels_of(profiles, c.run_a, c.run_b, by_run[c.run_a].artifact_key == by_run[c.run_b].artifact_key != "")
            changes[i] = replace(c, kernels=diff.headline() if diff is not None else "")
    return {"sweep_a": sweep_a, "sweep_b": sweep_b, "series": [c.to_json() for c in changes],
            "only_a": len(nights[sweep_a].keys() - nights[sweep_b].keys()),
            "only_b": len(nights[sweep_b].keys() - nights[sweep_a].keys()),
            "by_device": _groups(changes, lambda c: c.device), "by_model": _groups(changes, lambda c: c.model)}


def _line(key: tuple, run: Run) -> tuple[str, str]:
    return key[0], model_label(run.model, run.tuned, run.runtime)


def _change(a: Run, b: Run) -> SeriesChange:
    sa, sb = a.steady, b.steady
    assert sa is not None and sb is not None
    change = sb.median / sa.median - 1.0
    low = sb.ci_low / sa.ci_high - 1.0 if sa.ci_high else change
    high = sb.ci_high / sa.ci_low - 1.0 if sa.ci_low else change
    return SeriesChange(a.device, model_label(a.model, a.tuned, a.runtime), a.run_id, b.run_id, sa.median, sb.median,
                        change, low, high, low > 0 or high < 0)


def _groups(changes: list[SeriesChange], key) -> list[dict[str, Any]]:
    groups: dict[str, list[SeriesChange]] = {}
    for change in changes:
        groups.setdefault(key(change), []).append(change)
    out = []
    for name, members in groups.items():
        logs = [math.log1p(c.change) for c in members]
        out.append({"name": name, "series": len(members), "shown": sum(c.shown for c in members),
                    "change": math.expm1(sum(logs) / len(logs))})
    return sorted(out, key=lambda g: -abs(g["change"]))
