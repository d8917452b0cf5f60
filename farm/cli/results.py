"""farm results: stored runs with computed summaries (a table, --json or --csv)."""

from __future__ import annotations

import argparse
import sys

from farm.manifest import known
from farm.stats import format_bytes

from farm.cli.common import add_verb, duration, emit_json, print_table, require_db


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "results", run, "list stored runs with computed summaries (--json, --csv)")
    p.add_argument("--device")
    p.add_argument("--model")
    p.add_argument("--latest", action="store_true", help="only the latest run per device × model")
    p.add_argument("--csv", action="store_true", help="CSV on stdout")
    p.add_argument("--kernels", action="store_true",
                   help="the profiled runs' kernels instead, a row each (run, kernel, op class, calls, time per run, "
                        "share of main, args, FLOPs, GFLOP/s, schedule): runs of `farm bench --profile` or a sweep "
                        "with profile = true")


def run(args: argparse.Namespace) -> int:
    from farm.analysis.results import rows_frame, run_rows
    from farm.store import Store

    require_db(args.db)
    selection = dict(device=args.device, model=args.model, latest_only=args.latest)
    with Store(args.db) as store:
        rows = run_rows(store, **selection)
        if args.kernels:
            return _kernels(args, rows, store.profiles([r.run_id for r in rows]))
        sums = store.profile_sums(**selection)
        manifests = store.manifests([r.manifest for r in rows]) if args.json else {}
    if args.csv:
        rows_frame(rows, sums).to_csv(sys.stdout, index=False)
    elif args.json:  # the manifest's fields, unknown ones left out (farm.manifest); its digest beside
        emit_json([{**row, "profile": sums.get(row.run_id), "manifest_digest": row.manifest,
                    "manifest": known(manifests.get(row.manifest or "", {}))} for row in rows])
    else:
        table = [{**r, "steady": duration(r.steady_median_s), "load": duration(r.load_s), "first": duration(r.first_run_s),
                  "warm": duration(r.first_run_warm_s), "clock": r.steady_clock, "wall": duration(r.steady_wall_median_s),
                  "params": format_bytes(r.params_bytes), "peak_rss": format_bytes(r.rss_peak_increase_bytes, signed=True)}
                 for r in rows]
        print_table(table, ["run_id", "started_at", "device", "model", "runtime", "threads", "status", "failed_step", "load",
                            "first", "warm", "steady", "clock", "wall", "params", "peak_rss", "check"])
    return 0


KERNEL_COLUMNS = ["run_id", "device", "model", "runtime", "threads", "kernel", "op_class", "calls", "time_s", "share",
                  "args", "flops", "gflops", "schedule"]


def _kernels(args: argparse.Namespace, rows, profiles) -> int:
    """``--kernels``: a row per kernel of each profiled run, most time first within a run."""
    table = [{"run_id": r.run_id, "device": r.device, "model": r.model, "runtime": r.runtime, "threads": r.threads,
              "kernel": k.name, "op_class": k.op_class, "calls": k.calls, "time_s": k.time_s,
              "share": k.time_s / p.main_s if p.main_s else None, "args": list(k.args), "flops": k.flops,
              "gflops": k.gflops, "schedule": k.schedule}
             for r in rows if (p := profiles.get(r.run_id)) is not None and p.status == "ok" for k in p.top()]
    if args.csv:
        import pandas as pd

        pd.DataFrame([{**row, "args": ";".join(row["args"])} for row in table],
                     columns=KERNEL_COLUMNS).to_csv(sys.stdout, index=False)
    elif args.json:
        emit_json(table)
    else:
        print_table([{**row, "time": duration(row["time_s"]), "share": f"{row['share']:.1%}" if row["share"] else "",
                      "GFLOP/s": f"{row['gflops']:.2f}" if row["gflops"] else ""} for row in table],
                    ["run_id", "device", "model", "kernel", "op_class", "calls", "time", "share", "GFLOP/s", "schedule"])
    return 0
