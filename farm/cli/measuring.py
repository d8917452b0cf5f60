"""Verbs that compile, measure and report: models, compile, bench, results, report, compare, demo."""

from __future__ import annotations

import sys
import time

from dataclasses import asdict
from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.stats import format_bytes, median, memory_text, nonempty_median, versus_text

from farm.cli.common import (home_dir, emit_json, print_table, progress_printer, duration, load_with_variant,
                              load_inventory_of, bench_config, require_db, tuning_sets)


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
                    "tuned_tasks": artifact.tuned_tasks, "anchor_tasks": artifact.anchor_tasks,
                    "total_tasks": artifact.total_tasks, "device_code": ",".join(info.device_code)})
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
                          reference_file=args.reference, progress=progress_printer(args.progress), tuned=not args.untuned,
                          reference_runtime=not args.tvm_only)
    data = bench_json(cell, device)
    if args.json:
        emit_json(data)
    else:
        print_bench(cell)
        if cell.fallback is not None:
            print_bench(cell.fallback)
        print(versus_line(cell.fallback if cell.fallback is not None and cell.result.status != "ok" else cell,
                          cell.reference, device))
    r = cell.result
    if r.status != "ok":
        print(f"error: {r.reason}", file=sys.stderr)
        fallback = "" if cell.fallback is None else \
            f"; measured on its CPU instead as run {cell.fallback.run_id} ({cell.fallback.result.status})"
        print(f"hint: {r.hint or 'the failed run is stored; see farm results'} (stored as run {cell.run_id}{fallback})",
              file=sys.stderr)
        return 1
    return 0


def versus_line(cell, reference, device) -> str:
    """'TVM 8.1 ms · onnxruntime 2.6 ms (TVM 3.1× slower)', or why there is no reference figure."""
    tvm_s = median(cell.result.steady_samples_s) if cell.result.status == "ok" else None
    tvm = f"TVM {duration(tvm_s)}" if tvm_s else f"TVM {cell.result.status}"
    if reference is None:
        return f"{tvm} · no reference runtime on this device ({device.kind} device {device.name!r})"
    r = reference.result
    if r.status != "ok":
        return f"{tvm} · {r.runtime} {r.status}" + (f" at {r.failed_step}: {r.reason}" if r.failed_step else f": {r.reason}")
    ref_s = median(r.steady_samples_s)
    versus = versus_text(tvm_s, ref_s, r.runtime)
    return (f"{tvm} · {r.runtime} {duration(ref_s)}" + (f" ({versus})" if versus else "")
            + f"   [{r.runtime} {r.runtime_version}, run {reference.run_id}]")


def reference_json(reference) -> dict | None:
    """The reference runtime's run as `farm bench --json` prints it (None where no reference runtime runs)."""
    if reference is None:
        return None
    r = reference.result
    return {"run_id": reference.run_id, "runtime": r.runtime, "runtime_version": r.runtime_version, "status": r.status,
            "reason": r.reason, "failed_step": r.failed_step, "load_s": r.load_s, "first_run_s": r.first_run_s,
            "steady_median_s": median(r.steady_samples_s), "steady_number": r.steady_number,
            "steady_samples_s": list(r.steady_samples_s), "steady_clock": r.steady_clock,
            "how_timed": r.context.get("how_timed"), "settings": r.context.get("runtime_settings"),
            "check": asdict(r.check)}


def bench_json(cell, device) -> dict:
    """One cell as `farm bench --json` prints it. The steady figure says its clock (wall, or kernel on OpenCL)."""
    r = cell.result
    data = {
        "run_id": cell.run_id, "status": r.status, "reason": r.reason, "failed_step": r.failed_step,
        "device": r.device, "key": r.key, "model": r.model, "upload_s": r.upload_s, "load_s": r.load_s,
        "first_run_s": r.first_run_s, "first_run_cold_s": r.first_run_s, "load_warm_s": r.load_warm_s,
        "first_run_warm_s": r.first_run_warm_s, "kernel_cache": r.context.get("kernel_cache"),
        "steady_median_s": median(r.steady_samples_s), "steady_number": r.steady_number,
        "steady_samples_s": list(r.steady_samples_s), "steady_clock": r.steady_clock,
        "steady_wall_median_s": median(r.steady_wall_samples_s), "steady_wall_number": r.steady_wall_number,
        "steady_wall_samples_s": list(r.steady_wall_samples_s),
        "copy_s": [{"output": c.output_index, "bytes": c.nbytes, "shape": list(c.shape), "dtype": c.dtype,
                    "number": c.number, "median_s": median(c.samples_s),
                    "samples_s": list(c.samples_s)} for c in r.copies],
        "check": asdict(r.check),
        "artifact": cell.artifact.path if cell.artifact else None, "emulated": device.emulated,
        "tuned_tasks": cell.artifact.tuned_tasks if cell.artifact else 0,
        "fallback_of": r.fallback_of,
        "memory": {"params_bytes": r.params_bytes, "planned_host_bytes": r.planned_host_bytes,
                   "planned_device_bytes": r.planned_device_bytes, "rss_before_load_bytes": r.rss_before_load_bytes,
                   "rss_after_load_bytes": r.rss_after_load_bytes, "rss_peak_bytes": r.rss_peak_bytes,
                   "total_bytes": r.context.get("memory_total_bytes"), "measured": r.context.get("memory"),
                   "text": bench_memory_text(r, device.emulated)},
    }
    if r.steady_clock == "kernel":
        data["steady_kernel_samples_s"] = data["steady_samples_s"]
        data["steady_kernel_median_s"] = data["steady_median_s"]
    if cell.fallback is not None:
        data["fallback"] = bench_json(cell.fallback, device)
    if cell.reference is not None or cell.fallback is None and r.fallback_of is None:
        data["reference"] = reference_json(cell.reference)
        ok = cell.reference is not None and cell.reference.result.status == "ok"
        data["versus_reference"] = versus_text(data["steady_median_s"], data["reference"]["steady_median_s"] if ok else None,
                                               cell.reference.result.runtime if ok else "")
    return data


def print_bench(cell) -> None:
    r = cell.result
    label = "on the CPU, fallback for run %d: " % r.fallback_of if r.fallback_of else ""
    print(f"run {cell.run_id}: {label}{r.device} · {r.model}: {r.status}" + (f" at {r.failed_step}" if r.failed_step else ""))
    print(f"  load {duration(r.load_s)}   first run cold {duration(r.first_run_s)}   "
          f"warm {duration(r.first_run_warm_s)} (load {duration(r.load_warm_s)})")
    print(f"  steady median {duration(median(r.steady_samples_s))} {r.steady_clock} time ({len(r.steady_samples_s)} repeats × "
          f"{r.steady_number or 0} calls)")
    if r.steady_wall_samples_s:
        print(f"  steady median {duration(median(r.steady_wall_samples_s))} wall time per call + sync "
              f"({len(r.steady_wall_samples_s)} repeats × {r.steady_wall_number} calls)")
    for c in r.copies:
        print(f"  copy output {c.output_index} ({c.nbytes} B): {duration(median(c.samples_s))}")
    if r.params_bytes is not None or r.rss_before_load_bytes is not None:
        print(f"  memory: {bench_memory_text(r, r.context.get('emulated', False))}")
    err = r.check.max_abs_err
    print(f"  check: {r.check.status}" + (f" (max abs error {err:.3g})" if err is not None else ""))


def bench_memory_text(r, emulated: bool) -> str:
    """'params 4.8 MB · planned activations 1.2 MB · process peak RSS +9.6 MB' (stats.memory_text) of a result."""
    peak = None if r.rss_peak_bytes is None or r.rss_before_load_bytes is None else \
        r.rss_peak_bytes - r.rss_before_load_bytes
    return memory_text(r.params_bytes, r.planned_host_bytes, r.planned_device_bytes, peak, emulated)


def cmd_copies(args) -> int:
    from farm.compile import effective_target
    from farm.inventory import find_device
    from farm.measure import COPY_CURVE_BYTES, measure_copy_curve
    from farm.records import target_kind
    from farm.store import Store

    inventory = load_inventory_of(args)
    device = find_device(inventory, args.device)
    sizes = tuple(args.size) if args.size else COPY_CURVE_BYTES
    curve = measure_copy_curve(inventory.tracker, device, target_kind(effective_target(device)), bench_config(args), sizes,
                               progress=progress_printer(args.progress))
    with Store(args.db) as store:
        curve_id = store.record_copy_curve(curve)
    points: list[dict[str, Any]] = [{"direction": p.direction, "bytes": p.nbytes, "number": p.number, "median_s": median_s,
               "gb_per_s": p.nbytes / median_s / 1e9, "samples_s": list(p.samples_s)}
              for p in curve.points for median_s in [nonempty_median(p.samples_s)]]
    if args.json:
        emit_json({"curve_id": curve_id, "device": curve.device, "device_type": curve.device_type,
                   "status": curve.status, "reason": curve.reason, "clock": curve.context.get("clock"), "points": points})
    else:
        print(f"copy curve {curve_id}: {curve.device} ({curve.device_type}), {curve.context.get('clock')}")
        print_table([{**p, "median": duration(p["median_s"]), "GB/s": f"{p['gb_per_s']:.2f}"} for p in points],
                    ["direction", "bytes", "median", "GB/s", "number"])
    if curve.status != "ok":
        print(f"error: {curve.reason}", file=sys.stderr)
        print(f"hint: what was measured before the failure is stored as copy curve {curve_id}", file=sys.stderr)
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
        table = [{**r, "steady": duration(r.steady_median_s), "load": duration(r.load_s), "first": duration(r.first_run_s),
                  "warm": duration(r.first_run_warm_s), "clock": r.steady_clock, "wall": duration(r.steady_wall_median_s),
                  "params": format_bytes(r.params_bytes), "peak_rss": format_bytes(r.rss_peak_increase_bytes, signed=True)}
                 for r in rows]
        print_table(table, ["run_id", "started_at", "device", "model", "status", "failed_step", "load", "first", "warm",
                            "steady", "clock", "wall", "params", "peak_rss", "check"])
    return 0


def cmd_report(args) -> int:
    from farm.report import render_report
    from farm.store import Store

    require_db(args.db)
    out = Path(args.out) if args.out else Path("reports") / f"report-{time.strftime('%Y%m%d-%H%M%S')}.html"
    with Store(args.db) as store:
        if args.sweep is not None and store.sweep(args.sweep) is None:
            raise FarmError(f"no sweep {args.sweep} in {args.db}", "see the sweep ids: farm results --json (sweep_id)")
        path = render_report(store, out, title=args.title, sweep_id=args.sweep)
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
            med = median(r.steady_samples_s)
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
        for run_id, median_s, n in ((args.run_a, result.median_old, result.n_old),
                                    (args.run_b, result.median_new, result.n_new)):
            print(f"run {run_id}: {runs[run_id]['device']} · {runs[run_id]['model']}  median {duration(median_s)} ({n} samples)")
        print(f"change {result.change:+.2%}; Mann-Whitney U p={result.mann_whitney_p:.3g}, KS p={result.ks_p:.3g}: "
              f"{result.verdict}")
        print("note: the p-values take each run's samples as independent; samples of one load are not, so they "
              "overstate certainty. farm regressions --confirm reruns both in rounds of fresh loads.")
    return 0

