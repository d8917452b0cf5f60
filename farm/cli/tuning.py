"""farm tune."""

from __future__ import annotations

import sys

from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.stats import nonempty_median

from farm.cli.common import (bench_config, duration, emit_json, graceful_interrupt, home_dir, load_inventory_of, parse_shapes,
                              print_table, progress_printer)


def cmd_tune(args) -> int:
    from farm.inventory import find_device
    from farm.models import load_model
    from farm.store import Store

    inventory = load_inventory_of(args)
    device = find_device(inventory, args.device)
    model = load_model(args.model, parse_shapes(args.shape))
    if args.list_tasks:
        from farm.tune import list_tasks

        names = list_tasks(device, model)
        emit_json(names) if args.json else print("\n".join(names))
        return 0
    if args.trials < 0 or (args.per_task is not None and args.per_task < 1):
        raise FarmError("--trials must be >= 0 and --per-task >= 1", "e.g. farm tune --trials 256 --per-task 64")
    from farm.tune import TuneConfig, export_database, import_database, tune_model

    out: dict[str, Any] = {"device": device.name, "model": model.name}
    exit_code = 0
    with Store(args.db) as store:
        if args.import_dir:
            out["imported_records"] = import_database(store, device, Path(args.import_dir))
        if args.trials:
            runner_timeout = args.runner_timeout or float(device.options.get("runner_timeout_s", 60.0))
            config = TuneConfig(trials=args.trials, per_task=args.per_task, minutes=args.minutes, tasks=args.tasks,
                                runner_timeout_s=runner_timeout, request_timeout_s=args.timeout,
                                max_runners=args.max_runners, fresh_cost_model=args.fresh_cost_model,
                                by_share=not args.no_profile, min_share=args.min_share,
                                candidate_cooldown_s=args.candidate_cooldown, builds_ahead=args.builds_ahead)
            printer = (lambda m: print(m, file=sys.stderr, flush=True)) if args.progress else None
            with graceful_interrupt("stopping after the batch in flight; Ctrl-C again to abort") as stop:
                outcome = tune_model(inventory.tracker, device, model, store, home_dir() / "tune", config, printer,
                                     should_stop=stop.is_set)
            out.update({"session_id": outcome.session_id, "status": outcome.status, "reason": outcome.reason,
                        "trials": outcome.trials_done, "new_records": outcome.new_records,
                        "total_records": outcome.total_records, "seconds": round(outcome.seconds, 1),
                        "runners": outcome.runners, "builds_ahead": outcome.builds_ahead, "seeded": outcome.seeded,
                        "search_seconds": round(outcome.search_seconds, 1),
                        "device_busy_seconds": round(outcome.device_busy_seconds, 1),
                        "candidates_measured": outcome.candidates_measured,
                        "cost_model_samples_before": outcome.cost_model_samples_before,
                        "cost_model_samples": outcome.cost_model_samples,
                        "tasks": [{"name": t.name, "trials": t.trials, "best_s": t.best_s, "untuned_s": t.untuned_s,
                                   "share": t.share, "allotted": t.allotted, "speedup": t.speedup}
                                  for t in outcome.tasks]})
            if outcome.status in ("interrupted", "device-lost"):
                exit_code = 130 if outcome.status == "interrupted" else 1
        if args.export_dir:
            out["exported_records"] = len(export_database(store, device, Path(args.export_dir)).records)
        if args.report and exit_code == 0:
            out["comparison"] = _tuned_vs_untuned(inventory, device, model, store, bench_config(args), args.progress)
    if args.json:
        emit_json(out)
    else:
        if "status" in out:
            print(f"tune session {out['session_id']}: {out['status']}" + (f" ({out['reason']})" if out["reason"] else "")
                  + f", {out['trials']} trials in {out['seconds']:.0f} s on {out['runners']} server(s),"
                  f" {out['new_records']} new records, {out['total_records']} in the store for this target;"
                  f" cost model {out['cost_model_samples_before']} -> {out['cost_model_samples']} samples (kept)")
            print_table([{**t, "best": duration(t["best_s"]), "untuned": duration(t["untuned_s"]),
                          "share": "" if t["share"] is None else f"{t['share']:.1%}",
                          "speedup": "" if t["speedup"] is None else f"{t['speedup']:.1f}x"}
                         for t in sorted(out["tasks"], key=lambda t: -(t["share"] or 0))],
                        ["name", "share", "untuned", "trials", "best", "speedup"])
        for k in ("imported_records", "exported_records"):
            if k in out:
                print(f"{k.replace('_', ' ')}: {out[k]}")
        if "comparison" in out:
            c = out["comparison"]
            print(f"untuned {duration(c['untuned_s'])}  tuned {duration(c['tuned_s'])}  speedup {c['speedup']:.2f}x"
                  f"  ({c['tuned_tasks']}/{c['total_tasks']} tasks tuned; runs {c['untuned_run']}, {c['tuned_run']})")
    if exit_code == 1:
        print(f"error: {out['reason']}; {out['new_records']} new records kept", file=sys.stderr)
        print("hint: bring the device back (farm devices) and rerun the same command to continue", file=sys.stderr)
    elif exit_code == 130:
        print(f"interrupted: every measured record is kept ({out['total_records']} for this target);"
              " rerun the same command to continue", file=sys.stderr)
    return exit_code


def _tuned_vs_untuned(inventory, device, model, store, config, progress: bool) -> dict[str, Any]:
    """Bench the model untuned and tuned on the same device, in this run."""
    from farm.sweep import bench_cell

    printer = progress_printer(progress)
    runs = {}
    for tuned in (False, True):
        cell = bench_cell(inventory.tracker, device, model, store, home_dir() / "cache", config, progress=printer, tuned=tuned)
        if cell.result.status != "ok":
            raise FarmError(f"{'tuned' if tuned else 'untuned'} bench failed at {cell.result.failed_step}: {cell.result.reason}",
                            cell.result.hint or "see farm results")
        runs[tuned] = cell
    medians = {k: nonempty_median(c.result.steady_samples_s) for k, c in runs.items()}  # ok runs have samples
    tuned_artifact = runs[True].artifact
    assert tuned_artifact is not None  # an ok run was measured from an artifact
    return {"untuned_s": medians[False], "tuned_s": medians[True], "speedup": medians[False] / medians[True],
            "untuned_run": runs[False].run_id, "tuned_run": runs[True].run_id,
            "tuned_tasks": tuned_artifact.tuned_tasks, "total_tasks": tuned_artifact.total_tasks}

