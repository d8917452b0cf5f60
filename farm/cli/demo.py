"""farm demo: the main job on an embedded default inventory, with nothing to set up."""

from __future__ import annotations

import argparse

from pathlib import Path

from farm.stats import median

from farm.cli.common import (REPORT_DIR, add_bench_options, add_progress, add_verb, bench_config, duration, emit_json,
                             home_dir, progress_printer, reference_text)


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "demo", run,
                 "the main job on an embedded default: private tracker, 2 local devices, built-in models",
                 "Needs no inventory. Starts a tracker and two local rpc_servers on free loopback ports,\n"
                 "benchmarks the built-in models on both (untuned TVM beside onnxruntime, threads stated), tunes\n"
                 "convnet on the host device for 45 s and measures it again with the new records, writes the DB\n"
                 "and an HTML report, prints where they are, and stops everything it started.")
    p.add_argument("--no-tune", action="store_true", help="leave out the short tuning session")
    # farm.demo.DEMO_MODELS, copied: importing farm.demo (TVM, onnx, matplotlib) takes seconds, too long for --help
    p.add_argument("--models", default="mlp,convnet", help="comma-separated models (default mlp,convnet)")
    p.add_argument("--report-dir", default=REPORT_DIR, help=f"where the HTML report goes (default {REPORT_DIR}/)")
    add_progress(p)
    add_bench_options(p)


def run(args: argparse.Namespace) -> int:
    from farm.demo import DEMO_TUNING, run_demo

    models = tuple(m for m in args.models.split(",") if m)
    outcome = run_demo(args.db, Path(args.report_dir), home_dir(), home_dir() / "cache", models,
                       bench_config(args), progress=progress_printer(args.progress),
                       tuning=None if args.no_tune else DEMO_TUNING)
    failed = [c for c in outcome.cells if c.result.status != "ok"]
    if args.json:
        emit_json({"db": str(outcome.db_path), "report": str(outcome.report_path), "seconds": round(outcome.seconds, 1),
                   "stopped_pids": outcome.stopped_pids,
                   "cells": [{"run_id": c.run_id, "device": c.result.device, "model": c.result.model,
                              "status": c.result.status, "reason": c.result.reason, "threads": c.result.threads,
                              "versus_reference": _versus(c)} for c in outcome.cells],
                   "tuning": _tuning_json(outcome.tuning)})
    else:
        for c in outcome.cells:
            r = c.result
            print(f"{r.device:14s} {r.model:10s} {r.status:6s} steady {duration(median(r.steady_samples_s)):>10s}  check "
                  f"{r.check.status}" + (f"  ({r.failed_step}: {r.reason})" if r.status != "ok" else f"  · {_versus(c)}"))
        if outcome.tuning is not None:
            print(_tuning_line(outcome.tuning))
        print(f"results database: {outcome.db_path}")
        print(f"report: {outcome.report_path}")
        print(f"finished in {outcome.seconds:.0f} s; every process the demo started is stopped")
    return 1 if failed else 0


def _versus(cell) -> str:
    """TVM against the reference runtime for one cell, threads stated (``common.reference_text``)."""
    return reference_text(cell.result, cell.reference)


def _tuning_line(tuning) -> str:
    before, after = median(tuning.untuned.result.steady_samples_s), median(tuning.tuned.result.steady_samples_s)
    r = tuning.tuned.result
    if r.status != "ok" or not after or not before:
        return f"tuned {r.model} on {r.device}: {tuning.trials} trials, then {r.status} ({r.reason})"
    coverage = f"{tuning.tuned.artifact.tuned_tasks}/{tuning.tuned.artifact.total_tasks} tasks" if tuning.tuned.artifact else ""
    return (f"tuned {r.model} on {r.device} for {tuning.seconds:.0f} s ({tuning.trials} trials, {coverage} with a record): "
            f"untuned {duration(before)} → tuned {duration(after)} ({before / after:.2f}× faster) · {_versus(tuning.tuned)}")


def _tuning_json(tuning) -> dict | None:
    if tuning is None:
        return None
    return {"device": tuning.tuned.result.device, "model": tuning.tuned.result.model, "status": tuning.status,
            "trials": tuning.trials, "seconds": round(tuning.seconds, 1),
            "untuned_run": tuning.untuned.run_id, "tuned_run": tuning.tuned.run_id,
            "untuned_s": median(tuning.untuned.result.steady_samples_s),
            "tuned_s": median(tuning.tuned.result.steady_samples_s), "versus_reference": _versus(tuning.tuned)}
