"""farm report: a self-contained HTML report of the results."""

from __future__ import annotations

import argparse
import os

from pathlib import Path

from farm.errors import FarmError

from farm.cli.common import REPORT_DIR, add_verb, emit_json, require_db, sweep_id


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "report", run, "write a self-contained HTML report of the results")
    p.add_argument("--out", help=f"output file (default {REPORT_DIR}/report-TIMESTAMP.html)")
    p.add_argument("--title", default="farm report")
    p.add_argument("--sweep", type=sweep_id, help="that sweep's runs and its review (alerts with evidence, heatmap, data "
                   "quality, drift), as `farm sweep` writes it")
    p.add_argument("--dashboard-url", default=os.environ.get("FARM_DASHBOARD_URL"),
                   help="the lab's farm dashboard (env FARM_DASHBOARD_URL): each cell then links to its series' page "
                        "there, every night drawn")


def run(args: argparse.Namespace) -> int:
    from farm.views.report import render_report, report_file
    from farm.store import Store

    require_db(args.db)
    out = Path(args.out) if args.out else report_file(REPORT_DIR)
    with Store(args.db) as store:
        if args.sweep is not None and store.sweep(args.sweep) is None:
            raise FarmError(f"no sweep {args.sweep} in {args.db}", "see the sweep ids: farm results --json (sweep_id)")
        path = render_report(store, out, title=args.title, sweep_id=args.sweep, dashboard_url=args.dashboard_url)
    if args.json:
        emit_json({"report": str(path)})
    else:
        print(path)
    return 0
