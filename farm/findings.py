"""Findings: one sweep's alerts grouped by what moved them, ranked by evidence and cost (#22). No TVM, no database.

A reviewer asks what got slower, where, by how much and how sure we are; a farm's sweep answers per series, and on
the night that matters most (a toolchain change slowing half the models everywhere) that is a thousand rows. A
*finding* is a group of one sweep's alerts of one metric and direction with one cause:

  upgrade   a context change (``series.context_changes``): "TVM 0.27.0 → 0.28.0"; split by tuning coverage (an
            upgrade that dropped the tuning records is another cause than one that slowed equally tuned code);
            unconfirmable by rounds (a device's server runs one TVM); its control is the reference runtime's series
            on the same devices
  tuning    the model's own applied tuning changed since its baseline's run (a nightly tuning budget): tasks with a
            record, of its tasks (``_tuning_changed``)
  sweep     several models, each moved on most devices (a toolchain or farm change; what changed in the runs'
            context is named when something did)
  model     one model across devices (the model or its compilation changed)
  device    one device across models (the device, its driver or its thermal state changed)
  series    one series

Each alert goes to the broadest grouping that explains it best: a model whose alerts cover a larger share of its
devices than its device's alerts cover of that device's models is a model finding, else a device finding; groups
of one are single series. A finding's *magnitude* is the geometric mean of value / baseline centre over its alerts
with a bootstrap 95 % interval; *breadth* k of n judged series (and which devices and models); *confidence* what the
reruns said. Findings are ranked by evidence (Stouffer's z over the alerts: breadth and z; confirmation doubles it,
reruns that rejected it quarter it) times cost (absolute time moved × breadth), never by raw percent.

A metric moved by less than the larger of the timer's resolution and three times its run's own MAD is never a
finding by itself (``noise_floor``): a 20 % swing of a 1.4 µs copy is 0.28 µs.

``find_findings`` is the rule on records; ``sweep_findings`` reads what it needs of a sweep from the store (alerts,
runs, stored triage states) and ``record`` stores them (``Store.record_findings``), so the CLI,
the sweep and the report name the same findings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from farm.records import Alert, Record
from farm.regress import BYTE_METRICS, PLANNED_METRICS, SeriesVerdict, detect, detect_upgrades
from farm.series import by_sweep
from farm.stats import MAD_TO_SD, model_label

if TYPE_CHECKING:
    from farm.runs import Run
    from farm.store import Store

# The smallest change farm can tell from its clocks: a figure is a mean over ``number`` calls between two reads of
# a ns clock (std::chrono on the device, perf_counter here), but OpenCL profiling events report µs on mobile GPUs
# and a sub-µs difference of one call is below what any of farm's timers resolves. A choice, stated.
TIMER_RESOLUTION_S = 1e-6
PAGE_BYTES = 4096  # the measured memory's resolution: RSS is counted in pages
PLANNED_BYTE = 1.0  # planned memory's: read from the built module, exact; any change is a change (regress)
NOISE_MADS = 3.0  # ... and three times the run's own MAD of its samples (the rule)
BROAD = 0.5  # a model moved on at least half of its devices (a device on half its models) moved as a whole
SWEEP_WIDE = 0.8  # two or more models, each moved on at least 80 % of its devices: one sweep-wide finding
Z_CAP = 10.0  # one series' z counts at most this much in a finding's evidence: a huge z is not more evidence
REPRESENTATIVES = 3  # series rerun to confirm a finding (largest z, spread over its devices or models)
# Device-minutes a sweep's confirmation may spend by default. One representative costs 8 rounds × (a fresh session,
# two loads, 2 × 5 repeats): ~1 device-minute for a 10 ms model (bench_detect's --round-s), 16 rounds when
# inconclusive. 30 device-minutes confirm ~10 findings × 3 representatives in a night.
DEFAULT_BUDGET_MIN = 30.0
UNCONFIRMABLE = "unconfirmable: runtime changed"
SLOWER_STATUSES = ("candidate", "confirmed", "unknown", "rejected", "unconfirmable")
KINDS = ("upgrade", "tuning", "sweep", "model", "device", "series")


@dataclass(frozen=True)
class Finding(Record):
    """A group of one sweep's alerts with one cause. ``key`` names it across nights (kind, metric, direction,
    scope); ``state`` is its triage state (new | acknowledged | expected | fixed), carried by the store."""

    key: str
    kind: str  # upgrade | tuning | sweep | model | device | series
    metric: str
    direction: str  # slower | faster
    cause: str  # what changed, in words ('' when nothing in the runs' context says)
    change: float  # geometric mean of value / baseline centre, minus 1: +0.10 = 10 % slower
    ci: tuple[float, float] | None  # bootstrap 95 % interval of that geometric mean (its run's for one series)
    k: int  # series moved
    n: int  # series judged in the finding's scope
    devices: tuple[str, ...]
    models: tuple[str, ...]  # model labels (model_label)
    devices_judged: int  # devices with a judged series in the scope
    series: tuple[dict[str, Any], ...]  # device, model, tuned, runtime, change, z, alert
    alerts: tuple[int, ...]  # alert ids
    z: float  # median z of its alerts
    evidence: float
    cost_s: float  # sum of |value − baseline centre| over its alerts (bytes for a memory metric)
    confirmed: int  # representatives rerun and confirmed
    reruns: int  # representatives rerun
    rejected: int  # representatives rerun whose rounds found no change (status rejected)
    confidence: str
    control: str = ""  # what the reference runtime's series say (upgrades)
    split: str = ""  # upgrades: "tuning records dropped" | "same tuning coverage"
    representatives: tuple[int, ...] = ()  # alert ids to rerun
    state: str = "new"
    finding_id: int | None = None
    first_sweep: int | None = None

    VIEWS = ("sentence", "rank_score")

    @property
    def rank_score(self) -> float:
        """Evidence × cost: cost in the metric's resolutions (a µs, a page), on a log scale."""
        return self.evidence * (1.0 + math.log10(1.0 + self.cost_s / resolution(self.metric)))

    @property
    def sentence(self) -> str:
        return sentence(self)


def noise_floor(alert: Alert, run: "Run | None") -> float:
    """The smallest absolute change of ``alert`` that can be a finding: the timer's resolution, or three times the
    run's own MAD (its steady samples'; for a metric of one value per run, the MAD of its baseline's nights). Both
    stored spreads are MADs scaled to a normal SD (``stats.MAD_TO_SD``): divided back, so 3 × MAD is 3 × MAD."""
    mad = None
    if alert.metric == "steady" and run is not None and run.steady is not None:
        mad = run.steady.mad / MAD_TO_SD
    elif alert.baseline is not None:
        mad = alert.baseline["spread"] / MAD_TO_SD
    return max(resolution(alert.metric), NOISE_MADS * (mad or 0.0))


def resolution(metric: str) -> float:
    """The smallest change of ``metric`` its measurement resolves: a byte for planned memory, a page for measured
    memory, the timer's for times."""
    if metric in PLANNED_METRICS:
        return PLANNED_BYTE
    return PAGE_BYTES if metric in BYTE_METRICS else TIMER_RESOLUTION_S


def absolute_change(alert: Alert) -> float:
    return abs(alert.value - alert.baseline["centre"]) if alert.baseline else 0.0


def find_findings(alerts: Iterable[Alert], verdicts: Iterable[SeriesVerdict], runs: Mapping[int, "Run"]) -> list[Finding]:
    """Group ``alerts`` (one sweep's, as stored) into findings, best first. ``verdicts``: the sweep's verdicts of
    every judged series (``regress.detect`` and ``regress.detect_upgrades``: the denominators and the controls);
    ``runs``: run id → ``Run`` for the alerts' runs and their baselines' last runs."""
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
        findings += _group(metric, direction, group, judged, runs)
    return sorted(findings, key=lambda f: (f.direction != "slower", -f.rank_score, f.key))


def _group(metric: str, direction: str, alerts: list[Alert], judged: list[SeriesVerdict],
           runs: Mapping[int, "Run"]) -> list[Finding]:
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
        out.append(_finding("upgrade", metric, direction, group, scope, runs, cause=change, split=split,
                            control=_control(group, plain_judged, direction), key_scope=f"{change}|{split}"))
    if tuning:
        out.append(_finding("tuning" if len(tuning) > 1 else "series", metric, direction, tuning, plain_judged, runs,
                            cause="tuning records changed",
                            key_scope="tuning" if len(tuning) > 1 else _series_scope(tuning[0])))
    out += _broad(metric, direction, rest, plain_judged, runs)
    return [f for f in out if f.k]



Group = tuple[str, str]  # ("model", its label) or ("device", its name): what a broad finding is about


def _model_of(alert) -> Group:
    return ("model", _label(alert))


def _device_of(alert) -> Group:
    return ("device", alert.device)

def _broad(metric: str, direction: str, alerts: list[Alert], judged: list[SeriesVerdict],
           runs: Mapping[int, "Run"]) -> list[Finding]:
    """Model, device, sweep-wide and single-series findings of alerts with no context or tuning change.

    Each alert is explained by its model when the model moved on a share of its devices of at least ``BROAD`` and at
    least its device's share of models, else by its device when that share is ``BROAD`` or more, else by nothing (a
    single series). A group needs two alerts it explains; its magnitude is theirs, its breadth every alert of its
    model (device): a device whose driver slowed all its models, half of which a mass regression also slowed, is
    "8/8 series" at the driver's own change."""
    n_of: dict[Group, int] = {}
    k_of: dict[Group, int] = {}
    for name in [_model_of(v) for v in judged] + [_device_of(v) for v in judged]:
        n_of[name] = n_of.get(name, 0) + 1
    for name in [_model_of(a) for a in alerts] + [_device_of(a) for a in alerts]:
        k_of[name] = k_of.get(name, 0) + 1

    def share(name: Group) -> float:
        value = k_of[name] / max(n_of.get(name, 0), k_of[name])
        return value if value >= BROAD else 0.0

    explained: dict[Group, list[Alert]] = {}
    singles: list[Alert] = []
    for a in alerts:
        by_model, by_device = share(_model_of(a)), share(_device_of(a))
        if by_model and by_model >= by_device:
            explained.setdefault(_model_of(a), []).append(a)
        elif by_device:
            explained.setdefault(_device_of(a), []).append(a)
        else:
            singles.append(a)
    for name in [name for name, group in explained.items() if len(group) < 2]:
        singles += explained.pop(name)
    members = {name: [a for a in alerts if name in (_model_of(a), _device_of(a))] for name in explained}

    def alone(own: list[Alert]) -> list[Alert]:
        """A model group's alerts on devices no device group explains: its magnitude, not the device's on top."""
        return [a for a in own if _device_of(a) not in explained] or own
    out = []
    wide = [name for name in explained if name[0] == "model" and share(name) >= SWEEP_WIDE]
    if len(wide) >= 2:
        group = [a for name in wide for a in members[name]]
        own = [a for name in wide for a in explained[name]]
        out.append(_finding("sweep", metric, direction, group, judged, runs, cause=_context_cause(own, runs),
                            key_scope="sweep", own=alone(own)))
    for name, own in sorted(explained.items()):
        kind, entity = name
        if name in wide and len(wide) >= 2:
            continue
        scope = [v for v in judged if (_label(v) if kind == "model" else v.device) == entity]
        out.append(_finding(kind, metric, direction, members[name], scope, runs, cause=_context_cause(own, runs),
                            key_scope=entity, own=alone(own) if kind == "model" else own))
    for alert in singles:
        if absolute_change(alert) < noise_floor(alert, runs.get(alert.run_id)):
            continue  # never a finding by itself
        scope = [v for v in judged if v.device == alert.device and _label(v) == _label(alert)]
        out.append(_finding("series", metric, direction, [alert], scope, runs, cause=_context_cause([alert], runs),
                            key_scope=_series_scope(alert)))
    return out


def _finding(kind: str, metric: str, direction: str, alerts: list[Alert], scope: list[SeriesVerdict],
             runs: Mapping[int, "Run"], cause: str = "", split: str = "", control: str = "",
             key_scope: str = "", own: list[Alert] | None = None) -> Finding:
    """One finding of ``alerts``; ``scope``: the judged series it is k of n of; ``own``: the alerts it explains (no
    broader finding does), its magnitude and representatives (default: all). A group whose every alert is under its
    noise floor has k = 0 (dropped by the caller)."""
    own = alerts if own is None else own
    if all(absolute_change(a) < noise_floor(a, runs.get(a.run_id)) for a in own):
        alerts = own = []
    logs = np.log1p(np.asarray([a.change or 0.0 for a in own], dtype=np.float64))
    change = float(np.expm1(logs.mean())) if logs.size else 0.0
    zs = [abs(a.z or 0.0) for a in alerts]
    reruns = [a for a in alerts if "rounds" in a.confirmation]
    confirmed = sum(a.status == "confirmed" for a in reruns)
    rejected = sum(a.status == "rejected" for a in reruns)
    if kind == "upgrade":
        confidence = UNCONFIRMABLE
    elif confirmed:
        confidence = f"confirmed on {confirmed}/{len(reruns)} reruns"
    elif rejected:
        confidence = f"rejected on {rejected}/{len(reruns)} reruns"
    elif reruns:
        confidence = f"inconclusive on {len(reruns)} reruns"
    else:
        confidence = "unconfirmed"
    evidence = sum(min(z, Z_CAP) for z in zs) / math.sqrt(len(zs)) if zs else 0.0
    evidence *= 2.0 if confirmed else 0.25 if rejected and not confirmed else 1.0
    scope_devices = {v.device for v in scope} | {a.device for a in alerts}
    return Finding(
        key=f"{kind}|{metric}|{direction}|{key_scope}", kind=kind, metric=metric, direction=direction, cause=cause,
        change=change, ci=_interval(own, logs, runs), k=len(alerts), n=max(len(scope), len(alerts)),
        devices=tuple(sorted({a.device for a in alerts})), models=tuple(sorted({_label(a) for a in alerts})),
        devices_judged=len(scope_devices),
        series=tuple({"device": a.device, "model": a.model, "tuned": a.tuned, "runtime": a.runtime,
                      "change": a.change, "z": a.z, "alert": a.id} for a in alerts),
        alerts=tuple(a.id for a in alerts), z=float(np.median(zs)) if zs else 0.0, evidence=evidence,
        cost_s=sum(absolute_change(a) for a in alerts), confirmed=confirmed, reruns=len(reruns), rejected=rejected,
        confidence=confidence, control=control, split=split,
        representatives=() if kind == "upgrade" else representatives(kind, own))


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


def _interval(alerts: list[Alert], logs: np.ndarray, runs: Mapping[int, "Run"]) -> tuple[float, float] | None:
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


def _coverage_split(alert: Alert, runs: Mapping[int, "Run"]) -> str:
    """An upgrade that dropped tuning records (fewer tuned tasks, or none) vs one that slowed equally tuned code."""
    now, before = runs.get(alert.run_id), runs.get(alert.baseline_run_id or -1)
    if now is None or before is None or not before.tuned:
        return "same tuning coverage"
    old = before.tuned_tasks / before.total_tasks if before.total_tasks else 0.0
    new = now.tuned_tasks / now.total_tasks if now.tuned and now.total_tasks else 0.0
    return "tuning records dropped" if new < old else "same tuning coverage"


def _tuning_changed(alert: Alert, runs: Mapping[int, "Run"]) -> bool:
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


def _context_cause(alerts: list[Alert], runs: Mapping[int, "Run"]) -> str:
    """What changed between the alerts' runs and their baselines' last runs, beyond the series' context: farm's
    version, the model file; or nothing but the device (the same artifacts)."""
    pairs = [(now, before) for a in alerts
             if (now := runs.get(a.run_id)) is not None and (before := runs.get(a.baseline_run_id or -1)) is not None]
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


def percent(change: float) -> str:
    return f"{abs(change) * 100:.1f} %"


def sentence(f: Finding) -> str:
    """A finding in one sentence: "12 models are 9.8 % slower (CI 9.5–10.1 %) on 40/40 devices since TVM 0.27.0 →
    0.28.0; unconfirmable: runtime changed"."""
    models = f"{len(f.models)} models" if len(f.models) > 1 else f.models[0]
    what = "" if f.metric == "steady" else f" in {f.metric.replace('_', ' ')}"
    ci = ""
    if f.ci is not None and f.ci[0] * f.ci[1] > 0:
        low, high = sorted(abs(c) for c in f.ci)
        ci = f" (CI {low * 100:.1f}–{high * 100:.1f} %)"
    elif f.ci is not None:
        ci = f" (CI {f.ci[0] * 100:+.1f} to {f.ci[1] * 100:+.1f} %)"
    direction = {"slower": "larger", "faster": "smaller"}[f.direction] if f.metric in BYTE_METRICS else f.direction
    moved = f"{percent(f.change)} {direction}{what}{ci}"
    if f.kind == "device":
        text = f"{f.devices[0]}: {f.k}/{f.n} series are {moved}"
    elif f.kind == "series":
        text = f"{models} on {f.devices[0]} is {moved}"
    else:
        verb = "are" if len(f.models) > 1 else "is"
        text = f"{models} {verb} {moved} on {len(f.devices)}/{f.devices_judged} devices"
        if f.kind in ("sweep", "upgrade", "tuning"):
            text += f" ({f.k}/{f.n} series)"
    if f.cause:
        text += f" since {f.cause}" if f.kind == "upgrade" else f"; {f.cause}"
    if f.split:
        text += f" ({f.split})"
    text += f"; {f.confidence}"
    if f.control:
        text += f"; control: {f.control}"
    return text


def sweep_verdicts(rows: list["Run"], sweep_id: int, accepted: dict | None = None) -> list[SeriesVerdict]:
    """Every judged series of a sweep: ``regress.detect``'s verdicts and, beside them, ``detect_upgrades``' (the
    upgrade rule: a new context compared with the old context's last nights)."""
    accepted = accepted if accepted is not None else by_sweep(rows, keep_unstable_of=sweep_id)
    return detect(rows, sweep_id, accepted=accepted) + detect_upgrades(rows, sweep_id, accepted=accepted)


def sweep_findings(store: "Store", sweep_id: int, rows: list["Run"],
                   verdicts: list[SeriesVerdict] | None = None) -> list[Finding]:
    """The findings of a sweep's stored alerts (``rows``: ``results.run_rows`` of the store), with their stored triage
    state where the sweep was reviewed (read only: ``record`` stores them)."""
    verdicts = verdicts if verdicts is not None else sweep_verdicts(rows, sweep_id)
    alerts = store.alerts(sweep_id)
    wanted = {a.run_id for a in alerts} | {a.baseline_run_id for a in alerts if a.baseline_run_id is not None}
    runs = {r.run_id: r for r in rows if r.run_id in wanted}
    findings = find_findings(alerts, verdicts, runs)
    states = store.finding_states([f.key for f in findings], sweep_id)
    return [with_state(f, states.get(f.key)) for f in findings]


def record(store: "Store", sweep_id: int, findings: list[Finding]) -> list[Finding]:
    """Store a sweep's findings; each comes back with its id, triage state and first sweep (a finding that persists
    from the last reviewed sweep keeps them)."""
    states = store.record_findings(sweep_id, [dict(f) for f in findings])
    return [with_state(f, states.get(f.key)) for f in findings]


def with_state(finding: Finding, state: Mapping[str, Any] | None) -> Finding:
    if state is None:
        return finding
    return replace(finding, state=state["state"], finding_id=state["id"], first_sweep=state["first_sweep"])
