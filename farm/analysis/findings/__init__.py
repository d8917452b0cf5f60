"""Findings: one sweep's alerts explained by the fewest causes, ranked by evidence and cost (#22, #32). No TVM.

A reviewer asks what got slower, where, by how much and how sure we are; a farm's sweep answers per series, and a
night has many shapes: whole models, whole devices, a SoC family × the models with one op, a lab-wide change that
touches a random share of runs. A *finding* is a group of one sweep's alerts of one metric and direction with one
cause, named by what farm knows of its devices and models (``traits``: kind, target kind, tags; ops, variant,
tuning) rather than by a list:

  upgrade   a context change (``series.context_changes``): "TVM 0.27.0 → 0.28.0"; split by tuning coverage (an
            upgrade that dropped the tuning records is another cause than one that slowed equally tuned code);
            unconfirmable by rounds (a device's server runs one TVM); its control is the reference runtime's series
            on the same devices; its subject is the block that explains it ("models with DepthwiseConv (6/25)")
  tuning    the model's own applied tuning changed since its baseline's run (a nightly tuning budget): tasks with a
            record, of its tasks (``group._tuning_changed``)
  model     one model on every device;  sweep: several models on every device
  device    every model on some devices (one, a listed few, or the devices sharing a trait)
  block     a side of devices × a side of models ("models with DepthwiseConv (6/25) on devices tagged soc:sd888")
  scatter   what no block explains, more than the screen flags on a quiet night: "52 % of all series (520/1,000),
            across 40/40 devices and 25/25 models, are 10.0 % slower; no device or model explains it (p = 0.41)"
  series    one series whose night lies outside its own nights' prediction bound at Bonferroni's level

How one explanation is preferred over another (``explain``): the night is a 0/1 matrix of judged series (alerted or
not). Blocks are taken greedily, each the one whose G statistic (the likelihood-ratio test of independence between
inside/outside the block and alerted/not; Wilks, Ann. Math. Statist. 9, 1938; Sokal & Rohlf, *Biometry*, "G-test")
buys the most log-likelihood over its description length: a two-part code (Rissanen, Automatica 14, 1978;
Grünwald, *The Minimum Description Length Principle*, MIT Press 2007): ln(named sides) for a trait, a member or all,
ln n + ln C(n, s) for a listed set of s of n, and ½ ln N for the block's own rate (Schwarz's BIC term). A block is
kept while gain > cost, so a trait that fits as well as a list wins by being shorter, and a random scatter, which no
block fits better than chance, gets none. What is left is a scatter when the one-sided binomial test against the
screen's quiet-night rate (5 %: ``regress.Method``'s steady screen, tools/bench_detect.py --costs) gives p < 0.001;
its independence of device and model is Pearson's chi-square test of homogeneity of the alert rate across devices
and across models (the smaller p, Bonferroni × 2).

Else a single series is a finding when it moved beyond its noise floor (below) and its night lies outside the
one-sided prediction bound of its own baseline nights at the family-wise level 0.01 over the night's N judged series
(Bonferroni; ``finding.SINGLE_ALPHA``): t = (x − mean) / (s·√(1 + 1/n)) ≥ t⁻¹ₙ₋₁(1 − 0.01/N), mean and s the
mean and SD of its n baseline nights (s floored at ``regress.Method.spread_floor`` of their median; a night more
than 5 baseline spreads from the median, another level such as the regression's own first night, left out:
``group.CLIP_SPREADS``). For normal
night-to-night noise t is Student's t with n − 1 degrees of freedom exactly: the prediction interval of one new
observation (Student, Biometrika 6, 1908; Hahn & Meeker, *Statistical Intervals*, Wiley 1991, §4.7). Not the
alert's robust z against t, as before: the MAD of 20 nights is ~2.7× as variable as their SD (its efficiency at the
normal is 37 %, Rousseeuw & Croux, JASA 88, 1993), so a quiet 50-night × 40 × 25 night put three series at 3–4 %
past that bound (tools/bench_findings.py, aa). With the SD, a series whose history has wild nights needs a larger
move to stand alone, which is the point; and 0.01 keeps a lone unconfirmed series off the report's first screen on
all but one quiet night in 100 (per metric), where the planted single series of 10 % (t ≈ 7–8 at 1 % noise) still pass the
bound (≈ 5.6 for 1,000 series of 20 nights).

A finding's *magnitude* is the geometric mean of value / baseline centre over the alerts only it explains (a driver
regression on a device half of whose models a mass regression also slowed is measured on the other half), with a
bootstrap 95 % interval; *breadth* k of n judged series in its block; *confidence* what the reruns said. Findings are
ranked by evidence (Stouffer's z over the alerts: breadth and z; confirmation doubles it, reruns that rejected it
quarter it) times cost (absolute time moved × breadth), never by raw percent. A metric moved by less than the larger
of the timer's resolution and three times its run's own MAD is never a finding by itself (``noise_floor``).

``find_findings`` is the rule on records; ``sweep_findings`` reads what it needs of a sweep from the store (alerts,
runs, devices and models' traits, stored triage states) and ``record`` stores them (``Store.record_findings``), so
the CLI, the sweep and the report name the same findings. ``tools/bench_findings.py`` measures the rule on planted
nights of every shape above.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any, Mapping

from farm.analysis.findings.finding import (KINDS, SLOWER_STATUSES, UNCONFIRMABLE, Finding, noise_floor, percent, resolution,
                                   sentence)
from farm.analysis.findings.group import find_findings, representatives
from farm.analysis.findings.traits import SeriesTraits, series_traits
from farm.records import DEFAULT_BUDGET_MIN, Alert
from farm.analysis.regress import SeriesVerdict, detect, detect_upgrades
from farm.analysis.series import by_sweep

if TYPE_CHECKING:
    from farm.analysis.runs import Run
    from farm.store import Store

KERNEL_SERIES = 2  # series of a finding whose kernels its sentence names (largest z first)

__all__ = ["DEFAULT_BUDGET_MIN", "KINDS", "SLOWER_STATUSES", "UNCONFIRMABLE", "Finding", "SeriesTraits",
           "failing_findings", "find_findings", "noise_floor", "percent", "record", "representatives", "resolution", "sentence",
           "stored_findings", "sweep_findings", "sweep_verdicts", "with_state"]


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
    wanted = {i for a in alerts for i in (a.run_id, a.baseline_run_id) if i is not None} | {
        i for v in verdicts for i in (v.run_id, v.baseline_run_id) if i is not None}
    runs = {r.run_id: r for r in rows if r.run_id in wanted}
    tonight = [r for r in rows if r.sweep_id == sweep_id]
    traits = series_traits(tonight, store.devices(), store.model_ops())
    manifests = store.manifests([r.manifest for r in runs.values()])
    findings = name_kernels(store, find_findings(alerts, verdicts, runs, traits, manifests), alerts)
    states = store.finding_states([f.key for f in findings], sweep_id)
    return [with_state(f, states.get(f.key)) for f in findings]


def stored_findings(store: "Store", sweep_id: int) -> list[Finding] | None:
    """A reviewed night's findings as its review stored them (``record``), in its rank order, with their current
    triage state: what the report and the dashboard read (#66: computed once a night, passed forward); None when the
    night was not reviewed."""
    if not store.reviewed(sweep_id):
        return None
    names = {f.name for f in fields(Finding)}
    out = []
    for body in store.findings(sweep_id):
        values = {k: v for k, v in body.items() if k in names}
        for key in ("devices", "models", "alerts", "representatives", "series"):
            values[key] = tuple(values.get(key) or ())
        values["ci"] = tuple(values["ci"]) if values.get("ci") is not None else None
        out.append(Finding(**values))
    return out


def name_kernels(store: "Store", findings: list[Finding], alerts: list[Alert], most: int = KERNEL_SERIES) -> list[Finding]:
    """Each time finding whose runs have profiles (tonight's and its baseline's: `farm bench --profile`, a sweep with
    profile = true) with the kernels that moved (``kernel_diff``), for its ``most`` largest-z series that have both:
    "mlp on cpu: 92 % of the +1.3 ms is fused_conv2d16 (1.06 ms → 1.31 ms)". Reads the profiles of its alerts' runs
    only."""
    from farm.analysis.kernel_diff import alert_headlines

    by_id = {a.id: a for a in alerts}
    held = [by_id[i] for f in findings for i in f.alerts if i in by_id]
    stored = alert_headlines(held, store.profiles)
    named = []
    for finding in findings:
        # a confirmation's rerun profiled both artifacts back to back: its word first, else the stored runs'
        said = [(a, _rerun_headline(a) or stored.get(a.id, "")) for a in sorted(
            (by_id[i] for i in finding.alerts if i in by_id and by_id[i].metric == "steady"), key=lambda a: -(a.z or 0.0))]
        parts = [f"{a.model} on {a.device}: {headline}" for a, headline in said if headline][:most]
        named.append(replace(finding, kernels="; ".join(parts)) if parts else finding)
    return named


def record(store: "Store", sweep_id: int, findings: list[Finding]) -> list[Finding]:
    """Store a sweep's findings; each comes back with its id, triage state and first sweep (a finding that persists
    from the last reviewed sweep keeps them)."""
    states = store.record_findings(sweep_id, [dict(f) for f in findings])
    return [with_state(f, states.get(f.key)) for f in findings]


def failing_findings(findings: list[Finding], fail_on: str | None) -> list[Finding]:
    """The findings that fail ``farm regressions --fail-on``: new (untriaged) and slower, and confirmed (``new``) or
    not rejected by the reruns (``new-any``)."""
    return [f for f in findings if f.state == "new" and f.direction == "slower"
            and ((fail_on == "new-any" and (f.confirmed or not f.rejected)) or (fail_on == "new" and f.confirmed))]


def with_state(finding: Finding, state: Mapping[str, Any] | None) -> Finding:
    if state is None:
        return finding
    return replace(finding, state=state["state"], finding_id=state["id"], first_sweep=state["first_sweep"])


def _rerun_headline(alert: Alert) -> str:
    kernels = alert.confirmation.get("kernels") or {}
    return f"{kernels['headline']} (rerun)" if kernels.get("status") == "ok" else ""
