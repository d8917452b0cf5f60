"""Slow drift: where a series' nightly history changed level (change points, exact optimal partitioning).

Nightly z-scores compare one night with a baseline and miss a series that creeps: 1 % a week
never trips a 2 % threshold, yet a quarter later the model is 12 % slower. The drift view
segments each series' whole history instead: the segmentation that minimizes the L2 cost on log
values (so a shift is relative) plus a penalty ``PENALTY × σ² × ln n`` per change point, σ the
night-to-night noise estimated from the series itself (``stats.robust_sd`` of successive differences), at least
``MIN_SIZE`` nights per segment. Shifts smaller than ``MIN_CHANGE`` are merged away. No TVM, no database.

That objective is PELT's; ``segment_l2`` solves it exactly by dynamic programming over every split
(a year of nights is a few hundred points: no pruning needed), in ~1 ms a series where ruptures'
PELT took ~20 ms (1,000 series: 1 s, not 20), and on 1 of 600 random short series it found a lower
cost than ruptures did (its admissible-point pruning missed the optimum). The series of one length are segmented
together (``segment_l2_many``: each step of the programme over all of them at once): a 50-night store's 1,000
series in 0.4 s of CPU, drift_rows included (tools/bench_findings.py's lab), where one by one took 2–5 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from farm.analysis.series import by_sweep
from farm.stats import nonempty_median, robust_sd

if TYPE_CHECKING:
    from farm.analysis.runs import Run

MIN_SIZE = 3
MIN_NIGHTS = 2 * MIN_SIZE  # a series shorter than two segments is not segmented
MIN_CHANGE = 0.02
PENALTY = 5.0  # on 400 generated 30-night series: 1.3 % of flat 3 %-noise series, 99 % of 10 % steps found
NOISE_FLOOR = 0.002  # σ of log values below which nights count as identical (0.2 %)


@dataclass(frozen=True)
class Segment:
    start: int  # index of its first night
    end: int  # one past its last night
    median: float


@dataclass(frozen=True)
class Drift:
    segments: tuple[Segment, ...]
    noise: float  # σ of log values: night-to-night relative noise

    @property
    def change_points(self) -> list[int]:
        return [s.start for s in self.segments[1:]]

    @property
    def total_change(self) -> float:
        """Last segment's median against the first's: +0.12 = 12 % slower."""
        return self.segments[-1].median / self.segments[0].median - 1.0


def noise_of(log_values: np.ndarray) -> float:
    """σ of night-to-night noise: the robust spread of successive differences (blind to the level shifts being
    looked for), at least ``NOISE_FLOOR``."""
    if len(log_values) < 2:
        return NOISE_FLOOR
    return max(robust_sd(log_values, of_differences=True), NOISE_FLOOR)


def segment_l2(values: np.ndarray, penalty: float, min_size: int) -> list[int]:
    """Ends of the segments (the last is ``len(values)``) minimizing the sum of each segment's squared deviations
    from its mean plus ``penalty`` per change point, every segment at least ``min_size`` long."""
    return segment_l2_many(np.asarray(values, dtype=np.float64)[None, :], np.asarray([penalty]), min_size)[0]


def segment_l2_many(values: np.ndarray, penalties: np.ndarray, min_size: int) -> list[list[int]]:
    """``segment_l2`` of each row of ``values`` (series × nights, one length) with its row of ``penalties``: the
    same dynamic programme and the same arithmetic, each step taken for every series at once (a report's 1,000
    series of 50 nights: 50 numpy steps, not 50,000)."""
    count, size = values.shape
    zero = np.zeros((count, 1))
    s1 = np.concatenate([zero, np.cumsum(values, axis=1)], axis=1)
    s2 = np.concatenate([zero, np.cumsum(values * values, axis=1)], axis=1)
    best = np.full((count, size + 1), np.inf)
    best[:, 0] = -penalties  # the first segment is not a change point
    start_of = np.zeros((count, size + 1), dtype=int)
    every = np.arange(count)
    for end in range(min_size, size + 1):
        starts = np.arange(0, end - min_size + 1)
        starts = starts[(starts == 0) | (starts >= min_size)]  # the segment before a start is long enough too
        cost = s2[:, end, None] - s2[:, starts] - (s1[:, end, None] - s1[:, starts]) ** 2 / (end - starts)
        total = best[:, starts] + cost + penalties[:, None]
        pick = np.argmin(total, axis=1)
        best[:, end], start_of[:, end] = total[every, pick], starts[pick]
    out = []
    for row in start_of:
        ends, end = [], size
        while end > 0:
            ends.append(end)
            end = int(row[end])
        out.append(ends[::-1])
    return out


def find_drift(values: Sequence[float], min_size: int = MIN_SIZE, min_change: float = MIN_CHANGE,
               penalty: float = PENALTY) -> Drift | None:
    """Segments of a positive series, oldest first; None when it is too short to segment."""
    return find_drifts([values], min_size, min_change, penalty)[0]


def find_drifts(series: Sequence[Sequence[float]], min_size: int = MIN_SIZE, min_change: float = MIN_CHANGE,
                penalty: float = PENALTY) -> list[Drift | None]:
    """``find_drift`` of each series; the series of one length are segmented together (``segment_l2_many``)."""
    raws = [np.asarray(values, dtype=np.float64) for values in series]
    out: list[Drift | None] = [None] * len(raws)
    by_size: dict[int, list[int]] = {}
    for i, raw in enumerate(raws):
        if raw.size >= 2 * min_size and not np.any(raw <= 0):
            by_size.setdefault(raw.size, []).append(i)
    for size, members in by_size.items():
        logs = np.log(np.stack([raws[i] for i in members]))
        sigmas = np.asarray([noise_of(row) for row in logs])
        for i, sigma, ends in zip(members, sigmas, segment_l2_many(logs, penalty * sigmas ** 2 * np.log(size),
                                                                   min_size)):
            out[i] = _merged(raws[i], ends, float(sigma), min_change)
    return out


def _merged(raw: np.ndarray, ends: list[int], sigma: float, min_change: float) -> Drift:
    """The segments ending at ``ends``, a shift below ``min_change`` joined to the segment before it."""
    bounds = [0, *ends]
    segments = [Segment(a, b, nonempty_median(raw[a:b])) for a, b in zip(bounds, bounds[1:])]
    merged = [segments[0]]
    for segment in segments[1:]:  # a shift below min_change is no shift: join the segments
        last = merged[-1]
        if abs(segment.median / last.median - 1.0) < min_change:
            merged[-1] = Segment(last.start, segment.end, nonempty_median(raw[last.start:segment.end]))
        else:
            merged.append(segment)
    return Drift(tuple(merged), sigma)


def manifest_changes(runs: Sequence["Run"]) -> list[dict[str, Any]]:
    """The nights (runs oldest first) whose run names another manifest than the night before (``farm.manifest``):
    {"sweep", "from", "to"} digests; a night without one (stored before farm read manifests) is no change."""
    out = []
    for before, now in zip(runs, runs[1:]):
        if before.manifest and now.manifest and before.manifest != now.manifest:
            out.append({"sweep": now.sweep_id, "from": before.manifest, "to": now.manifest})
    return out


def drift_rows(rows: list[Run], metric_value: Callable[[Run], float | None],
               min_nights: int = MIN_NIGHTS) -> list[dict[str, Any]]:
    """Per series (``series.by_sweep``: device, model, tuned and their context: target, TVM, pipeline, runtime,
    threads) with enough sweeps: its runtime and threads (the last sweep's run: a change of either is another
    series), its segments and total change, and the nights its manifest changed (``manifest_changes``).

    ``rows``: results.run_rows; one value per sweep (its last ok, stable run); ``metric_value(row)``."""
    out = []
    kept: list[tuple] = []
    for (device, model, tuned, _), accepted in sorted(by_sweep(rows).items(), key=lambda item: item[0]):
        sweeps = sorted(accepted)
        measured = [metric_value(accepted[s]) for s in sweeps]
        values = [v for v in measured if v is not None]
        if len(values) < min_nights or len(values) < len(measured):  # a sweep without the metric: no series
            continue
        kept.append((device, model, tuned, accepted[sweeps[-1]], sweeps, values, accepted))
    for (device, model, tuned, last, sweeps, values, accepted), drift in zip(kept, find_drifts([k[5] for k in kept])):
        if drift is None:
            continue
        out.append({
            "device": device, "model": model, "tuned": tuned, "runtime": last.runtime, "threads": last.threads,
            "sweeps": sweeps, "values": values,
            "noise": drift.noise, "total_change": drift.total_change,
            "change_points": [sweeps[i] for i in drift.change_points],
            "segments": [{"first_sweep": sweeps[s.start], "last_sweep": sweeps[s.end - 1], "nights": s.end - s.start,
                          "median": s.median} for s in drift.segments],
            "manifest_changes": manifest_changes([accepted[s] for s in sweeps]),
        })
    return out
