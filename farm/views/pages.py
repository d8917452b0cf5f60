"""The dashboard's pages of findings, series and comparisons (#64): read from the store, never judged again.

- ``/findings``: a reviewed night's stored findings (``Store.findings``), in the order its review ranked them:
  sentence, state, age, kernels. The same rows `farm regressions` stored and the report shows.
- ``/finding/<id>``: up to ``SERIES_SHOWN`` of its series, each drawn over its last ``NIGHTS_SHOWN`` nights.
- ``/series?device=&model=&tuned=&runtime=``: any one series, drawn the same way (linked from the report).
- ``/compare?a=&b=``: two runs (``compare.compare_runs``); ``/nights?a=&b=``: two nights (``compare.compare_nights``).

A series is drawn as hand-written SVG (``series_svg``): each night a point with its run's bootstrap 95 % interval of
the median, the baseline band of the finding's alert (centre ± z·spread, ``regress.METHOD``), the finding's nights
and the series' other alerts marked, and a labelled vertical line wherever the run's context changed (its series
context: TVM, target, pipeline, threads; or its manifest: ``farm.manifest``). A point's ``<title>`` gives its run,
night, date and versions; clicking two points opens ``/compare`` of those runs (a few lines of script, allowed by
the page's nonce). Nothing is fetched from outside the dashboard.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from markupsafe import Markup, escape

from farm.manifest import changes
from farm.records import TRIAGE_STATES
from farm.analysis.regress import METHOD
from farm.analysis.results import run_rows
from farm.analysis.runs import Run
from farm.analysis.series import by_sweep, describe_change
from farm.stats import format_duration, model_label, time_unit
from farm.store import Store

SERIES_SHOWN = 12  # series of a finding drawn on its page (its largest moves first)
NIGHTS_SHOWN = 60  # nights of a series drawn
WIDTH, HEIGHT, PAD = 640, 170, 44  # an SVG chart's size and its left margin (px)


@dataclass(frozen=True)
class Point:
    """One night of a series: its accepted run's steady median and interval, and what the run names."""

    sweep_id: int
    run_id: int
    started_at: str
    value: float
    low: float
    high: float
    tvm_version: str
    context: str  # Run.series_context
    manifest: str | None

    @property
    def tip(self) -> str:
        return (f"run {self.run_id} · sweep {self.sweep_id} · {self.started_at[:16]} · {format_duration(self.value)}"
                f" · TVM {self.tvm_version}" + (f" · manifest {self.manifest[:10]}" if self.manifest else ""))


def series_points(store: Store, device: str, model: str, tuned: bool, runtime: str,
                  nights: int = NIGHTS_SHOWN, night: int | None = None) -> list[Point]:
    """The series' accepted run of each of its last ``nights`` sweeps, across context changes (an upgrade is one
    line with a mark, not two series), oldest first; ``night``'s run even when unstable (as its review judged it)."""
    rows = [r for r in run_rows(store, device=device, model=model) if r.tuned == tuned and r.runtime == runtime]
    best: dict[int, Run] = {}
    for accepted in by_sweep(rows, keep_unstable_of=night).values():
        for sweep, run in accepted.items():
            if sweep not in best or run.run_id > best[sweep].run_id:
                best[sweep] = run
    out = []
    for sweep in sorted(best)[-nights:]:
        run = best[sweep]
        if run.steady is None or not run.steady.median:
            continue
        s = run.steady
        out.append(Point(sweep, run.run_id, run.started_at, s.median, s.ci_low, s.ci_high, run.tvm_version,
                         run.series_context, run.manifest))
    return out


def context_marks(store: Store, points: list[Point]) -> list[tuple[int, str]]:
    """(sweep, words) where a night's run differs from the night before in its series context or its manifest."""
    pairs = list(zip(points, points[1:]))
    manifests = store.manifests([d for a, b in pairs for d in (a.manifest, b.manifest) if a.manifest != b.manifest])
    marks = []
    for a, b in pairs:
        words = [describe_change(a.context, b.context)] if a.context != b.context else []
        if a.manifest and b.manifest and a.manifest != b.manifest:
            words += [c.words for c in changes(manifests.get(a.manifest, {}), manifests.get(b.manifest, {}))
                      if c.field != "tvm.version" or not words]
        if words:
            marks.append((b.sweep_id, ", ".join(w for w in words if w) or "another manifest"))
    return marks


def series_svg(points: list[Point], band: tuple[float, float, float] | None = None, finding: tuple[int, ...] = (),
               alerts: tuple[int, ...] = (), marks: list[tuple[int, str]] = ()) -> Markup:  # type: ignore[assignment]
    """One series' nights as an SVG chart: ``band`` (low, centre, high) the baseline's; ``finding`` the nights of the
    finding (red), ``alerts`` the series' other alerted nights (orange ring); ``marks`` (sweep, words) vertical lines."""
    if not points:
        return Markup("<p class='meta'>no night of this series has a steady figure</p>")
    values = [v for p in points for v in (p.low, p.high)] + (list(band) if band else [])
    unit = time_unit(values)
    low, high = min(values) / unit.seconds, max(values) / unit.seconds
    span = (high - low) or abs(high) or 1.0
    low, high = low - 0.08 * span, high + 0.08 * span
    n = len(points)
    x_of = {p.sweep_id: PAD + (WIDTH - PAD - 10) * (i + 0.5) / n for i, p in enumerate(points)}

    def y(value: float) -> float:
        return round(HEIGHT - 22 - (HEIGHT - 34) * (value / unit.seconds - low) / (high - low), 1)

    parts = [f'<svg class="series" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img">']
    if band:
        parts.append(f'<rect class="band" x="{PAD}" y="{y(band[2])}" width="{WIDTH - PAD - 10}" '
                     f'height="{max(1.0, y(band[0]) - y(band[2]))}" fill="#2da44e" fill-opacity="0.15"/>'
                     f'<line x1="{PAD}" x2="{WIDTH - 10}" y1="{y(band[1])}" y2="{y(band[1])}" stroke="#2da44e"/>')
    for sweep, words in marks:
        if sweep in x_of:
            x = round(x_of[sweep] - (WIDTH - PAD - 10) / n / 2, 1)
            parts.append(f'<g class="mark" data-sweep="{sweep}"><title>{escape(f"sweep {sweep}: {words}")}</title>'
                         f'<line x1="{x}" x2="{x}" y1="8" y2="{HEIGHT - 22}" stroke="#8250df" stroke-dasharray="3,3"/>'
                         f'<text x="{x - 2 if x > WIDTH / 2 else x + 2}" y="16" font-size="9" fill="#8250df" '
                         f'text-anchor="{"end" if x > WIDTH / 2 else "start"}">{escape(words[:40])}</text></g>')
    line = " ".join(f"{round(x_of[p.sweep_id], 1)},{y(p.value)}" for p in points)
    parts.append(f'<polyline points="{line}" fill="none" stroke="#0969da" stroke-width="1"/>')
    for p in points:  # each a few hundred bytes: 12 series of 60 nights stay under 200 kB (colours: pages.html's CSS)
        x = round(x_of[p.sweep_id], 1)
        kind = "finding" if p.sweep_id in finding else "alert" if p.sweep_id in alerts else "night"
        parts.append(f'<g class="pt {kind}" data-run="{p.run_id}" data-sweep="{p.sweep_id}" data-value="{p.value:.9g}">'
                     f'<title>{escape(p.tip)}</title><path d="M{x} {y(p.low)}V{y(p.high)}"/>'
                     f'<circle cx="{x}" cy="{y(p.value)}" r="{4 if kind != "night" else 3}"/></g>')
    parts.append(f'<text x="2" y="{y(high * unit.seconds) + 10}" font-size="9">{high:.3g} {unit.name}</text>'
                 f'<text x="2" y="{HEIGHT - 24}" font-size="9">{low:.3g} {unit.name}</text>'
                 f'<text x="{PAD}" y="{HEIGHT - 6}" font-size="9">sweep {points[0].sweep_id}</text>'
                 f'<text x="{WIDTH - 70}" y="{HEIGHT - 6}" font-size="9">sweep {points[-1].sweep_id}</text></svg>')
    return Markup("".join(parts))


def findings_page(store: Store, sweep_id: int | None = None) -> dict[str, Any]:
    """The findings of a reviewed night (default: the last), as stored, in rank order, each with its age: the
    reviewed nights it was a finding of before this one."""
    sweep_id = sweep_id if sweep_id is not None else store.last_reviewed()
    if sweep_id is None:
        return {"sweep_id": None, "findings": [], "invalid_by_month": []}
    rows = store.findings(sweep_id)
    return {"sweep_id": sweep_id, "invalid_by_month": store.invalid_by_month(), "findings": [
        {"id": f["finding_id"], "sentence": f["sentence"], "state": f["state"], "kind": f["kind"],
         "first_sweep": f["first_sweep"], "age": len(store.finding_nights(f["finding_id"])) - 1,
         "kernels": f.get("kernels", ""), "direction": f["direction"]} for f in rows]}


def finding_page(store: Store, finding_id: int, sweep_id: int | None = None) -> dict[str, Any] | None:
    """A stored finding and its series (largest moves first, at most ``SERIES_SHOWN``), each with its points, its
    baseline band, the finding's and its other alerts' nights, and its context marks; None: no such finding."""
    finding = store.finding(finding_id, sweep_id)
    if finding is None:
        return None
    night = finding["sweep_id"]
    alerts = {a.id: a for a in store.alerts(night)}
    shown = sorted(finding["series"], key=lambda s: -abs(s.get("change") or 0.0))[:SERIES_SHOWN]
    nights = tuple(store.finding_nights(finding_id))
    return {"finding": finding, "events": store.finding_events([finding_id]).get(finding_id, []),
            "states": TRIAGE_STATES, "series": [series_view(store, s["device"], s["model"], bool(s["tuned"]), s["runtime"],
                                                       alerts.get(s.get("alert")), nights, night)
                                           for s in shown], "hidden": max(0, len(finding["series"]) - SERIES_SHOWN)}


def series_view(store: Store, device: str, model: str, tuned: bool, runtime: str, alert=None,
                finding_nights: tuple[int, ...] = (), night: int | None = None) -> dict[str, Any]:
    """One series drawn: its points, band (``alert``'s baseline, where it judged the steady figure drawn), the
    finding's nights (``finding_nights``) and the series' other alerts, marks; its link."""
    points = series_points(store, device, model, tuned, runtime, night=night)
    band = None
    if alert is not None and alert.baseline and alert.metric == "steady":
        z, base = METHOD.thresholds[alert.metric].z, alert.baseline
        band = (base["centre"] - z * base["spread"], base["centre"], base["centre"] + z * base["spread"])
    others = tuple(a.sweep_id for a in store.series_alerts(device, model, tuned, runtime)
                   if a.status in ("candidate", "confirmed", "unknown", "improved"))
    finding = tuple(p.sweep_id for p in points if p.sweep_id in finding_nights)
    marks = context_marks(store, points)
    return {"device": device, "model": model, "label": model_label(model, tuned, runtime), "tuned": tuned,
            "runtime": runtime, "points": points, "marks": marks, "band": band,
            "svg": series_svg(points, band, finding, tuple(s for s in others if s not in finding), marks),
            "href": "/series?" + urlencode({"device": device, "model": model, "tuned": int(tuned), "runtime": runtime})}


def new_nonce() -> str:
    return secrets.token_urlsafe(16)
