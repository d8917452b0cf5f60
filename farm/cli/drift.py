"""farm drift: slow drift, where each series' nightly history changed level (change points)."""

from __future__ import annotations

import argparse

from farm.analysis.drift import MIN_CHANGE, MIN_NIGHTS, MIN_SIZE, PENALTY
from farm.manifest import changes
from farm.analysis.regress import METRICS
from farm.stats import model_label

from farm.cli.common import add_verb, emit_json, print_table, require_db


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "drift", run,
                 "slow drift: where each series' nightly history changed level (change points)",
                 "Segments every series' whole sweep history (one accepted value per sweep) with PELT's objective\n"
                 f"(L2 cost on log values, penalty {PENALTY:g}·σ²·ln n with σ the series' own night-to-night noise, "
                 f"≥ {MIN_SIZE} sweeps\nper segment, shifts under {MIN_CHANGE * 100:g} % merged). Catches a creep that "
                 f"no single night's z-score flags.\nNeeds ≥ {MIN_NIGHTS} sweeps per series. Each series lists the sweeps "
                 "where its runs' manifest changed\n(farm's commit, TVM's build, records, the device's software): "
                 "what a change point may have started with.")
    p.add_argument("--metric", choices=list(METRICS), default="steady")
    p.add_argument("--device", help="only this device")
    p.add_argument("--model", help="only this model")
    p.add_argument("--all", action="store_true", help="list series without change points too")


def run(args: argparse.Namespace) -> int:
    from farm.analysis.drift import drift_rows
    from farm.analysis.regress import series_value
    from farm.analysis.results import run_rows
    from farm.views.review import format_metric
    from farm.store import Store

    require_db(args.db)
    with Store(args.db) as store:
        series = drift_rows(run_rows(store, device=args.device, model=args.model),
                            lambda r: series_value(args.metric, r))
        shown = series if args.all else [s for s in series if s["change_points"]]
        manifests = store.manifests([d for s in shown for c in s["manifest_changes"] for d in (c["from"], c["to"])])
    for s in shown:  # each manifest change in words: what a change point may have started with; a field known one
        for change in s["manifest_changes"]:  # night and unknown the next is no change
            change["changed"] = [c.words for c in changes(manifests.get(change["from"], {}),
                                                          manifests.get(change["to"], {}))]
        s["manifest_changes"] = [c for c in s["manifest_changes"] if c["changed"]]
    if args.json:
        emit_json({"metric": args.metric, "series_checked": len(series), "series": shown})
        return 0
    changed = sum(bool(s["change_points"]) for s in series)
    print(f"{args.metric}: {len(series)} series with enough sweeps, {changed} changed level")
    print_table([{"device": s["device"], "model": model_label(s["model"], s["tuned"]), "runtime": s["runtime"],
                  "threads": "not known" if s["threads"] is None else s["threads"],
                  "change_points": ",".join(map(str, s["change_points"])) or "-",
                  "segments": "; ".join(f"{g['first_sweep']}-{g['last_sweep']}: {format_metric(args.metric, g['median'])}"
                                        for g in s["segments"]),
                  "first_to_last": f"{s['total_change']:+.1%}",
                  "manifest_changed": "; ".join(f"{c['sweep']}: {', '.join(c['changed'][:2]) or 'another manifest'}"
                                                for c in s["manifest_changes"]) or "-"} for s in shown],
                ["device", "model", "runtime", "threads", "change_points", "segments", "first_to_last",
                 "manifest_changed"])
    return 0
