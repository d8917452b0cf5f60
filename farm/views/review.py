"""A sweep's review for the report: summary, per-alert evidence, heatmap, phases, data quality, drift.

Everything here is computed from the store's raw rows (results.run_rows) with the same
regress.detect the CLI uses, so the report and `farm regressions` agree. Figures are PNGs
(matplotlib, Agg) returned base64-encoded for inlining.
"""

from __future__ import annotations

import math
from concurrent.futures import Executor, Future
from typing import Any

import numpy as np

from farm.analysis.drift import MIN_CHANGE, MIN_SIZE, PENALTY, drift_rows
from farm.views.figures import InlineExecutor, figure_png, pyplot
from farm.analysis.findings import Finding, stored_findings, sweep_findings, sweep_verdicts
from farm.manifest import changes
from farm.records import Alert
from farm.analysis.regress import BYTE_METRICS, METHOD, SeriesVerdict, series_value
from farm.analysis.results import run_rows
from farm.analysis.runs import Run
from farm.analysis.series import by_sweep, series_key
from farm.stats import bootstrap_median_ci, byte_unit, format_bytes, format_duration, hottest, model_label, time_unit
from farm.store import Store

HEAT_LIMIT = 0.20  # colour scale of the heatmap saturates at ±20 %
PLOTTED_CELLS = 40  # past this many cells a figure shows the ones that matter most, and says so
LABELLED_CELLS = 300  # heatmap cells that get a printed value
THERMAL_RISE_C = 5.0  # a cell that warmed the device this much is a thermal event
EVIDENCE_ALERTS = 10  # alerts drawn (trend + distribution each: ≤ 20 figures), the top findings' first (#22)
EVIDENCE_PER_FINDING = 3  # ... at most this many of one finding while later findings have none
SENTENCES = 5  # findings written out as sentences (a screen, #32); the rest are a folded table


def label(row: Run | SeriesVerdict) -> str:
    return model_label(row.model, row.tuned, row.runtime)


def review_figures(alerts: list[Alert]) -> int:
    """How many figures ``sweep_review`` draws for a sweep with ``alerts`` (for ``figures.figure_pool``)."""
    return 2 * min(len(alerts), EVIDENCE_ALERTS) + 2


def evidence_alerts(findings: list[Finding], alerts: list[Alert], most: int = EVIDENCE_ALERTS) -> list[Alert]:
    """The alerts whose evidence is drawn: the findings' in rank order (representatives first, then by z; at most
    ``EVIDENCE_PER_FINDING`` of one finding in a first pass), then any other alert, worst first, up to ``most``."""
    by_id = {a.id: a for a in alerts}
    order = [[by_id[i] for i in dict.fromkeys(f.representatives + tuple(
        s["alert"] for s in sorted(f.series, key=lambda s: -abs(s["z"] or 0.0)))) if i in by_id] for f in findings]
    chosen: dict[int, Alert] = {}
    for limit in (EVIDENCE_PER_FINDING, len(alerts)):
        for group in order:
            for alert in group[:limit]:
                if len(chosen) < most:
                    chosen.setdefault(alert.id, alert)
    for alert in sorted(alerts, key=worst_first):
        if len(chosen) < most:
            chosen.setdefault(alert.id, alert)
    return list(chosen.values())


def review_order(findings: list[Finding], alerts: list[Alert]) -> list[Alert]:
    """Alerts in reading order: by their finding's rank (the strongest z first inside one), then the alerts of no
    finding, worst first."""
    rank: dict[int, tuple[int, float]] = {}
    for i, f in enumerate(findings):
        for s in f.series:
            rank.setdefault(s["alert"], (i, -abs(s["z"] or 0.0)))
    return sorted(alerts, key=lambda a: (rank.get(a.id, (len(findings), 0.0)), worst_first(a)))


def sweep_review(store: Store, sweep_id: int, pool: Executor | None = None, history: list[Run] | None = None
                 ) -> dict[str, Any]:
    """The review's data and figures. ``pool`` (``figures.figure_pool``) draws the figures while this goes on
    computing; without one, each is drawn where it is needed. ``history``: the store's runs as the night's review
    read them, when nothing was stored since (the night's pipeline passes them forward); else read here."""
    pool = pool or InlineExecutor()
    rows = history if history is not None else run_rows(store)
    current = [r for r in rows if r.sweep_id == sweep_id]
    accepted = by_sweep(rows, keep_unstable_of=sweep_id)  # each series' accepted run per sweep, once
    verdicts = sweep_verdicts(rows, sweep_id, accepted)  # upgrades beside the baselines' verdicts
    stored = stored_findings(store, sweep_id)  # a reviewed night's, as its review stored them: never judged again
    findings = stored if stored is not None else sweep_findings(store, sweep_id, rows, verdicts)
    alerts = review_order(findings, store.alerts(sweep_id))
    evidence = {a.id: alert_evidence(store, rows, a, accepted, pool) for a in evidence_alerts(findings, alerts)}
    heatmap = pool.submit(heatmap_png, verdicts)
    drift = drift_view(rows, pool)  # computed here while the figures above are drawn
    sweep = store.sweep(sweep_id) or {"spec": {}}
    reference = sweep["spec"].get("reference") or ""
    statuses = [a.status for a in alerts]
    return {
        "counts": {s: statuses.count(s) for s in ("confirmed", "candidate", "improved", "rejected", "unknown")},
        "failed_cells": sorted({(r.device, r.model) for r in current if r.status == "failed"}
                               - {(r.device, r.model) for r in current if r.status == "ok"}),
        "unstable_cells": [(r.device, label(r)) for r in current if r.status == "ok" and r.unstable],
        "geomean": geomean_by_device(verdicts),
        "findings": findings,
        "sentences": SENTENCES,
        "new_findings": sum(f.first_sweep in (None, sweep_id) for f in findings),
        "budget": store.budget(sweep_id),
        "alerts": alerts,
        "evidence": {alert_id: resolved(e) for alert_id, e in evidence.items()},
        "heatmap_png": heatmap.result(),
        "quality": quality_rows([r for r in current if r.status == "ok"]),
        "reference": reference,
        "reference_drift": [v for v in verdicts if v.model == reference and v.metric == "steady"],
        "drift": resolved(drift),
        "method": {**METHOD.to_json(),
                   "drift": {"algorithm": "optimal partitioning (PELT's objective, solved exactly), L2 cost on log values",
                             "penalty": f"{PENALTY:g}·σ²·ln n", "min_nights_per_segment": MIN_SIZE,
                             "min_shift": MIN_CHANGE}},
    }


def geomean_by_device(verdicts: list[SeriesVerdict]) -> list[dict[str, Any]]:
    """Per device: the geometric mean of steady-latency change against baselines (+ = slower)."""
    by_device: dict[str, list[float]] = {}
    for v in verdicts:
        if v.metric == "steady" and v.change is not None:
            by_device.setdefault(v.device, []).append(v.change)
    return [{"device": d, "series": len(c), "change": math.expm1(float(np.mean(np.log1p(c))))}
            for d, c in sorted(by_device.items())]


def series_history(rows: list[Run], alert: Alert, accepted_by_series: dict, run_id: int | None = None,
                   until: int | None = None) -> list[tuple[int, float, int]]:
    """(sweep id, value, run id) of the alert's series (of run ``run_id``'s series when given), one accepted value
    per sweep up to the alert's (up to sweep ``until``); ``accepted_by_series``: ``series.by_sweep`` of ``rows``,
    computed once by the caller."""
    wanted = alert.run_id if run_id is None else run_id
    alerted = next((r for r in rows if r.run_id == wanted), None)
    if alerted is None:
        return []
    accepted = accepted_by_series.get(series_key(alerted), {})
    out = []
    for sweep_id in sorted(s for s in accepted if s <= (alert.sweep_id if until is None else until)):
        value = series_value(alert.metric, accepted[sweep_id])
        if value is not None:
            out.append((sweep_id, value, accepted[sweep_id].run_id))
    return out


def baseline_history(rows: list[Run], alert: Alert, accepted_by_series: dict) -> list[tuple[int, float, int]]:
    """(sweep id, value, run id) of the nights the alert's baseline was taken from, oldest first: its series' last
    ``n`` before the alert's sweep or, across a context change (an upgrade: ``baseline["context_change"]``), the old
    context's series' last ``n`` up to its last run (``baseline_run_id``), never the new context's nights."""
    base = baseline_of_alert(alert)
    if base.get("context_change") and alert.baseline_run_id is not None:
        old = next((r for r in rows if r.run_id == alert.baseline_run_id), None)
        history = [] if old is None or old.sweep_id is None else series_history(
            rows, alert, accepted_by_series, run_id=old.run_id, until=old.sweep_id)
    else:
        history = [h for h in series_history(rows, alert, accepted_by_series) if h[0] != alert.sweep_id]
    return history[-base["n"]:]


def resolved(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` with each figure still being drawn (a Future) replaced by its PNG."""
    return {k: v.result() if isinstance(v, Future) else v for k, v in item.items()}


def baseline_of_alert(alert: Alert) -> dict[str, Any]:
    """The baseline an alert was judged against: every alert has one (``detect`` finds a candidate or an
    improvement only against a baseline); ValueError for one stored without."""
    if alert.baseline is None:
        raise ValueError(f"alert {alert.id} has no baseline to draw")
    return alert.baseline


def alert_evidence(store: Store, rows: list[Run], alert: Alert, accepted_by_series: dict,
                   pool: Executor) -> dict[str, Any]:
    """An alert's baseline and current intervals, its trend and its distribution: the two figures are Futures of
    ``pool`` (``resolved``)."""
    history = series_history(rows, alert, accepted_by_series)
    base = baseline_of_alert(alert)
    baseline = baseline_history(rows, alert, accepted_by_series)
    baseline_runs = [run for _, _, run in baseline]
    if base.get("context_change"):  # the trend: the old context's nights, then the new one's
        history = baseline + history
    ci = bootstrap_median_ci(base["values"]) if len(base["values"]) >= 2 else (None, None)
    if alert.metric == "steady":
        old = [v for run in baseline_runs for v in store.samples(run)]
        new = store.samples(alert.run_id)
        current_ci = bootstrap_median_ci(new) if len(new) >= 2 else (None, None)
    else:
        old, new, current_ci = list(base["values"]), [alert.value], (None, None)
    z_limit = METHOD.thresholds[alert.metric].z if alert.metric in METHOD.thresholds else 0.0  # planned: no band
    marks = manifest_marks(store, rows, history)
    evidence = {"id": alert.id, "baseline_ci": ci, "current_ci": current_ci, "manifest_changes": marks,
                "trend_png": pool.submit(trend_png, alert, history, z_limit, [sweep for sweep, _ in marks]),
                "distribution_png": pool.submit(distribution_png, alert, old, new)}
    return evidence


def manifest_marks(store: Store, rows: list[Run], history: list[tuple[int, float, int]]) -> list[tuple[int, str]]:
    """(sweep, what changed in words) for each night of ``history`` whose run names another manifest than the night
    before's (``farm.manifest``): the lines a trend draws."""
    wanted = {run_id for _, _, run_id in history}
    digest = {r.run_id: r.manifest for r in rows if r.run_id in wanted}
    steps = [(now[0], digest.get(before[2]), digest.get(now[2])) for before, now in zip(history, history[1:])]
    steps = [(sweep, old, new) for sweep, old, new in steps if old and new and old != new]
    manifests = store.manifests([d for _, old, new in steps for d in (old, new)])
    said = [(sweep, ", ".join(c.words for c in changes(manifests.get(old or "", {}), manifests.get(new or "", {}))[:3]))
            for sweep, old, new in steps]
    return [(sweep, words) for sweep, words in said if words]  # a field read one night and not the next: no change


def unit_of(metric: str, values: list[float]):
    """The axis unit of a metric's values: bytes for memory metrics (``regress.BYTE_METRICS``), else time."""
    return byte_unit(values) if metric in BYTE_METRICS else time_unit(values)


def format_metric(metric: str, value: float | None) -> str:
    """A regression metric's value with its unit, as ``unit_of`` chooses it ('' for None): the report's and the
    CLI's."""
    return format_bytes(value) if metric in BYTE_METRICS else format_duration(value)


def trend_png(alert: Alert, history: list[tuple[int, float, int]], z_limit: float, marks: list[int] = ()  # type: ignore[assignment]
              ) -> str:
    """The series' nights, its baseline band and this sweep; a dotted line at each night in ``marks`` (its manifest
    changed: ``manifest_marks``)."""
    plt = pyplot()
    base = baseline_of_alert(alert)
    fig, ax = plt.subplots(figsize=(5.2, 2.6))
    unit = unit_of(alert.metric, [v for _, v, _ in history] + [alert.value, base["centre"]])
    xs = [s for s, _, _ in history]
    ys = [v / unit.seconds for _, v, _ in history]
    ax.plot(xs, ys, "o-", color="tab:blue", markersize=3, linewidth=1, label="nightly value")
    low = (base["centre"] - z_limit * base["spread"]) / unit.seconds
    high = (base["centre"] + z_limit * base["spread"]) / unit.seconds
    ax.axhspan(low, high, color="tab:green", alpha=0.15, label=f"baseline ± {z_limit:g}·spread")
    ax.axhline(base["centre"] / unit.seconds, color="tab:green", linewidth=1)
    ax.plot([alert.sweep_id], [alert.value / unit.seconds], "o", color="tab:red", markersize=7, label="this sweep")
    for i, sweep in enumerate(marks):
        ax.axvline(sweep - 0.5, color="tab:purple", linestyle=":", linewidth=1.2,
                   label="manifest changed" if i == 0 else None)
    ax.set_xlabel("sweep")
    ax.set_ylabel(f"{alert.metric} ({unit.name})")
    ax.legend(fontsize=7, loc="best")
    fig.subplots_adjust(left=0.14, right=0.98, bottom=0.18, top=0.96)
    return figure_png(fig, tight=False)


def distribution_png(alert: Alert, old: list[float], new: list[float]) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 2.6))
    unit = unit_of(alert.metric, list(old) + list(new))
    data = [[v / unit.seconds for v in old], [v / unit.seconds for v in new]]
    ax.boxplot(data, showfliers=False)
    rng = np.random.default_rng(0)
    for i, values in enumerate(data, start=1):
        ax.plot(i + rng.uniform(-0.12, 0.12, len(values)), values, "o", alpha=0.35, markersize=3,
                color="tab:green" if i == 1 else "tab:red")
    ax.set_xticks([1, 2], [f"baseline ({len(old)})", f"this sweep ({len(new)})"])
    ax.set_ylabel(f"{alert.metric} ({unit.name})")
    fig.subplots_adjust(left=0.17, right=0.98, bottom=0.12, top=0.96)
    return figure_png(fig, tight=False)


def heatmap_png(verdicts: list[SeriesVerdict]) -> str:
    cells = {(label(v), v.device): v.change for v in verdicts if v.metric == "steady"}
    if not cells:
        return ""
    plt = pyplot()
    models = sorted({m for m, _ in cells})
    devices = sorted({d for _, d in cells})
    grid = np.full((len(models), len(devices)), np.nan)
    for (m, d), change in cells.items():
        if change is not None:
            grid[models.index(m), devices.index(d)] = change * 100
    labelled = len(cells) <= LABELLED_CELLS
    width, height = 1.4 * len(devices) + 2, 0.45 * len(models) + 1
    if not labelled:  # colours only: cells shrink to fit a page (40 devices × 25 models: 14 × 9 in, not 58 × 12)
        width, height = min(width, 0.3 * len(devices) + 2), min(height, 0.3 * len(models) + 1.5)
    fig, ax = plt.subplots(figsize=(max(3.5, width), max(2.2, height)))
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdBu_r", vmin=-HEAT_LIMIT * 100, vmax=HEAT_LIMIT * 100, aspect="auto")
    for i, m in enumerate(models if labelled else []):  # past that, the colours say it
        for j, d in enumerate(devices):
            missing = np.isnan(grid[i, j])
            text = ("no baseline" if (m, d) in cells else "") if missing else f"{grid[i, j]:+.1f}%"
            dark = not np.isnan(grid[i, j]) and abs(grid[i, j]) > HEAT_LIMIT * 60  # past 60 % of the scale
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_xticks(range(len(devices)), devices, fontsize=7, rotation=20)
    ax.set_yticks(range(len(models)), models, fontsize=7)
    fig.colorbar(image, ax=ax, label="steady change vs baseline (%)")
    return figure_png(fig)


def worst_first(alert: Alert) -> tuple:
    """Alerts in reading order: confirmed and candidate regressions first, the largest slowdown first."""
    rank = {"confirmed": 0, "candidate": 1, "unknown": 2}.get(alert.status, 3)
    return rank, -(alert.change or 0.0), alert.id


def _total_s(row: Run) -> float:
    return (row.load_s or 0) + (row.first_run_s or 0) + (row.steady_median_s or 0) + sum(v or 0 for v in row.copy_s)


def stacked_png(rows: list[Run], most: int = PLOTTED_CELLS) -> str:
    """Load, first run, one steady call and copies per cell; with more than ``most`` cells, the slowest ``most``."""
    if not rows:
        return ""
    plt = pyplot()
    if len(rows) > most:
        rows = sorted(rows, key=_total_s, reverse=True)[:most]
    rows = sorted(rows, key=lambda r: (r.device, label(r)))
    names = [f"{r.device} · {label(r)}" for r in rows]
    phases = [("load", [r.load_s or 0 for r in rows]), ("first run", [r.first_run_s or 0 for r in rows]),
              ("steady (1 call)", [r.steady_median_s or 0 for r in rows]),
              ("copy (all outputs)", [sum(v or 0 for v in r.copy_s) for r in rows])]
    fig, ax = plt.subplots(figsize=(7, max(2.2, 0.35 * len(rows) + 1)))
    left = np.zeros(len(rows))
    for name, values in phases:
        ms = np.asarray(values) * 1000
        ax.barh(names, ms, left=left, label=name)
        left += ms
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("ms per cell: load + first run + one steady call + copies")
    ax.legend(fontsize=7, loc="lower right")
    return figure_png(fig)


def quality_rows(rows: list[Run]) -> list[dict[str, Any]]:
    out = []
    for r in sorted(rows, key=lambda r: (r.device, label(r))):
        context = r.context
        cooldown = context.get("cooldown") or {}
        before, after = hottest(context.get("device_health") or {}), hottest(context.get("device_health_after") or {})
        events = []
        if cooldown.get("gate") in ("timed out", "unreadable"):
            events.append(f"gate {cooldown['gate']}" + (f": {cooldown['reason']}" if cooldown.get("reason") else ""))
        elif cooldown.get("gate_wait_s"):
            events.append(f"waited {cooldown['gate_wait_s']:.0f} s to cool/charge")
        if before is not None and after is not None and after - before >= THERMAL_RISE_C:
            events.append(f"warmed {after - before:.1f} °C")
        battery = (context.get("device_health") or {}).get("battery_pct")
        out.append({"device": r.device, "model": label(r), "cv": r.steady_cv, "unstable": r.unstable,
                    "repeats": r.steady_n, "temp_before": before, "temp_after": after, "battery": battery,
                    "events": "; ".join(events)})
    return out


def drift_view(rows: list[Run], pool: Executor) -> dict[str, Any]:
    """Series whose steady history changed level, with one figure of them (a Future of ``pool``, ``resolved``)."""
    series = drift_rows(rows, _steady_median)
    shifted = [s for s in series if s["change_points"]]
    return {"series": len(series), "shifted": shifted, "png": pool.submit(drift_png, shifted[:8]) if shifted else ""}


def _steady_median(row: Run) -> float | None:
    return row.steady_median_s


def drift_png(shifted: list[dict[str, Any]]) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3))
    for s in shifted:
        line, = ax.plot(s["sweeps"], [v * 1000 for v in s["values"]], "o-", markersize=2, linewidth=0.8,
                        label=f"{s['device']} · {model_label(s['model'], s['tuned'])}")
        for seg in s["segments"]:
            ax.hlines(seg["median"] * 1000, seg["first_sweep"], seg["last_sweep"], colors=line.get_color(), linewidth=2.5)
    ax.set_xlabel("sweep")
    ax.set_ylabel("steady median (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    return figure_png(fig)
