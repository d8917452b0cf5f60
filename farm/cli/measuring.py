"""Verbs that compile, measure and report: models, compile, bench, results, report, compare, demo."""

from __future__ import annotations

import sys
import time

from dataclasses import asdict
from pathlib import Path

from farm.errors import FarmError

from farm.cli.common import home_dir, emit_json, print_table, progress_printer, duration, load_with_variant, load_inventory_of, bench_config, require_db, tuning_sets


def cmd_models(args) -> int:
    from farm.models import list_models

    rows = list_models()
    if args.json:
        emit_json(rows)
    else:
        print_table(rows, ["name", "kind", "about"])
    return 0


def cmd_compile(args) -> int:
    from farm.artifacts import inspect_artifact
    from farm.compile import compile_model
    from farm.inventory import find_device

    inventory = load_inventory_of(args)
    devices = [find_device(inventory, args.device)] if args.device else list(inventory.devices.values())
    if args.export:
        import dataclasses

        devices = [dataclasses.replace(d, export=args.export) for d in devices]
    model = load_with_variant(args)
    tunings = tuning_sets(args.db, devices) if not args.untuned else {}
    out, failed = [], []
    for device in devices:
        try:
            artifact = compile_model(model, device, home_dir() / "cache", tunings.get(device.name))
        except FarmError as exc:
            if args.device:
                raise
            failed.append(exc)
            out.append({"device": device.name, "model": model.name, "status": "failed", "error": exc.message, "hint": exc.hint})
            continue
        info = inspect_artifact(artifact.path)
        out.append({"device": device.name, "model": model.name, "status": "ok", "path": artifact.path,
                    "format": artifact.export, "target": artifact.target, "toolchain": artifact.toolchain,
                    "cached": artifact.cached, "build_s": round(artifact.build_s, 3), "cache_key": artifact.cache_key,
                    "arch": ",".join(info.archs), "objects": [asdict(m) for m in info.members],
                    "tuned_tasks": artifact.tuned_tasks, "total_tasks": artifact.total_tasks,
                    "device_code": ",".join(info.device_code)})
    if args.json:
        emit_json(out)
    else:
        print_table(out, ["device", "model", "status", "format", "arch", "device_code", "cached", "path"])
    if failed:
        print(f"error: {len(failed)} of {len(devices)} device(s) failed to compile: {failed[0].message}", file=sys.stderr)
        print(f"hint: {failed[0].hint}", file=sys.stderr)
        return 1
    return 0


def cmd_bench(args) -> int:
    from farm.inventory import find_device
    from farm.store import Store
    from farm.sweep import bench_cell

    inventory = load_inventory_of(args)
    device = find_device(inventory, args.device)
    model = load_with_variant(args)
    config = bench_config(args)
    with Store(args.db) as store:
        cell = bench_cell(inventory.tracker, device, model, store, home_dir() / "cache", config,
                          reference_file=args.reference, progress=progress_printer(args.progress), tuned=not args.untuned)
    r = cell.result
    steady_median = None
    if r.steady_samples_s:
        from farm.stats import summarize

        steady_median = summarize(r.steady_samples_s).median
    data = {
        "run_id": cell.run_id, "status": r.status, "reason": r.reason, "failed_step": r.failed_step,
        "device": r.device, "key": r.key, "model": r.model, "upload_s": r.upload_s, "load_s": r.load_s,
        "first_run_s": r.first_run_s, "steady_median_s": steady_median, "steady_number": r.steady_number,
        "steady_samples_s": list(r.steady_samples_s),
        "copy_s": [{"output": c.output_index, "bytes": c.nbytes, "shape": list(c.shape), "dtype": c.dtype,
                    "number": c.number, "median_s": sorted(c.samples_s)[len(c.samples_s) // 2],
                    "samples_s": list(c.samples_s)} for c in r.copies],
        "check": asdict(r.check),
        "artifact": cell.artifact.path if cell.artifact else None, "emulated": device.emulated,
        "tuned_tasks": cell.artifact.tuned_tasks if cell.artifact else 0,
    }
    if args.json:
        emit_json(data)
    else:
        print(f"run {cell.run_id}: {r.device} · {r.model}: {r.status}" + (f" at {r.failed_step}" if r.failed_step else ""))
        print(f"  load {duration(r.load_s)}   first run {duration(r.first_run_s)}   steady median {duration(steady_median)}"
              f" ({len(r.steady_samples_s)} repeats × {r.steady_number or 0} calls)")
        for c in data["copy_s"]:
            print(f"  copy output {c['output']} ({c['bytes']} B): {duration(c['median_s'])}")
        err = r.check.max_abs_err
        print(f"  check: {r.check.status}" + (f" (max abs error {err:.3g})" if err is not None else ""))
    if r.status != "ok":
        print(f"error: {r.reason}", file=sys.stderr)
        print(f"hint: {r.hint or 'the failed run is stored; see farm results'} (stored as run {cell.run_id})", file=sys.stderr)
        return 1
    return 0


def cmd_results(args) -> int:
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
        table = [{**r, "steady": duration(r["steady_median_s"]), "load": duration(r["load_s"]), "first": duration(r["first_run_s"])}
                 for r in rows]
        print_table(table, ["run_id", "started_at", "device", "model", "status", "failed_step", "load", "first", "steady", "check"])
    return 0


def cmd_report(args) -> int:
    from farm.report import render_report
    from farm.store import Store

    require_db(args.db)
    out = Path(args.out) if args.out else Path("reports") / f"report-{time.strftime('%Y%m%d-%H%M%S')}.html"
    with Store(args.db) as store:
        path = render_report(store, out, title=args.title)
    if args.json:
        emit_json({"report": str(path)})
    else:
        print(path)
    return 0


def cmd_demo(args) -> int:
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
            med = sorted(r.steady_samples_s)[len(r.steady_samples_s) // 2] if r.steady_samples_s else None
            print(f"{r.device:14s} {r.model:10s} {r.status:6s} steady {duration(med):>12s}  check {r.check.status}"
                  + (f"  ({r.failed_step}: {r.reason})" if r.status != "ok" else ""))
        print(f"results database: {outcome.db_path}")
        print(f"report: {outcome.report_path}")
        print(f"finished in {outcome.seconds:.0f} s; every process the demo started is stopped")
    return 1 if failed else 0


def cmd_compare(args) -> int:
    from farm.regress import compare_samples
    from farm.store import Store

    require_db(args.db)
    with Store(args.db) as store:
        runs = {r["id"]: r for r in store.runs()}
        for run_id in (args.run_a, args.run_b):
            if run_id not in runs:
                raise FarmError(f"no run {run_id} in {args.db}", "see farm results")
        a, b = store.samples(args.run_a), store.samples(args.run_b)
    if len(a) < 3 or len(b) < 3:
        raise FarmError("each run needs at least 3 steady samples to compare", "bench with --repeat 20")
    result = compare_samples(a, b)
    data = {"run_a": args.run_a, "run_b": args.run_b, **asdict(result)}
    if args.json:
        emit_json(data)
    else:
        print(f"run {args.run_a}: {runs[args.run_a]['device']} · {runs[args.run_a]['model']}  median {duration(result.median_old)} ({result.n_old} samples)")
        print(f"run {args.run_b}: {runs[args.run_b]['device']} · {runs[args.run_b]['model']}  median {duration(result.median_new)} ({result.n_new} samples)")
        print(f"change {result.change:+.2%}; Mann-Whitney U p={result.mann_whitney_p:.3g}, KS p={result.ks_p:.3g}: {result.verdict}")
    return 0

