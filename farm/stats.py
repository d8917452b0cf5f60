"""Robust statistics over raw samples. No TVM, no database.

Every steady-state sample farm stores is already a mean over ``number`` calls
(that is what ``time_evaluator`` returns); these functions summarize the repeats. Every median and
robust spread in farm comes from here (``median``, ``robust_sd``): baselines, drift, confirmation rounds.
``hottest`` is the one rule for a health reading's temperature (the gates, the report's data quality, the
dashboard); ``time_unit`` and ``model_label`` the one way durations and tuned series are shown.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np

UNSTABLE_CV = 0.10
UNSTABLE_MAX_OVER_MEDIAN = 1.5
MAD_TO_SD = 1.4826  # 1 / Φ⁻¹(3/4): the MAD of normal data times this is its standard deviation
# names the arithmetic of ``summarize_rows``; the store keeps it beside the summaries it wrote and
# recomputes them when it changes (change it with any change to that arithmetic or the defaults below)
SUMMARY_RULE = "1 median+p10/p90 linear, cv ddof=1, unstable cv>=0.10|max>=1.5*median, bootstrap 95% 2000 seed 0"


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    mean: float
    p10: float
    p90: float
    min: float
    max: float
    cv: float  # standard deviation / mean
    mad: float  # 1.4826 · median absolute deviation
    ci_low: float  # bootstrap 95% interval of the median
    ci_high: float
    unstable: bool


def median(samples) -> float | None:
    """The median farm prints, stores and compares everywhere (numpy's: the mean of the middle two for an even
    count); None when there are no samples."""
    return nonempty_median(samples) if np.size(samples) else None


def nonempty_median(samples) -> float:
    """``median`` of samples that are there by construction (a baseline, a segment, a round, a copy point);
    ValueError when there are none."""
    if (short := _short_median(samples)) is not None:
        return short
    values = np.sort(np.asarray(samples, dtype=np.float64))
    if not values.size:
        raise ValueError("the median of no samples")
    return float(_sorted_percentile(values[None, :], 50.0)[0])


def robust_sd(values, of_differences: bool = False) -> float:
    """A standard deviation that outliers do not move: 1.4826 · MAD (the median absolute deviation from the
    median), which equals σ for normal data. ``of_differences``: the σ of the noise around a level that may
    shift, from the MAD of successive differences ÷ √2 (a difference of two independent draws has √2·σ), so a
    step or a trend in ``values`` does not count as noise. Regression baselines take the first, drift's
    night-to-night noise the second. NaN when there is nothing to measure."""
    if not of_differences and (centre := _short_median(values)) is not None:
        deviation = _short_median([abs(float(v) - centre) for v in values])
        return MAD_TO_SD * deviation if deviation is not None else float("nan")
    values = np.asarray(values, dtype=np.float64)
    if of_differences:
        values = np.diff(values)
    if values.size == 0:
        return float("nan")
    spread = MAD_TO_SD * np.median(np.abs(values - np.median(values)))
    return float(spread / np.sqrt(2) if of_differences else spread)


def summarize(samples: list[float] | tuple[float, ...], seed: int = 0, resamples: int = 2000) -> Summary | None:
    """Summary of ``samples``; ``None`` when there are none. The same arithmetic as ``summarize_rows``."""
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        return None
    columns = summarize_rows(values[None, :], seed=seed, resamples=resamples)
    return Summary(**{name: column[0].item() for name, column in columns.items()})


def summarize_rows(matrix: np.ndarray, seed: int = 0, resamples: int = 2000) -> dict[str, np.ndarray]:
    """Summaries of each row of ``matrix`` (runs × repeats, one run's samples per row), vectorised: one
    column per ``Summary`` field. This is how farm summarizes a run, alone or 50,000 at a time.
    ``resamples=0`` skips the bootstrap (ci_low/ci_high are NaN)."""
    values = np.sort(np.asarray(matrix, dtype=np.float64), axis=1)
    count, size = values.shape
    median = _sorted_percentile(values, 50.0)
    mean = values.mean(axis=1)
    if size > 1:
        std = values.std(axis=1, ddof=1)
        cv = np.divide(std, mean, out=np.zeros(count), where=mean > 0)
    else:
        cv = np.zeros(count)
    top = values[:, -1]
    unstable = (cv >= UNSTABLE_CV) | ((median > 0) & (top >= UNSTABLE_MAX_OVER_MEDIAN * median)) if size > 1 \
        else np.zeros(count, dtype=bool)
    if resamples:
        low, high = _bootstrap_median_cis(values, 0.95, seed, resamples)
    else:
        low = high = np.full(count, np.nan)
    return {
        "n": np.full(count, size), "median": median, "mean": mean,
        "p10": _sorted_percentile(values, 10.0), "p90": _sorted_percentile(values, 90.0),
        "min": values[:, 0], "max": top, "cv": cv,
        "mad": MAD_TO_SD * np.median(np.abs(values - median[:, None]), axis=1),
        "ci_low": low, "ci_high": high, "unstable": unstable,
    }


def summarize_groups(sizes, values, resamples: int = 2000) -> list[tuple]:
    """Summaries of consecutive groups of ``values`` (``sizes[i]`` values each, in order), one tuple of the
    ``Summary`` fields (in order, plain Python numbers) per group. Groups of the same size are summarized
    together, one matrix each: 50,000 runs' samples in about a second."""
    sizes = np.asarray(sizes, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    out: list[tuple] = [()] * len(sizes)
    if not len(sizes):
        return out
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    names = [f.name for f in fields(Summary)]
    for size in np.unique(sizes):
        picked = np.flatnonzero(sizes == size)
        columns = summarize_rows(values[starts[picked][:, None] + np.arange(size)], resamples=resamples)
        for group, row in zip(picked.tolist(), zip(*(columns[name].tolist() for name in names))):
            out[group] = row
    return out


SHORT = 64  # up to this many values, a median in Python's sort (~2 µs) instead of numpy's (~40 µs a call)


def _short_median(values) -> float | None:
    """The median of a short list or tuple of numbers, numpy's to the bit (the middle value, or the mean of the
    middle two: ``(a + b) / 2``, as ``_sorted_percentile`` and ``np.median`` compute it), without numpy's per-call
    cost: a night's review takes 6,000 medians of 20 values. None for anything else (an array, an empty or long
    sequence, a NaN, which has no place in Python's sort): numpy's path then."""
    if not isinstance(values, (list, tuple)) or not 0 < len(values) <= SHORT:
        return None
    ordered = sorted(float(v) for v in values)
    if any(v != v for v in ordered):
        return None
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _sorted_percentile(sorted_rows: np.ndarray, q: float) -> np.ndarray:
    """numpy's default (linear) percentile of each row, read off rows already sorted: no partition. The 50th is
    the median: the middle value, or the mean of the middle two."""
    size = sorted_rows.shape[1]
    position = q / 100 * (size - 1)
    low = int(np.floor(position))
    high = min(low + 1, size - 1)
    weight = position - low
    a, b = sorted_rows[:, low], sorted_rows[:, high]
    if q == 50.0:
        return (a + b) / 2 if weight else a.copy()
    return b - (b - a) * (1 - weight) if weight >= 0.5 else a + (b - a) * weight  # numpy's lerp


def is_unstable(values) -> bool:
    """CV ≥ 10 % or a max ≥ 1.5 × median: such a run never enters a baseline."""
    values = np.asarray(values, dtype=np.float64)
    return bool(values.size >= 2 and summarize_rows(values[None, :], resamples=0)["unstable"][0])


def bootstrap_median_ci(values, confidence: float = 0.95, seed: int = 0, resamples: int = 2000) -> tuple[float, float]:
    """Bootstrap interval of the median of ``values`` (see ``_bootstrap_median_cis``)."""
    values = np.sort(np.asarray(values, dtype=np.float64))
    low, high = _bootstrap_median_cis(values[None, :], confidence, seed, resamples)
    return float(low[0]), float(high[0])


def _bootstrap_median_cis(sorted_rows: np.ndarray, confidence: float, seed: int, resamples: int,
                          chunk_rows: int = 20_000) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap of the median for each row of ``sorted_rows`` (each row sorted ascending).

    A resample draws ``n`` positions with replacement; on sorted values its median is the mean of the values
    at the two middle drawn positions. So the draws (seeded, the same for every row of that length) reduce to
    a few hundred distinct position pairs with their counts, and each row's percentiles are read off its
    pair medians in order, weighted by the counts: the same numbers as np.percentile over all ``resamples``
    medians, without building them."""
    count, size = sorted_rows.shape
    if size == 1:
        return sorted_rows[:, 0].copy(), sorted_rows[:, 0].copy()
    lower, upper, weights = _middle_pairs(size, seed, resamples)
    ranks = [(1 - confidence) / 2 * (resamples - 1), (1 + confidence) / 2 * (resamples - 1)]
    out = [np.empty(count), np.empty(count)]
    for start in range(0, count, chunk_rows):
        block = sorted_rows[start:start + chunk_rows]
        medians = (block[:, lower] + block[:, upper]) / 2
        order = np.argsort(medians, axis=1, kind="stable")
        ordered = np.take_along_axis(medians, order, axis=1)
        passed = np.cumsum(weights[order], axis=1)  # how many resample medians are <= each, in order
        for column, rank in zip(out, ranks):
            k = int(np.floor(rank))
            a = ordered[np.arange(len(block)), (passed <= k).sum(axis=1)]
            b = ordered[np.arange(len(block)), (passed <= min(k + 1, resamples - 1)).sum(axis=1)]
            frac = rank - k
            column[start:start + chunk_rows] = b - (b - a) * (1 - frac) if frac >= 0.5 else a + (b - a) * frac
    return out[0], out[1]


@functools.lru_cache(maxsize=64)
def _middle_pairs(size: int, seed: int, resamples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (lower, upper) middle positions of ``resamples`` seeded draws of ``size`` positions, and how
    many draws gave each."""
    draws = np.sort(np.random.default_rng(seed).integers(0, size, size=(resamples, size)), axis=1)
    pairs, weights = np.unique(np.stack([draws[:, (size - 1) // 2], draws[:, size // 2]], axis=1), axis=0,
                               return_counts=True)
    return pairs[:, 0], pairs[:, 1], weights


class TimeUnit(NamedTuple):
    name: str  # s, ms, µs, ns
    seconds: float  # its length: 1e-3 for ms


TIME_UNITS = (TimeUnit("s", 1.0), TimeUnit("ms", 1e-3), TimeUnit("µs", 1e-6), TimeUnit("ns", 1e-9))


def time_unit(values_s) -> TimeUnit:
    """The unit that shows seconds ``values_s`` as readable numbers: the largest unit the largest of them
    (by magnitude) reaches, nanoseconds below a microsecond. The one choice of unit: printed durations
    (``format_duration``) and figure axes (the review's)."""
    top = max((abs(v) for v in values_s), default=0.0)
    return next((unit for unit in TIME_UNITS if top >= unit.seconds), TIME_UNITS[-1])


def format_duration(seconds: float | None) -> str:
    """Seconds with a readable unit: 1.24 ms, 11.8 µs, 2.31 s ('' for None)."""
    if seconds is None:
        return ""
    unit = time_unit([seconds])
    return f"{seconds / unit.seconds:.3g} {unit.name}"


BYTE_UNITS = (TimeUnit("GB", 1e9), TimeUnit("MB", 1e6), TimeUnit("kB", 1e3), TimeUnit("B", 1.0))  # "seconds": bytes
# powers of two, for sizes chosen as powers of two (copy curves: 4 KiB … 64 MiB, as `farm copies --help` names them)
BINARY_BYTE_UNITS = (TimeUnit("GiB", 2**30), TimeUnit("MiB", 2**20), TimeUnit("KiB", 2**10), TimeUnit("B", 1.0))


def byte_unit(values_bytes, binary: bool = False) -> TimeUnit:
    """The decimal unit (kB, MB, GB: TFLite's and AI Hub's; KiB, MiB, GiB with ``binary``) that shows byte counts as
    readable numbers, as ``time_unit`` does for seconds; the unit's size in bytes is its ``seconds`` field."""
    units = BINARY_BYTE_UNITS if binary else BYTE_UNITS
    top = max((abs(v) for v in values_bytes), default=0.0)
    return next((unit for unit in units if top >= unit.seconds), units[-1])


def format_bytes(nbytes: float | None, signed: bool = False, binary: bool = False) -> str:
    """Bytes with a readable unit: 4.8 MB, 312 kB, +9.6 MB with ``signed``, 64 MiB with ``binary`` ('' for None). The
    one byte formatter: the CLI, the report and its figures."""
    if nbytes is None:
        return ""
    unit = byte_unit([nbytes], binary)
    return f"{nbytes / unit.seconds:{'+' if signed else ''}.3g} {unit.name}"


def memory_text(params: int | None, planned_host: int | None, planned_device: int | None,
                peak_increase: int | None, emulated: bool = False) -> str:
    """A run's memory in words: 'params 4.8 MB · planned activations 1.2 MB · process peak RSS +9.6 MB'. Device
    (GPU) memory is named apart; an RSS not read says 'not measured', and under emulation '(emulated)'. The one
    wording: farm bench, the report."""
    parts = []
    if params is not None:
        parts.append(f"params {format_bytes(params)}")
    if planned_host is not None or planned_device is not None:
        planned = f"planned activations {format_bytes((planned_host or 0) + (planned_device or 0))}"
        if planned_device:
            planned += f" ({format_bytes(planned_device)} GPU, {format_bytes(planned_host or 0)} host)"
        parts.append(planned)
    rss = "not measured" if peak_increase is None else format_bytes(peak_increase, signed=True)
    parts.append(f"process peak RSS {rss}" + (" (emulated)" if emulated and peak_increase is not None else ""))
    return " · ".join(parts)


def model_label(model: str, tuned: bool, runtime: str = "tvm") -> str:
    """A model as tables and figures name it: 'mlp', 'mlp (tuned)' when tuning records were compiled in, or
    'mlp [onnxruntime]' for a reference runtime's series. The one label of a series' model: the report (a Jinja
    filter), the review's figures, `farm drift`."""
    if runtime != "tvm":
        return f"{model} [{runtime}]"
    return f"{model} (tuned)" if tuned else model


def versus_text(tvm_s: float | None, reference_s: float | None, runtime: str, tvm_threads: int | None = None,
                reference_threads: int | None = None) -> str:
    """TVM's steady figure against a reference runtime's, in words, with the threads each used: 'TVM 3.1× slower,
    2 threads each' / 'TVM 1.4× faster (unequal threads: TVM 1, onnxruntime 2)' ('' when either figure is missing).
    The one wording of the comparison: farm bench, the report, the CLI."""
    if not tvm_s or not reference_s:
        return ""
    ratio = tvm_s / reference_s
    if 0.995 <= ratio <= 1.005:
        verdict = f"TVM as fast as {runtime}"
    else:
        verdict = f"TVM {ratio:.3g}× slower" if ratio > 1 else f"TVM {1 / ratio:.3g}× faster"
    return f"{verdict}{threads_text(tvm_threads, reference_threads, runtime)}"


def threads_text(tvm_threads: int | None, reference_threads: int | None, runtime: str) -> str:
    """The threads behind a comparison, as ``versus_text`` appends them: ', 2 threads each', or the two counts when
    they differ or one is not known (runs stored before farm recorded threads)."""
    if tvm_threads is not None and tvm_threads == reference_threads:
        return f", {tvm_threads} thread{'s' if tvm_threads != 1 else ''} each"
    known = lambda n: "?" if n is None else str(n)  # noqa: E731
    return f" (unequal threads: TVM {known(tvm_threads)}, {runtime} {known(reference_threads)})" \
        if tvm_threads is not None and reference_threads is not None else \
        f" (threads not known: TVM {known(tvm_threads)}, {runtime} {known(reference_threads)})"


def gb_per_s(nbytes: int, median_s: float) -> float:
    """Effective bandwidth of a copy in GB/s; 0 for a copy too fast for its clock (a zero median)."""
    return nbytes / median_s / 1e9 if median_s > 0 else 0.0


def hottest(health: dict[str, Any]) -> float | None:
    """The highest temperature in a health reading (thermal zones and battery), None when it has none."""
    values = list((health.get("thermal") or {}).values())
    if health.get("battery_temp_c") is not None:
        values.append(health["battery_temp_c"])
    return max(values) if values else None
