"""farm regressions: judge a sweep against the nightly baseline, confirm candidates, triage findings."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from farm.errors import FarmError
from farm.records import TRIAGE_STATES
from farm.analysis.regress import CONFIRM_ROUNDS, METHOD, METRICS
from farm.stats import MAD_TO_SD

from farm.cli.common import (add_bench_options, add_budget_option, add_progress, add_verb, bench_config, emit_json,
                             load_inventory_of, positive_int, print_error, print_table, progress_printer, require_db,
                             sweep_id, triage)

if TYPE_CHECKING:  # the store and the confirmation are imported where a verb needs them
    from farm.night.confirmation import SweepRegressions
    from farm.records import Alert


def rounds_text() -> str:
    """The interleaved reruns of --confirm in words, from ``regress.CONFIRM_ROUNDS`` ("N rounds, M in all if
    inconclusive")."""
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
                 "each finding within --confirm-budget device-minutes. Findings keep a triage state on every night\n"
                 "they return on; each change is an event (who, when, why, the bug), a fixed one that returns is\n"
                 "reopened:\n\n"
                 "  farm regressions --triage 12:invalid --by ana --note 'thermal: the phone was charging'\n"
                 "  farm regressions --triage 12:duplicate --duplicate-of 9 --by ana\n"
                 "  farm regressions --triage 12:acknowledged --by ana --bug https://bugs.example/4711\n"
                 "  farm regressions --events 12                 # a finding's triage history\n"
                 "  farm regressions --digest md                 # the night in a few lines (a CI job summary, a mail)\n"
                 "  farm regressions --fail-on new               # CI: exit 1 on a new (untriaged) confirmed finding\n\n"
                 f"States: {', '.join(TRIAGE_STATES)}.")
    p.add_argument("--sweep", type=sweep_id, help="sweep id (default: the latest)")
    p.add_argument("--confirm", action="store_true",
                   help=f"rerun findings' representatives, old and new artifacts interleaved on the device ({rounds_text()})")
    add_budget_option(p)
    p.add_argument("--triage", action="append", type=triage, default=[], metavar="ID:STATE",
                   help=f"set a finding's triage state, one of {', '.join(TRIAGE_STATES)} (repeatable); needs --by")
    p.add_argument("--by", default=os.environ.get("FARM_USER"), help="who triages (env FARM_USER): stored with the event")
    p.add_argument("--note", default="", help="why, stored with the triage event")
    p.add_argument("--bug", default="", help="the bug's URL, stored with the triage event")
    p.add_argument("--duplicate-of", type=positive_int, help="with ID:duplicate: the finding it duplicates")
    p.add_argument("--events", type=positive_int, metavar="ID", help="print a finding's triage events and exit")
    p.add_argument("--digest", choices=["md", "json"],
                   help="print the night's findings as a digest (Markdown or JSON) instead of the review; with the "
                        "dashboard's address ([dashboard] url, --dashboard-url) each links to its page")
    p.add_argument("--dashboard-url", default=os.environ.get("FARM_DASHBOARD_URL"),
                   help="the lab's farm dashboard (env FARM_DASHBOARD_URL; default: the inventory's [dashboard] url)")
    p.add_argument("--fail-on", choices=["new", "new-any"],
                   help="exit 1 when a finding in triage state new exists: confirmed (new) or any the reruns did not "
                        "reject (new-any: upgrades cannot be confirmed)")
    add_progress(p)
    add_bench_options(p)


def run(args: argparse.Namespace) -> int:
    from farm.night.confirmation import review_night
    from farm.analysis.findings import failing_findings
    from farm.lab.leases import device_holds
    from farm.store import Store

    _check_triage(args)
    require_db(args.db)
    wants_inventory = args.confirm or (args.digest and not args.dashboard_url and Path(args.devices).exists())
    inventory = load_inventory_of(args) if wants_inventory else None
    with Store(args.db) as store:
        for finding_id, state in args.triage:
            store.triage(finding_id, state, args.by, args.note, args.bug,
                         args.duplicate_of if state == "duplicate" else None)
        if args.events is not None:
            return _print_events(args, store.finding_events([args.events]).get(args.events, []))
        if args.digest:
            return _print_digest(args, store, inventory)
        reviewed = review_night(store, args.sweep, args.confirm, inventory.tracker if inventory else None,
                                inventory.devices if inventory else None, bench_config(args),
                                progress_printer(args.progress), args.confirm_budget,
                                device_holds(args.db, store, "farm regressions --confirm"),
                                judged_as_stored=True)
    if args.json:
        emit_json({"sweep_id": reviewed.sweep_id, "findings": reviewed.findings, "budget": reviewed.budget,
                   "alerts": reviewed.alerts})
    else:
        _print_review(reviewed)
    failing = failing_findings(reviewed.findings, args.fail_on)
    if failing:
        raise FarmError(f"{len(failing)} new {'confirmed ' if args.fail_on == 'new' else ''}finding(s) in sweep "
                        f"{reviewed.sweep_id}: {failing[0].sentence}",
                        "triage them: farm regressions --triage ID:acknowledged --by NAME (or invalid, expected, ...)")
    return 0


def _check_triage(args: argparse.Namespace) -> None:
    """Usage errors of the triage options (exit 2), before anything is written."""
    problem = ""
    if args.triage and not (args.by or "").strip():
        problem = "a triage needs its author: --by NAME (or set FARM_USER)"
    elif (args.note or args.bug or args.duplicate_of) and not args.triage:
        problem = "--note, --bug and --duplicate-of go with --triage ID:STATE"
    elif (args.duplicate_of is not None) != any(state == "duplicate" for _, state in args.triage):
        problem = "a duplicate names the finding it duplicates: --triage ID:duplicate --duplicate-of OTHER_ID"
    if problem:
        print_error(f"farm regressions: {problem}", "see farm regressions --help")
        raise SystemExit(2)


def _print_events(args: argparse.Namespace, events: list[dict]) -> int:
    if args.json:
        emit_json({"finding_id": args.events, "events": events})
    elif not events:
        print(f"finding {args.events}: no triage events")
    else:
        for e in events:
            what = f"{e['from_state']} → {e['to_state']}" + (f" of {e['duplicate_of']}" if e["duplicate_of"] else "")
            print(f"{e['at'][:19]}  {e['author']}: {what}" + (f"  ({e['note']})" if e["note"] else "")
                  + (f"  bug {e['bug']}" if e["bug"] else ""))
    return 0


def _print_digest(args: argparse.Namespace, store, inventory) -> int:
    from farm.views.digest import digest_markdown, night_digest

    digest = night_digest(store, args.sweep, args.dashboard_url or (inventory.dashboard_url if inventory else None))
    if args.digest == "json":
        emit_json(digest)
    else:
        print(digest_markdown(digest), end="")
    return 0


def _print_review(reviewed: SweepRegressions) -> None:
    from farm.views.review import format_metric

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
    from farm.views.review import format_metric

    change = "" if alert.change is None else f"{alert.change:+.1%}"
    if alert.z is None:
        return f"{change}, now {format_metric(alert.metric, alert.value)}".lstrip(", ")
    return f"{change}, z {alert.z:.1f}"
