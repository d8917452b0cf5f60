"""farm results: stored runs with computed summaries (a table, --json or --csv)."""

from __future__ import annotations

import argparse
import sys

from farm.stats import format_bytes

from farm.cli.common import add_verb, duration, emit_json, print_table, require_db


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "results", run, "list stored runs with computed summaries (--json, --csv)")
    p.add_argument("--device")
    p.add_argument("--model")
    p.add_argument("--latest", action="store_true", help="only the latest run per device × model")
    p.add_argument("--csv", action="store_true", help="CSV on stdout")


def run(args: argparse.Namespace) -> int:
    from farm.results import rows_frame, run_rows
    from farm.store import Store

    require_db(args.db)
    with Store(args.db) as store:
        rows = run_rows(store, device=args.device, model=args.model, latest_only=args.latest)
    if args.csv:
        rows_frame(rows).to_csv(sys.stdout, index=False)
    elif args.json:
        emit_json(rows)
    else:
        table = [{**r, "steady": duration(r.steady_median_s), "load": duration(r.load_s), "first": duration(r.first_run_s),
                  "warm": duration(r.first_run_warm_s), "clock": r.steady_clock, "wall": duration(r.steady_wall_median_s),
                  "params": format_bytes(r.params_bytes), "peak_rss": format_bytes(r.rss_peak_increase_bytes, signed=True)}
                 for r in rows]
        print_table(table, ["run_id", "started_at", "device", "model", "runtime", "threads", "status", "failed_step", "load",
                            "first", "warm", "steady", "clock", "wall", "params", "peak_rss", "check"])
    return 0
