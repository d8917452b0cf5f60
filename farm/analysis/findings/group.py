"""One sweep's alerts grouped into findings: upgrades, tuning, then the blocks, scatter and single series
``explain`` finds. No TVM, no database."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from farm.analysis.findings.causes import candidates, cause_words, pairs_of
from farm.analysis.findings.explain import Block, Cell, Scatter, Side, explain, special
from farm.analysis.findings.finding import (REPRESENTATIVES, SINGLE_ALPHA, SLOWER_STATUSES, UNCONFIRMABLE, Z_CAP, Finding,
                                   absolute_change, fraction, noise_floor)
from farm.analysis.findings.traits import NO_TRAITS, SeriesTraits
from farm.records import Alert
from farm.analysis.regress import METHOD, SeriesVerdict
from farm.analysis.runs import Run
from farm.stats import model_label

Manifests = Mapping[str, Mapping[str, Any]]  # a run's manifest by its digest (Run.manifest; Store.manifests)


def find_findings(alerts: Iterable[Alert], verdicts: Iterable[SeriesVerdict], runs: Mapping[int, Run],
                  traits: SeriesTraits = NO_TRAITS, manifests: Manifests | None = None) -> list[Finding]:
    """Group ``alerts`` (one sweep's, as stored) into findings, best first. ``verdicts``: the sweep's verdicts of
    every judged series (``regress.detect`` and ``regress.detect_upgrades``: the denominators and the controls);
    ``runs``: run id → ``Run`` for the alerts' runs and their baselines' last runs (and the verdicts', for the
    causes a manifest names); ``traits``: what a finding may name its devices and models by
    (``traits.series_traits``); ``manifests``: the runs' manifests by digest (``Store.manifests``), whose changes
    name what a finding started with (``causes``)."""
    verdicts = list(verdicts)
    findings: list[Finding] = []
    by_group: dict[tuple[str, str], list[Alert]] = {}
    for alert in alerts:
        if alert.change is None or alert.baseline is None:
            continue
        grew = alert.status in SLOWER_STATUSES or (alert.status == "changed" and alert.change > 0)  # planned memory
        direction = "faster" if alert.status == "improved" or (alert.status == "changed" and alert.change < 0) \
            else "slower" if grew else ""
        if direction:
            by_group.setdefault((alert.metric, direction), []).append(alert)
    for (metric, direction), group in sorted(by_group.items()):
        judged = [v for v in verdicts if v.metric == metric and v.status != "no-baseline"]
        findings += _group(metric, direction, group, judged, runs, traits, manifests or {})
    return sorted(findings, key=lambda f: (f.direction != "slower", -f.rank_score, f.key))


def _group(metric: str, direction: str, alerts: list[Alert], judged: list[SeriesVerdict],
           runs: Mapping[int, Run], traits: SeriesTraits, manifests: Manifests) -> list[Finding]:
    out: list[Finding] = []
    upgrades: dict[tuple[str, str], list[Alert]] = {}
    tuning: list[Alert] = []
    rest: list[Alert] = []
    for alert in alerts:
        change = (alert.baseline or {}).get("context_change")
        if change:
            upgrades.setdefault((change, _coverage_split(alert, runs)), []).append(alert)
        elif _tuning_changed(alert, runs):
            tuning.append(alert)
        else:
            rest.append(alert)
    upgrade_judged = [v for v in judged if (v.baseline or {}).get("context_change")]
    plain_judged = [v for v in judged if not (v.baseline or {}).get("context_change")]
    for (change, split), group in sorted(upgrades.items()):
        scope = [v for v in upgrade_judged if v.baseline and v.baseline["context_change"] == change]
        for alerts_of, words, key in _upgrade_parts(group, scope, runs, traits):
            out.append(_finding("upgrade", metric, direction, alerts_of, scope, runs, cause=change, split=split,
                                control=_control(alerts_of, plain_judged, direction),
                                key_scope=f"{change}|{split}{key}", words=words))
    if tuning:
        out.append(_finding("tuning" if len(tuning) > 1 else "series", metric, direction, tuning, plain_judged, runs,
                            cause="tuning records changed",
                            key_scope="tuning" if len(tuning) > 1 else _series_scope(tuning[0])))
    out += _explained(metric, direction, rest, plain_judged, runs, traits, manifests)
    return [f for f in out if f.k]


def _explained(metric: str, direction: str, alerts: list[Alert], judged: list[SeriesVerdict],
               runs: Mapping[int, Run], traits: SeriesTraits, manifests: Manifests) -> list[Finding]:
    """Findings of the alerts with no context or tuning change: ``explain``'s blocks, its scatter, and the single
    series left whose z passes Bonferroni's bound over the night's judged series (``SINGLE_ALPHA``)."""
    by_cell = {_cell(a): a for a in alerts}
    found = explain(map(_cell, judged), by_cell, traits)
    out = []
    for block in found.blocks:
        scope = [v for v in judged if v.device in block.devices.members and _label(v) in block.models.members]
        members = [by_cell[c] for c in block.cells]
        kind = _kind(block)
        out.append(_finding(kind, metric, direction, members, scope, runs, key_scope=_block_key(block),
                            cause=_context_cause([by_cell[c] for c in block.own], runs, judged, manifests),
                            own=[by_cell[c] for c in block.own], words=_words(block)))
    if found.scatter is not None:
        out.append(_scatter_finding(metric, direction, found.scatter, by_cell, judged, runs))
    for cell in found.residual:
        alert = by_cell[cell]
        if not _alone(alert, len(judged), runs):
            continue
        scope = [v for v in judged if v.device == alert.device and _label(v) == _label(alert)]
        out.append(_finding("series", metric, direction, [alert], scope, runs,
                            cause=_context_cause([alert], runs, judged, manifests),
                            key_scope=_series_scope(alert)))
    return out


def _alone(alert: Alert, judged: int, runs: Mapping[int, Run]) -> bool:
    """A series is a finding by itself when it moved beyond its noise floor and its night lies outside the
    prediction bound of its baseline's nights at Bonferroni's level over the night's ``judged`` series
    (``SINGLE_ALPHA`` / judged, one-sided): ``prediction_t`` against Student's t with nights − 1 degrees of freedom.
    A planned-memory change (no z) always does, and so does a series its reruns confirmed (``night.confirmation``: a
    candidate alone, or the screen's second tier)."""
    if absolute_change(alert) < noise_floor(alert, runs.get(alert.run_id)):
        return False
    if alert.z is None or alert.status == "confirmed":  # confirmed: reruns in fresh loads said so, not one night
        return True
    t, nights = prediction_t(alert)
    alpha = SINGLE_ALPHA / max(judged, 1)
    bound = -special().stdtrit(nights - 1, alpha) if nights > 1 else -special().ndtri(alpha)
    return abs(t) >= float(bound)


def prediction_t(alert: Alert) -> tuple[float, int]:
    """(t, nights) of the alert's value against its baseline's nights: (x − mean) / (s·√(1 + 1/n)), s their SD
    floored as ``regress`` floors its spread (``Method.spread_floor`` of the centre). For normal nights this is
    Student's t with n − 1 degrees of freedom exactly (the prediction interval of one new observation). Not the
    alert's robust z: the MAD of 20 nights is ~2.7× as variable as their SD (its efficiency at the normal is 37 %),
    so z has heavier tails than that t, and a quiet night's extreme series passed the bound; and a series whose
    history has wild nights has a larger SD, so it needs a larger move to stand alone. A night farther than
    ``CLIP_SPREADS`` baseline spreads from the median is left out first: another level, not noise (the regression's
    own first night when it persists, a broken night). Without stored nights (fewer than 3): the alert's z and n."""
    base = alert.baseline or {}
    values = np.asarray(base.get("values") or (), dtype=np.float64)
    if values.size >= 3 and base.get("spread"):
        values = values[np.abs(values - np.median(values)) <= CLIP_SPREADS * float(base["spread"])]
    if values.size < 3:
        return float(alert.z or 0.0), int(base.get("n") or 0)
    spread = max(float(values.std(ddof=1)), METHOD.spread_floor * float(np.median(values)))
    return (alert.value - float(values.mean())) / (spread * math.sqrt(1 + 1 / values.size)), int(values.size)


# Baseline nights farther than this many spreads (regress's: 1.4826 · MAD, floored) from their median are another
# level, not noise, and are left out of the SD ``prediction_t`` reads: at normal noise a night is that far once in
# ~1.7 million, and once in ~1,000 when 20 nights' MAD came out a third too small (3.3 σ)
CLIP_SPREADS = 5.0


def _scatter_finding(metric: str, direction: str, scatter: Scatter, by_cell: Mapping[Cell, Alert],
                     judged: list[SeriesVerdict], runs: Mapping[int, Run]) -> Finding:
    share = len(scatter.cells) / scatter.n
    explains = "no device or model explains it" if scatter.p_independent >= 0.01 else \
        "its share differs between devices or models, but no block of them explains it"
    return _finding(
        "scatter", metric, direction, [by_cell[c] for c in scatter.cells], judged, runs, key_scope="scatter",
        n=scatter.n, words=Words(
            f"{share * 100:.0f} % of all series ({fraction(len(scatter.cells), scatter.n)})",
            f"across {fraction(scatter.devices, scatter.devices_of)} devices and "
            f"{fraction(scatter.models, scatter.models_of)} models",
            f"{explains} (p = {scatter.p_independent:.2g})", scatter.p_independent))


def _kind(block: Block) -> str:
    if block.devices.whole:
        return "model" if len(block.models.members) == 1 else "sweep"
    return "device" if block.models.whole else "block"


def _side_key(side: Side) -> str:
    if side.whole:
        return "all"
    return f"{side.trait.name}={side.trait.value}" if side.trait else ",".join(side.members)


def _block_key(block: Block) -> str:
    return f"{_side_key(block.devices)}×{_side_key(block.models)}"


def _words(block: Block) -> Words:
    """A block's sides in words: its models (the subject) and its devices (where)."""
    models, devices = block.models, block.devices
    count = f"({fraction(len(models.members), models.of)})"
    if models.trait is not None:
        subject = models.trait.words(count)
    elif models.whole:
        subject = f"all models {count}"
    else:
        subject = models.members[0] if len(models.members) == 1 else f"{len(models.members)} models"
    if devices.trait is not None:
        where = "on " + devices.trait.words(f"({fraction(len(devices.members), devices.of)})")
    elif len(devices.members) == 1 and devices.of > 1:
        where = f"on {devices.members[0]}"
    else:
        where = f"on {fraction(len(devices.members), devices.of)} devices"
    return Words(subject, where, p=block.p)


def _upgrade_parts(group: list[Alert], scope: list[SeriesVerdict], runs: Mapping[int, Run], traits: SeriesTraits
                   ) -> list[tuple[list[Alert], Words, str]]:
    """An upgrade's alerts as ``explain`` reads them: each block (named by its traits), its scatter, else the series
    that pass the single-series bound; what the screen flags by chance on any night, a new TVM's too, is none."""
    by_cell = {_cell(a): a for a in group}
    found = explain(map(_cell, scope), by_cell, traits)
    parts = [([by_cell[c] for c in b.cells], _words(b), "" if i == 0 else f"|{_block_key(b)}")
             for i, b in enumerate(found.blocks)]
    if found.scatter is not None:
        parts.append(([by_cell[c] for c in found.scatter.cells], Words(), "|scatter"))
    alone = [by_cell[c] for c in found.residual if _alone(by_cell[c], len(scope), runs)]
    if alone:
        parts.append((alone, Words(), "|series" if parts else ""))
    return parts


@dataclass(frozen=True)
class Words:
    """A finding's block in words (``Finding.subject``, ``where``, ``note``) and the p that preferred it."""

    subject: str = ""
    where: str = ""
    note: str = ""
    p: float | None = None


def _finding(kind: str, metric: str, direction: str, alerts: list[Alert], scope: list[SeriesVerdict],
             runs: Mapping[int, Run], cause: str = "", split: str = "", control: str = "",
             key_scope: str = "", own: list[Alert] | None = None, n: int | None = None, words: Words = Words()
             ) -> Finding:
    """One finding of ``alerts``; ``scope``: the judged series it is k of n of (``n`` when given); ``own``: the alerts
    it explains (no earlier finding does), its magnitude and representatives (default: all); ``words``: subject,
    where, note, p. A group whose every alert is under its noise floor has k = 0 (dropped by the caller)."""
    own = alerts if own is None else own
    if all(absolute_change(a) < noise_floor(a, runs.get(a.run_id)) for a in own):
        alerts = own = []
    logs = np.log1p(np.asarray([a.change or 0.0 for a in own], dtype=np.float64))
    zs = [abs(a.z or 0.0) for a in alerts]
    reruns = [a for a in alerts if "rounds" in a.confirmation]
    confirmed = sum(a.status == "confirmed" for a in reruns)
    rejected = sum(a.status == "rejected" for a in reruns)
    evidence = sum(min(z, Z_CAP) for z in zs) / math.sqrt(len(zs)) if zs else 0.0
    evidence *= 2.0 if confirmed else 0.25 if rejected and not confirmed else 1.0
    return Finding(
        key=f"{kind}|{metric}|{direction}|{key_scope}", kind=kind, metric=metric, direction=direction, cause=cause,
        change=float(np.expm1(logs.mean())) if logs.size else 0.0, ci=_interval(own, logs, runs), k=len(alerts),
        n=n if n is not None else max(len(scope), len(alerts)),
        devices=tuple(sorted({a.device for a in alerts})), models=tuple(sorted({_label(a) for a in alerts})),
        devices_judged=len({v.device for v in scope} | {a.device for a in alerts}),
        series=tuple({"device": a.device, "model": a.model, "tuned": a.tuned, "runtime": a.runtime,
                      "change": a.change, "z": a.z, "alert": a.id} for a in alerts),
        alerts=tuple(a.id for a in alerts), z=float(np.median(zs)) if zs else 0.0, evidence=evidence,
        cost_s=sum(absolute_change(a) for a in alerts), confirmed=confirmed, reruns=len(reruns), rejected=rejected,
        confidence=_confidence(kind, confirmed, rejected, len(reruns)), control=control, split=split,
        representatives=() if kind == "upgrade" else representatives(kind, own), subject=words.subject,
        where=words.where, note=words.note, p=words.p)


def _confidence(kind: str, confirmed: int, rejected: int, reruns: int) -> str:
    if kind == "upgrade":
        return UNCONFIRMABLE
    if confirmed:
        return f"confirmed on {confirmed}/{reruns} reruns"
    if rejected:
        return f"rejected on {rejected}/{reruns} reruns"
    return f"inconclusive on {reruns} reruns" if reruns else "unconfirmed"


def _cell(row: Any) -> Cell:
    return Cell(row.device, _label(row))


def representatives(kind: str, alerts: list[Alert], most: int = REPRESENTATIVES) -> tuple[int, ...]:
    """The alerts to rerun for a finding: steady TVM series, largest z first, each from another device (a device
    finding: another model) while there are any."""
    candidates = sorted((a for a in alerts if a.metric == "steady" and a.runtime == "tvm"), key=lambda a: -(a.z or 0.0))
    spread_over = (lambda a: _label(a)) if kind == "device" else (lambda a: a.device)
    chosen: list[Alert] = []
    for a in candidates:
        if len(chosen) < most and spread_over(a) not in {spread_over(c) for c in chosen}:
            chosen.append(a)
    for a in candidates:
        if len(chosen) < most and a not in chosen:
            chosen.append(a)
    return tuple(a.id for a in chosen)


def _interval(alerts: list[Alert], logs: np.ndarray, runs: Mapping[int, Run]) -> tuple[float, float] | None:
    if logs.size >= 2:
        draws = np.random.default_rng(0).integers(0, logs.size, (2000, logs.size))
        means = logs[draws].mean(axis=1)
        low, high = np.percentile(means, [2.5, 97.5])
        return float(np.expm1(low)), float(np.expm1(high))
    if len(alerts) == 1 and alerts[0].metric == "steady" and alerts[0].baseline:
        run = runs.get(alerts[0].run_id)
        centre = alerts[0].baseline["centre"]
        if run is not None and run.steady is not None and centre:
            return run.steady.ci_low / centre - 1, run.steady.ci_high / centre - 1
    return None


def _coverage_split(alert: Alert, runs: Mapping[int, Run]) -> str:
    """An upgrade that dropped tuning records (fewer tuned tasks, or none) vs one that slowed equally tuned code."""
    now, before = runs.get(alert.run_id), runs.get(alert.baseline_run_id or -1)
    if now is None or before is None or not before.tuned:
        return "same tuning coverage"
    old = before.tuned_tasks / before.total_tasks if before.total_tasks else 0.0
    new = now.tuned_tasks / now.total_tasks if now.tuned and now.total_tasks else 0.0
    return "tuning records dropped" if new < old else "same tuning coverage"


def _tuning_changed(alert: Alert, runs: Mapping[int, Run]) -> bool:
    """The model's own applied tuning changed between its baseline's last run and tonight's: the tasks that received
    a record, of its tasks. Not the artifact's ``tuning_digest``: that is the digest of the whole tuning key's record
    set, shared by every model on the target, so one kept nightly session would change it for every tuned model and
    fold the next night's unrelated driver or mass regression into one "tuning" finding. What this cannot see: new
    records for tasks that already had one (the same count); nightly tuning keeps a session only when the model is
    no slower with it."""
    now, before = runs.get(alert.run_id), runs.get(alert.baseline_run_id or -1)
    if now is None or before is None or not now.tuned:
        return False
    return (now.tuned_tasks, now.total_tasks) != (before.tuned_tasks, before.total_tasks)


def _context_cause(alerts: list[Alert], runs: Mapping[int, Run], judged: list[SeriesVerdict] = (),  # type: ignore[assignment]
                   manifests: Manifests | None = None) -> str:
    """What changed between the alerts' runs and their baselines' last runs, beyond the series' context: the fields
    of their manifests, ranked against the judged series that did not move (``causes``); for runs stored without
    manifests, farm's version, the model file, or nothing but the device (the same artifacts)."""
    moved = pairs_of(alerts, runs)
    if manifests and moved:
        still = pairs_of([v for v in judged if v.status == "ok"], runs)
        if words := cause_words(alerts[0].sweep_id, moved, candidates(moved, still, manifests), manifests):
            return words
    pairs = [(now, before) for before, now in moved]
    if not pairs:
        return ""
    farm = sorted({f"farm {b.farm_version} → {n.farm_version}" for n, b in pairs if n.farm_version != b.farm_version})
    if farm:
        return ", ".join(farm)
    if all(n.model_digest != b.model_digest for n, b in pairs):
        return "the model file changed"
    if all(n.artifact_key == b.artifact_key for n, b in pairs if n.runtime == "tvm"):
        return "same artifacts as the baseline: the device changed"
    return ""


def _control(alerts: list[Alert], judged: list[SeriesVerdict], direction: str) -> str:
    """The reference runtime's reading on the upgrade's devices: unchanged (TVM moved) or moved too (the device)."""
    devices = {a.device for a in alerts}
    reference = [v for v in judged if v.runtime != "tvm" and v.device in devices]
    if not reference:
        return "no reference runtime series on these devices: no control"
    moved = {v.device for v in reference if v.status == ("improved" if direction == "faster" else "candidate")}
    runtimes = "/".join(sorted({v.runtime for v in reference}))
    changes = [v.change for v in reference if v.change is not None]
    mean = math.expm1(float(np.mean(np.log1p(changes)))) if changes else 0.0
    seen = len({v.device for v in reference})
    if len(moved) * 2 >= seen:
        return f"{runtimes} moved too on {len(moved)}/{seen} devices ({mean:+.1%}): the devices changed, not only TVM"
    return f"{runtimes} unchanged on {seen - len(moved)}/{seen} devices ({mean:+.1%})"


def _label(row: Any) -> str:
    return model_label(row.model, row.tuned, row.runtime)


def _series_scope(alert: Alert) -> str:
    return f"{alert.device}|{_label(alert)}"
