"""Regression detection over nightly history. No TVM, no database writes (the store writes alerts).

A *series* is one model on one device, tuned or not, one metric. Its *baseline* is the last
N accepted nightly medians (accepted: status ok and not unstable); centre = their median,
spread = 1.4826·MAD (``stats.robust_sd``), floored at a fraction of the centre.

A night is a *candidate* when both its robust z and its relative change pass the metric's
thresholds. A nightly z alone cannot tell a 10 % step from 3 % night-to-night noise, so the
candidate rule is generous; *confirmation* is strict: old and new artifacts rerun on the
same device in rounds, each round a fresh session and load of both, run interleaved; each
round gives one figure per artifact, and the Wilcoxon signed-rank test on the per-round
log ratios must give p < 0.01 (at 8 rounds: every round agrees). Interleaving cancels what
changed between nights (temperature, load); fresh loads make the rounds independent, where
samples of one load are not (``compare_samples``, for two stored runs, treats them as such
and says so).

Thresholds (``METHOD``), chosen with ``tools/bench_detect.py`` on generated series (3 %
night-to-night noise, 20-night baselines): steady latency candidates at z ≥ 1.0 and
change ≥ 2 %; load, first-run and copy times are noisier and need z ≥ 2 and ≥ 5 %.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from farm.records import Record
from farm.series import SeriesKey, by_sweep
from farm.stats import nonempty_median, robust_sd

if TYPE_CHECKING:
    from farm.runs import Run

METRICS = ("steady", "load", "first_run", "copy")
CONFIRM_ROUNDS = (8, 16)  # confirmation: 8 rounds (the fewest at which p < 0.01 can be reached), then 16 if inconclusive


@dataclass(frozen=True)
class Thresholds:
    z: float
    rel: float


@dataclass(frozen=True)
class Method:
    baseline_n: int = 20
    baseline_min: int = 5
    spread_floor: float = 0.005  # of the centre
    thresholds: dict[str, Thresholds] = field(default_factory=lambda: {
        "steady": Thresholds(1.0, 0.02),
        "load": Thresholds(2.0, 0.05),
        "first_run": Thresholds(2.0, 0.05),
        "copy": Thresholds(2.0, 0.05),
    })
    p_confirm: float = 0.01

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "thresholds": {k: asdict(v) for k, v in self.thresholds.items()}}


METHOD = Method()


@dataclass(frozen=True)
class Baseline:
    n: int
    centre: float
    spread: float
    values: tuple[float, ...]


@dataclass(frozen=True)
class Verdict:
    """What one night says about one series."""

    status: str  # ok | candidate | improved | no-baseline | unstable
    value: float
    baseline: Baseline | None
    z: float | None
    change: float | None  # relative: +0.10 = 10 % slower


def baseline_of(history: Sequence[float], method: Method = METHOD) -> Baseline | None:
    """Baseline from accepted nightly values, oldest first; None below ``baseline_min``."""
    values = np.asarray(list(history)[-method.baseline_n:], dtype=np.float64)
    if values.size < method.baseline_min:
        return None
    centre = nonempty_median(values)
    spread = max(robust_sd(values), method.spread_floor * centre)
    return Baseline(int(values.size), centre, spread, tuple(float(v) for v in values))


def judge(value: float, history: Sequence[float], metric: str = "steady", unstable: bool = False,
          method: Method = METHOD) -> Verdict:
    """Candidate regression (slower) or improvement (faster) of ``value`` against ``history``."""
    base = baseline_of(history, method)
    if base is None:
        return Verdict("no-baseline", value, None, None, None)
    z = (value - base.centre) / base.spread
    change = (value - base.centre) / base.centre
    if unstable:
        return Verdict("unstable", value, base, z, change)
    limit = method.thresholds[metric]
    if z >= limit.z and change >= limit.rel:
        return Verdict("candidate", value, base, z, change)
    if z <= -limit.z and change <= -limit.rel:
        return Verdict("improved", value, base, z, change)
    return Verdict("ok", value, base, z, change)


@dataclass(frozen=True)
class Comparison:
    """Two sets of raw samples (old vs new artifact, or run A vs run B)."""

    n_old: int
    n_new: int
    median_old: float
    median_new: float
    change: float
    mann_whitney_p: float
    ks_p: float
    verdict: str  # slower | faster | same | inconclusive


def compare_samples(old: Sequence[float], new: Sequence[float], method: Method = METHOD) -> Comparison:
    old_a, new_a = np.asarray(old, dtype=np.float64), np.asarray(new, dtype=np.float64)
    if old_a.size < 3 or new_a.size < 3:
        raise ValueError("need at least 3 samples on each side")
    from scipy import stats as scipy_stats  # here: importing scipy.stats takes ~1 s, and only a comparison needs it

    mw = float(scipy_stats.mannwhitneyu(new_a, old_a, alternative="two-sided").pvalue)
    ks = float(scipy_stats.ks_2samp(new_a, old_a).pvalue)
    m_old, m_new = nonempty_median(old_a), nonempty_median(new_a)
    change = (m_new - m_old) / m_old
    if mw < method.p_confirm and ks < method.p_confirm:
        verdict = "slower" if change > 0 else "faster"
    elif mw > 0.2 and ks > 0.2:
        verdict = "same"
    else:
        verdict = "inconclusive"
    return Comparison(int(old_a.size), int(new_a.size), m_old, m_new, change, mw, ks, verdict)


def series_value(metric: str, run: "Run") -> float | None:
    """A run's value for ``metric``."""
    if metric == "steady":
        return run.steady_median_s
    if metric == "load":
        return run.load_s
    if metric == "first_run":
        return run.first_run_s
    copies = [c for c in run.copy_s if c is not None]
    return sum(copies) if copies else None


@dataclass(frozen=True)
class SeriesVerdict(Record):
    """What one sweep says about one series and metric: ``detect``'s output, what ``Store.save_alert`` stores."""

    device: str
    model: str
    tuned: bool
    metric: str
    sweep_id: int
    run_id: int
    runtime: str  # tvm, or the reference runtime whose series this is (onnxruntime …): its own series, no artifact
    artifact_key: str
    model_digest: str
    baseline_run_id: int | None
    baseline_artifact_key: str | None
    status: str  # ok | candidate | improved | no-baseline | unstable
    value: float
    z: float | None
    change: float | None
    baseline: dict[str, Any] | None  # asdict(Baseline)


def detect(runs: list["Run"], sweep_id: int, method: Method = METHOD,
           accepted: dict[SeriesKey, dict[int, "Run"]] | None = None) -> list[SeriesVerdict]:
    """Verdicts for every series of ``sweep_id`` against the earlier sweeps' accepted values.

    Both the judged run and the history are ``series.by_sweep``'s, with ``keep_unstable_of=sweep_id``: a
    series' run of the sweep is its last ok one (unstable too: it is judged "unstable", never silently
    dropped), each earlier sweep's its last ok, stable one; same device, model, tuned, target, TVM and
    pipeline version. ``runs``: results.run_rows of all sweeps, any order. ``accepted``: that ``by_sweep``
    when the caller has it (review shares it with its evidence)."""
    if accepted is None:
        accepted = by_sweep(runs, keep_unstable_of=sweep_id)
    verdicts = []
    for key, by_sweep_id in sorted(accepted.items(), key=lambda item: item[0]):
        now = by_sweep_id.get(sweep_id)
        if now is None:
            continue
        device, model, tuned, _ = key
        history_runs = [by_sweep_id[s] for s in sorted(by_sweep_id) if s < sweep_id]
        last = history_runs[-1] if history_runs else None
        for metric in METRICS:
            value = series_value(metric, now)
            history = [v for v in (series_value(metric, r) for r in history_runs) if v is not None]
            if value is None:
                continue
            verdict = judge(value, history, metric, unstable=now.unstable and metric == "steady", method=method)
            verdicts.append(SeriesVerdict(
                device=device, model=model, tuned=tuned, metric=metric, sweep_id=sweep_id, run_id=now.run_id,
                runtime=now.runtime,
                artifact_key=now.artifact_key, model_digest=now.model_digest,
                baseline_run_id=last.run_id if last else None, baseline_artifact_key=last.artifact_key if last else None,
                status=verdict.status, value=verdict.value, z=verdict.z, change=verdict.change,
                baseline=asdict(verdict.baseline) if verdict.baseline else None))
    return verdicts


@dataclass(frozen=True)
class RoundComparison:
    """Old vs new artifact over rounds, each round a fresh session and load of both (``measure.interleaved_rounds``):
    one figure per artifact per round, compared in pairs."""

    rounds: int
    median_old: float  # of the per-round figures
    median_new: float
    change: float  # geometric mean of new/old over rounds, minus 1: +0.10 = 10 % slower
    wilcoxon_p: float  # two-sided, exact: how often equally fast artifacts would favour one side this consistently
    verdict: str  # slower | faster | same | inconclusive


def compare_rounds(old: Sequence[float], new: Sequence[float], method: Method = METHOD) -> RoundComparison:
    """Paired comparison of per-round figures: the Wilcoxon signed-rank test on log(new/old), each round one pair.

    Samples inside one load are correlated (the layout and clocks of that load), so they are never counted as
    independent: with R rounds the test has R observations. At 8 rounds the smallest p is 2/2⁸ = 0.0078, reached
    only when every round agrees: that is what p < 0.01 asks."""
    old_a, new_a = np.asarray(old, dtype=np.float64), np.asarray(new, dtype=np.float64)
    if old_a.size != new_a.size or old_a.size < 6:
        raise ValueError("need at least 6 paired rounds")
    from scipy import stats as scipy_stats  # here: importing scipy.stats takes ~1 s

    logs = np.log(new_a / old_a)
    p = 1.0 if not np.any(logs) else float(scipy_stats.wilcoxon(logs, alternative="two-sided", method="exact").pvalue)
    change = float(np.expm1(np.mean(logs)))
    if p < method.p_confirm:
        verdict = "slower" if change > 0 else "faster"
    elif p > 0.2 and abs(change) < method.thresholds["steady"].rel:
        verdict = "same"
    else:
        verdict = "inconclusive"
    return RoundComparison(int(old_a.size), nonempty_median(old_a), nonempty_median(new_a), change, p, verdict)


def confirm(sample_rounds, rounds: Sequence[int] = CONFIRM_ROUNDS, method: Method = METHOD) -> tuple[str, RoundComparison]:
    """Confirm a candidate: ``sample_rounds(n)`` reruns old and new artifacts for ``n`` more rounds (a fresh load
    of both each round) and returns their per-round figures. Inconclusive after the first rounds → more rounds;
    still inconclusive → "unknown".

    Returns ("confirmed" | "rejected" | "improved" | "unknown", the last comparison)."""
    comparison = None
    old: list[float] = []
    new: list[float] = []
    for total in rounds:
        more_old, more_new = sample_rounds(total - len(old))
        old, new = old + list(more_old), new + list(more_new)
        comparison = compare_rounds(old, new, method)
        if comparison.verdict == "slower":
            return "confirmed", comparison
        if comparison.verdict == "faster":
            return "improved", comparison
        if comparison.verdict == "same":
            return "rejected", comparison
    if comparison is None:
        raise ValueError("confirm needs at least one number of rounds")
    return "unknown", comparison
