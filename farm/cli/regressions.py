"""farm regressions: judge a sweep against the nightly baseline, confirm candidates, triage findings."""

from __future__ import annotations

import argparse

from typing import TYPE_CHECKING

from farm.errors import FarmError
from farm.regress import CONFIRM_ROUNDS, METHOD, METRICS
from farm.stats import MAD_TO_SD

from farm.cli.common import (add_bench_options, add_budget_option, add_progress, add_verb, bench_config, emit_json,
                             load_inventory_of, print_table, progress_printer, require_db, sweep_id, triage)

if TYPE_CHECKING:  # the store and the confirmation are imported where a verb needs them
    from farm.confirmation import SweepRegressions
    from farm.records import Alert


def rounds_text() -> str:
    """'5 rounds, 10 in all if inconclusive': the interleaved reruns of --confirm (regress.CONFIRM_ROUNDS)."""
    return f"{CONFIRM_ROUNDS[0]} rounds" + "".join(f", {n} in all if inconclusive" for n in CONFIRM_ROUNDS[1:])


def _thresholds_text() -> str:
    """The candidate thresholds of ``regress.METHOD``, one line per threshold, its metrics together."""
    groups: dict = {}
    for metric, limit in METHOD.thresholds.items():
        groups.setdefault(limit, []).append(metric)
    return "".join(f"  {', '.join(metrics)}: z ≥ {limit.z:g} and change ≥ +{limit.rel * 100:g} %\n"
                   for limit, metrics in groups.items())


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "regressions", run, "judge a sweep against the nightly baseline; confirm candidates",
                 f"For every series (model × device × tuned, per metric: {', '.join(METRICS)}) of the sweep\n"
                 f"(default: the latest), the baseline is the last {METHOD.baseline_n} accepted nightly medians (at least "
                 f"{METHOD.baseline_min}): centre\ntheir median, spread {MAD_TO_SD:g}·MAD (at least "
                 f"{METHOD.spread_floor * 100:g} % of the centre). Candidates pass a robust z and a\nrelative change "
                 f"(generous; improvements the same, negative):\n{_thresholds_text()}"
                 "--confirm reruns old and new artifacts on the device in rounds (a fresh load of both per round, run\n"
                 f"interleaved: {rounds_text()}) and needs Wilcoxon p < {METHOD.p_confirm:g} over the rounds\n"
                 "(strict). Alerts are stored with method, parameters, baseline and confirmation, so every verdict\n"
                 "can be reproduced.\n\n"
                 "Alerts are grouped into findings, printed first, best first: an upgrade (the runs' TVM, pipeline or\n"
                 "target changed: its new nights compared with the old context's last nights, unconfirmable by rounds,\n"
                 "the reference runtime as control), changed tuning records, several models across the sweep, a model\n"
                 "across devices, a device across models, a single series. --confirm reruns a few representatives of\n"
                 "each finding within --confirm-budget device-minutes. Findings keep a triage state across nights:\n\n"
                 "  farm regressions --triage 12:acknowledged     # or expected, fixed, new\n"
                 "  farm regressions --fail-on new               # CI: exit 1 on a new (untriaged) confirmed finding")
    p.add_argument("--sweep", type=sweep_id, help="sweep id (default: the latest)")
    p.add_argument("--confirm", action="store_true",
                   help=f"rerun findings' representatives, old and new artifacts interleaved on the device ({rounds_text()})")
    add_budget_option(p)
    p.add_argument("--triage", action="append", type=triage, default=[], metavar="ID:STATE",
                   help="set a finding's triage state: new, acknowledged, expected or fixed (repeatable)")
    p.add_argument("--fail-on", choices=["new", "new-any"],
                   help="exit 1 when a finding in triage state new exists: confirmed (new) or any the reruns did not "
                        "reject (new-any: upgrades cannot be confirmed)")
    add_progress(p)
    add_bench_options(p)


def run(args: argparse.Namespace) -> int:
    from farm.confirmation import detect_and_confirm
    from farm.findings import failing_findings
    from farm.sweep.leases import device_holds
    from farm.store import Store

    require_db(args.db)
    inventory = load_inventory_of(args) if args.confirm else None
    with Store(args.db) as store:
        for finding_id, state in args.triage:
            store.set_finding_state(finding_id, state)
        reviewed = detect_and_confirm(store, args.sweep, args.confirm, inventory.tracker if inventory else None,
                                      inventory.devices if inventory else None, bench_config(args),
                                      progress_printer(args.progress), args.confirm_budget,
                                      device_holds(args.db, store, "farm regressions --confirm"))
    if args.json:
        emit_json({"sweep_id": reviewed.sweep_id, "findings": reviewed.findings, "budget": reviewed.budget,
                   "alerts": reviewed.alerts})
    else:
        _print_review(reviewed)
    failing = failing_findings(reviewed.findings, args.fail_on)
    if failing:
        raise FarmError(f"{len(failing)} new {'confirmed ' if args.fail_on == 'new' else ''}finding(s) in sweep "
                        f"{reviewed.sweep_id}: {failing[0].sentence}",
                        "triage them: farm regressions --triage ID:acknowledged (or expected, fixed)")
    return 0


def _print_review(reviewed: SweepRegressions) -> None:
    from farm.review import format_metric

    alerts, sweep, findings = reviewed.alerts, reviewed.sweep_id, reviewed.findings
    new = [f for f in findings if f.first_sweep == sweep]
    print(f"sweep {sweep}: {len(findings)} finding(s), {len(new)} new since the last review; {len(alerts)} alert(s)")
    for title, group in (("new", new), ("ongoing", [f for f in findings if f.first_sweep != sweep])):
        for f in group:
            print(f"  [{f.finding_id}] {title}, {'untriaged' if f.state == 'new' else f.state}: {f.sentence}")
    budget = reviewed.budget
    print(f"confirmation: {budget['rerun']} series rerun, {budget['spent_s'] / 60:.1f} of {budget['budget_s'] / 60:g} "
          f"device-minutes; {budget['left_unconfirmed']} finding(s) left unconfirmed")
    print_table([{**a, "change": "" if a.change is None else f"{a.change:+.1%}",
                  "z": "-" if a.z is None else f"{a.z:.1f}", "value": format_metric(a.metric, a.value),
                  "centre": format_metric(a.metric, a.baseline["centre"] if a.baseline else None)} for a in alerts],
                ["device", "model", "runtime", "metric", "status", "value", "centre", "change", "z"])


def alert_change(alert: Alert) -> str:
    """'+12.0%, z 3.1', or for planned memory (deterministic, no z) the change and its value."""
    from farm.review import format_metric

    change = "" if alert.change is None else f"{alert.change:+.1%}"
    if alert.z is None:
        return f"{change}, now {format_metric(alert.metric, alert.value)}".lstrip(", ")
    return f"{change}, z {alert.z:.1f}"
