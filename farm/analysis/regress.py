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

Thresholds (``METHOD``), chosen with ``tools/bench_detect.py --costs`` on generated series (1-3 %
night-to-night noise, 20-night baselines): steady latency candidates at z ≥ 2 and change ≥ 2 %
(z ≥ 1 screened one unchanged series in seven a night at 2 % noise); load, first-run and copy
times are noisier and need z ≥ 2 and ≥ 5 %, and so does the measured peak RSS (``peak_rss``:
bytes over the RSS before load). Planned memory (``params``, ``planned_activations``) is
deterministic: any change from the series' last accepted night (across a context change: the old
context's last night) is ``changed``, with no statistics.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from farm.records import Record
from farm.analysis.series import SeriesKey, by_sweep, context_changes
from farm.stats import nonempty_median, robust_sd

if TYPE_CHECKING:
    from farm.analysis.runs import Run

METRICS = ("steady", "load", "first_run", "copy", "peak_rss")
# planned memory (compile.planned_memory) is deterministic: any change from the last accepted night is a change, no
# statistics (``changed``)
PLANNED_METRICS = ("params", "planned_activations")
BYTE_METRICS = ("peak_rss", *PLANNED_METRICS)  # in bytes; the others in seconds
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
        # z ≥ 2: under A/A at most 5 % of series screened a night up to 2 % night-to-night noise, and a 10 % step
        # still confirmed ≥ 99 % (tools/bench_detect.py --costs; z ≥ 1 screened 14 % at 2 % noise). At 3 % noise no
        # single-night threshold holds both: z ≥ 2 screens 4 % but confirms 87 % of 10 % steps
        "steady": Thresholds(2.0, 0.02),
        "load": Thresholds(2.0, 0.05),
        "first_run": Thresholds(2.0, 0.05),
        "copy": Thresholds(2.0, 0.05),
        "peak_rss": Thresholds(2.0, 0.05),  # the process's peak RSS over its RSS before load: time's rules
    })
    # The second tier (#52): a steady series past this but under its threshold is "screened": no alert, no finding,
    # but confirmation reruns it (after the findings' representatives, largest z first, while the budget lasts),
    # and a confirmed one is stored as a confirmed alert, a finding by itself. At 3 % night-to-night noise z ≥ 2
    # alone confirms 87 % of 10 % steps; rerunning from z ≥ 1 confirms 98 % on the night the step lands, A/A
    # confirms 0.2 %, and the reruns cost 1.9 device-h per 1,000 quiet series a night at 4 s a round (z ≥ 1.28:
    # 96–97 %, too close to 95 % over seeds, 1.3 device-h; z ≥ 1.645: 94 %) — tools/bench_detect.py --costs. The
    # alert rate of a quiet night (what findings' scatter test expects) is the candidates' alone
    rescreen: dict[str, Thresholds] = field(default_factory=lambda: {"steady": Thresholds(1.0, 0.02)})
    p_confirm: float = 0.01

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "thresholds": {k: asdict(v) for k, v in self.thresholds.items()},
                "rescreen": {k: asdict(v) for k, v in self.rescreen.items()}}


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

    status: str  # ok | candidate | improved | screened (Method.rescreen: rerun, never an alert) | no-baseline | unstable
    value: float
    baseline: Baseline | None
    z: float | None
    change: float | None  # relative: +0.10 = 10 % slower


def baseline_of(history: Sequence[float], method: Method = METHOD) -> Baseline | None:
    """Baseline from accepted nightly values, oldest first; None below ``baseline_min``."""
    values = [float(v) for v in list(history)[-method.baseline_n:]]  # a list: stats' medians of short lists
    if len(values) < method.baseline_min:
        return None
    centre = nonempty_median(values)
    spread = max(robust_sd(values), method.spread_floor * centre)
    return Baseline(len(values), centre, spread, tuple(values))


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
    second = method.rescreen.get(metric)
    if second is not None and z >= second.z and change >= second.rel:
        return Verdict("screened", value, base, z, change)  # not an alert: confirmation's second tier
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
    if metric == "peak_rss":
        return run.rss_peak_increase_bytes
    if metric == "params":
        return run.params_bytes
    if metric == "planned_activations":
        return run.planned_bytes
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
    # ok | candidate | improved | screened (Method.rescreen: rerun, never an alert) | no-baseline | unstable;
    # planned memory: ok | changed
    status: str
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
            history = _last_values(metric, history_runs, method.baseline_n)
            if value is None:
                continue
            verdict = judge(value, history, metric, unstable=now.unstable and metric == "steady", method=method)
            verdicts.append(SeriesVerdict(
                device=device, model=model, tuned=tuned, metric=metric, sweep_id=sweep_id, run_id=now.run_id,
                runtime=now.runtime,
                artifact_key=now.artifact_key, model_digest=now.model_digest,
                baseline_run_id=last.run_id if last else None, baseline_artifact_key=last.artifact_key if last else None,
                status=verdict.status, value=verdict.value, z=verdict.z, change=verdict.change,
                baseline=_baseline_dict(verdict.baseline)))
        verdicts += _planned_verdicts(device, model, tuned, sweep_id, now, history_runs)
    return verdicts


def _last_values(metric: str, runs: Sequence["Run"], most: int) -> list[float]:
    """The last ``most`` values of ``metric`` over ``runs`` (oldest first), skipping runs without one: all a
    baseline reads (``baseline_of``), without computing the 30 older nights of a 50-night history."""
    values: list[float] = []
    for run in reversed(runs):
        if len(values) == most:
            break
        if (value := series_value(metric, run)) is not None:
            values.append(value)
    return values[::-1]


def _baseline_dict(baseline: Baseline | None) -> dict[str, Any] | None:
    """``asdict(baseline)`` without its deep copy (its values are a tuple of floats): 3,000 verdicts a night."""
    return None if baseline is None else {f.name: getattr(baseline, f.name) for f in fields(baseline)}


def _planned_verdicts(device: str, model: str, tuned: bool, sweep_id: int, now: "Run", before_runs: Sequence["Run"],
                      upgrade: dict[str, Any] | None = None) -> list[SeriesVerdict]:
    """Planned memory (``PLANNED_METRICS``) is deterministic: ``now``'s value against the last value of
    ``before_runs`` (oldest first), ``changed`` when it differs at all, with no statistics. ``upgrade``: what an
    upgrade verdict's baseline says besides (``detect_upgrades``: ``context_change``, ``new_nights``)."""
    last = before_runs[-1] if before_runs else None
    verdicts = []
    for metric in PLANNED_METRICS:
        value = series_value(metric, now)
        before = next((v for v in (series_value(metric, r) for r in reversed(before_runs)) if v is not None), None)
        if value is None or before is None:
            continue
        verdicts.append(SeriesVerdict(
            device=device, model=model, tuned=tuned, metric=metric, sweep_id=sweep_id, run_id=now.run_id,
            runtime=now.runtime, artifact_key=now.artifact_key, model_digest=now.model_digest,
            baseline_run_id=last.run_id if last else None, baseline_artifact_key=last.artifact_key if last else None,
            status="changed" if value != before else "ok", value=value, z=None,
            change=(value - before) / before if before else None,
            baseline={**asdict(Baseline(1, before, 0.0, (before,))), **(upgrade or {})}))
    return verdicts


def detect_upgrades(runs: list["Run"], sweep_id: int, method: Method = METHOD,
                    accepted: dict[SeriesKey, dict[int, "Run"]] | None = None) -> list[SeriesVerdict]:
    """Verdicts across a context change (``series.context_changes``, the upgrade rule): for each series whose new
    context (TVM, pipeline, target) has no baseline yet, the median of its nights so far judged against the old
    context's last accepted nights with ``judge``'s rule; planned memory (``PLANNED_METRICS``), tonight's value
    against the old context's last one, ``changed`` when it differs at all (as ``detect`` does within a context).
    The verdict's ``baseline`` says what changed (``context_change``) and is the old context's; ``baseline_run_id``
    is the old context's last run. Such a verdict cannot be confirmed by interleaved rounds (a device's server runs
    one TVM)."""
    if accepted is None:
        accepted = by_sweep(runs, keep_unstable_of=sweep_id)
    verdicts = []
    for change in context_changes(accepted, sweep_id, method.baseline_n, method.baseline_min):
        now, last = change.new_runs[-1], change.old_runs[-1]
        for metric in METRICS:
            new_values = [v for v in (series_value(metric, r) for r in change.new_runs) if v is not None]
            history = [v for v in (series_value(metric, r) for r in change.old_runs) if v is not None]
            if series_value(metric, now) is None or not new_values:
                continue
            verdict = judge(nonempty_median(new_values), history, metric,
                            unstable=now.unstable and metric == "steady", method=method)
            if verdict.baseline is None:
                continue
            verdicts.append(SeriesVerdict(
                device=change.device, model=change.model, tuned=change.tuned, metric=metric, sweep_id=sweep_id,
                run_id=now.run_id, runtime=now.runtime, artifact_key=now.artifact_key, model_digest=now.model_digest,
                baseline_run_id=last.run_id, baseline_artifact_key=last.artifact_key, status=verdict.status,
                value=verdict.value, z=verdict.z, change=verdict.change,
                baseline={**asdict(verdict.baseline), "context_change": change.change, "new_nights": len(new_values)}))
        verdicts += _planned_verdicts(change.device, change.model, change.tuned, sweep_id, now, change.old_runs,
                                     {"context_change": change.change, "new_nights": len(change.new_runs)})
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


def not_slower(before: Sequence[float], after: Sequence[float]) -> bool:
    """Whether a new record set is kept (nightly tuning): over interleaved rounds (one figure per round for each set),
    the median of the per-round ratios new / previous is at most 1; without a previous figure, any that ran is kept.

    The other question "is it slower" farm asks, here beside it: ``compare_rounds`` confirms a regression and needs
    significance (Wilcoxon, p < 0.01: at least ``CONFIRM_ROUNDS``' first count of rounds). Keeping tuning records
    asks less: its rounds (``night.tuning.VALIDATION_ROUNDS``) are too few to reach that p, and a set that is not
    slower by the paired median is kept; a slower one leaves the baseline as it was."""
    if not after:
        return False
    if not before:
        return True
    return nonempty_median([new / old for old, new in zip(before, after)]) <= 1.0


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
