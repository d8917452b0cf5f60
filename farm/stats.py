"""Robust statistics over raw samples. No TVM, no database.

Every steady-state sample farm stores is already a mean over ``number`` calls
(that is what ``time_evaluator`` returns); these functions summarize the repeats. ``hottest`` is
the one rule for a health reading's temperature (the gates, the report's data quality, the dashboard).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

UNSTABLE_CV = 0.10
UNSTABLE_MAX_OVER_MEDIAN = 1.5


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
    values = np.asarray(samples, dtype=np.float64)
    return float(np.median(values)) if values.size else None


def summarize(samples: list[float] | tuple[float, ...], seed: int = 0, resamples: int = 2000) -> Summary | None:
    """Summary of ``samples``; ``None`` when there are none."""
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        return None
    median = float(np.median(values))  # what median() returns
    mean = float(np.mean(values))
    cv = float(np.std(values, ddof=1) / mean) if values.size > 1 and mean > 0 else 0.0
    low, high = bootstrap_median_ci(values, seed=seed, resamples=resamples)
    return Summary(
        n=int(values.size), median=median, mean=mean,
        p10=float(np.percentile(values, 10)), p90=float(np.percentile(values, 90)),
        min=float(values.min()), max=float(values.max()), cv=cv,
        mad=float(1.4826 * np.median(np.abs(values - median))),
        ci_low=low, ci_high=high, unstable=is_unstable(values),
    )


def is_unstable(values) -> bool:
    """CV ≥ 10 % or a max ≥ 1.5 × median: such a run never enters a baseline."""
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2:
        return False
    median = float(np.median(values))
    cv = float(np.std(values, ddof=1) / np.mean(values)) if np.mean(values) > 0 else 0.0
    return cv >= UNSTABLE_CV or (median > 0 and float(values.max()) >= UNSTABLE_MAX_OVER_MEDIAN * median)


def bootstrap_median_ci(values, confidence: float = 0.95, seed: int = 0, resamples: int = 2000) -> tuple[float, float]:
    values = np.asarray(values, dtype=np.float64)
    if values.size == 1:
        return float(values[0]), float(values[0])
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, values.size, size=(resamples, values.size))
    medians = np.median(values[picks], axis=1)
    tail = (1 - confidence) / 2 * 100
    return float(np.percentile(medians, tail)), float(np.percentile(medians, 100 - tail))


def format_duration(seconds: float | None) -> str:
    """Seconds with a readable unit: 1.24 ms, 11.8 µs, 2.31 s ('' for None)."""
    if seconds is None:
        return ""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def hottest(health: dict[str, Any]) -> float | None:
    """The highest temperature in a health reading (thermal zones and battery), None when it has none."""
    values = list((health.get("thermal") or {}).values())
    if health.get("battery_temp_c") is not None:
        values.append(health["battery_temp_c"])
    return max(values) if values else None
