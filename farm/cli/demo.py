"""farm demo: the main job on an embedded default inventory, with nothing to set up."""

from __future__ import annotations

import argparse

from pathlib import Path

from farm.stats import median

from farm.cli.common import (REPORT_DIR, add_bench_options, add_progress, add_verb, bench_config, duration, emit_json,
                             home_dir, progress_printer)


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "demo", run,
                 "the main job on an embedded default: private tracker, 2 local devices, built-in models",
                 "Needs no inventory. Starts a tracker and two local rpc_servers on free loopback ports,\n"
                 "benchmarks the built-in models on both, writes the DB and an HTML report, prints where they\n"
                 "are, and stops everything it started.")
    # farm.demo.DEMO_MODELS, copied: importing farm.demo (TVM, onnx, matplotlib) takes seconds, too long for --help
    p.add_argument("--models", default="mlp,convnet", help="comma-separated models (default mlp,convnet)")
    p.add_argument("--report-dir", default=REPORT_DIR, help=f"where the HTML report goes (default {REPORT_DIR}/)")
    add_progress(p)
    add_bench_options(p)


def run(args: argparse.Namespace) -> int:
    from farm.demo import run_demo

    models = tuple(m for m in args.models.split(",") if m)
    outcome = run_demo(args.db, Path(args.report_dir), home_dir(), home_dir() / "cache", models,
                       bench_config(args), progress=progress_printer(args.progress))
    failed = [c for c in outcome.cells if c.result.status != "ok"]
    if args.json:
        emit_json({"db": str(outcome.db_path), "report": str(outcome.report_path), "seconds": round(outcome.seconds, 1),
                   "stopped_pids": outcome.stopped_pids,
                   "cells": [{"run_id": c.run_id, "device": c.result.device, "model": c.result.model,
                              "status": c.result.status, "reason": c.result.reason} for c in outcome.cells]})
    else:
        for c in outcome.cells:
            r = c.result
            print(f"{r.device:14s} {r.model:10s} {r.status:6s} steady {duration(median(r.steady_samples_s)):>12s}  check "
                  f"{r.check.status}" + (f"  ({r.failed_step}: {r.reason})" if r.status != "ok" else ""))
        print(f"results database: {outcome.db_path}")
        print(f"report: {outcome.report_path}")
        print(f"finished in {outcome.seconds:.0f} s; every process the demo started is stopped")
    return 1 if failed else 0
