"""farm tune: search faster schedules on a device with MetaSchedule."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.stats import nonempty_median
from farm.tune.task_profile import DEFAULT_MIN_SHARE
from farm.tune.config import DEFAULT_TRIALS, RUNNER_TIMEOUT_S, SEARCH_POPULATION, TuneConfig, session_trials

from farm.cli.common import (add_bench_options, add_progress, add_shape_option, add_verb, bench_config, count,
                             duration, emit_json, graceful_interrupt, home_dir, inventory_and_device,
                             non_negative_float, parse_shapes, positive_float, positive_int, print_table,
                             progress_printer, record_default)

DESCRIPTION = (
    "Extracts the model's tasks, tunes them on the device through the tracker (candidates built\n"
    "for its target, measured on it), and keeps every record in the results database: bench,\n"
    "compile and sweep then use the best records for that device's target automatically.\n"
    "Ctrl-C or a lost device keeps what was measured; the same command again continues.\n"
    "Sessions build on each other: the XGBoost cost model is saved with the records of the\n"
    "device's target and the next session starts from it (--fresh-cost-model to start blank).\n"
    "Several servers under the device's key measure candidates at once (--max-runners K).\n"
    "On a device that is not this host's CPU, candidates are built while the device measures\n"
    "(--builds-ahead; on this host's CPU a batch is built first, so compiles do not slow its runs).\n"
    "Trials go where the time is: each task is first timed untuned on the device, and the budget\n"
    "is shared by its share of the model's time (the smallest tasks, together under --min-share of\n"
    "it, get none); tasks never searched get their first batch before the others get more.\n"
    "--export writes a pack (MetaSchedule's JSON database, the cost model as plain arrays, a\n"
    "manifest with target and TVM version); --import refuses a pack for another target or TVM.\n\n"
    "  farm tune --device x86-local --model convnet --trials 256 --report\n"
    "  farm tune --device x86-local --model convnet --trials 256 --max-runners 4\n"
    "  farm tune --device x86-local --model convnet --trials 0 --export shared-records/")


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "tune", run,
                 "search faster schedules on a device with MetaSchedule (XGBoost cost model)", DESCRIPTION)
    p.add_argument("--device", required=True)
    p.add_argument("--model", required=True)
    add_shape_option(p)
    p.add_argument("--trials", type=count, default=None,
                   help=f"trials this session (default {DEFAULT_TRIALS}, or as many as --minutes allow; 0 = no tuning)")
    p.add_argument("--per-task", type=positive_int, default=None, help="at most this many trials per task")
    p.add_argument("--minutes", type=positive_float, default=None,
                   help="tune for this many minutes (alone: the session runs for them; with --trials: whichever ends "
                        "first, and the output says which)")
    p.add_argument("--tasks", help="only tasks whose name contains this (see --list-tasks)")
    p.add_argument("--list-tasks", action="store_true", help="print the model's tuning tasks and exit")
    p.add_argument("--runner-timeout", type=positive_float, default=None,
                   help=f"seconds per candidate on the device (default: the device's runner_timeout_s, else "
                        f"{RUNNER_TIMEOUT_S:g})")
    p.add_argument("--report", action="store_true", help="then bench untuned vs tuned on the device and print both")
    p.add_argument("--export", dest="export_dir", help="write the records as MetaSchedule JSON database files to DIR")
    p.add_argument("--import", dest="import_dir", help="merge MetaSchedule JSON database files from DIR first")
    runners, cooldown = record_default(TuneConfig, "max_runners"), record_default(TuneConfig, "candidate_cooldown_s")
    p.add_argument("--max-runners", type=positive_int, default=runners,
                   help=f"measure up to K candidates at once, each on its own server of the key (default {runners}; "
                        "each runner is a process of ~300 MB)")
    p.add_argument("--fresh-cost-model", action="store_true",
                   help="do not start from the cost model earlier sessions saved for this target")
    p.add_argument("--min-share", type=non_negative_float, default=DEFAULT_MIN_SHARE,
                   help="the smallest tasks, together under this share of the model's time, get no search (default "
                        f"{DEFAULT_MIN_SHARE:g}, i.e. {DEFAULT_MIN_SHARE * 100:g}%%); the share is measured on the device first")
    p.add_argument("--candidate-cooldown", type=non_negative_float, default=cooldown, metavar="S",
                   help="the device rests S seconds after each candidate, its session held (phones that must cool "
                        f"between measurements; default {cooldown:g})")
    p.add_argument("--no-profile", action="store_true",
                   help="do not time the tasks first: MetaSchedule's own scheduler shares the trials over every task")
    p.add_argument("--population", type=positive_int, default=None, metavar="N",
                   help="schedules MetaSchedule's evolutionary search keeps a batch (default: the device's "
                        f"search_population, else {SEARCH_POPULATION}); a batch's generation costs CPU in proportion, "
                        "a smaller population explores less")
    p.add_argument("--builds-ahead", action=argparse.BooleanOptionalAction, default=None,
                   help="build candidates while the device measures earlier ones (default: yes, unless the device "
                        "measures on this host's CPU: local, opencl, qemu)")
    add_progress(p)
    add_bench_options(p)


def run(args: argparse.Namespace) -> int:
    from farm.models import load_model
    from farm.store import Store

    inventory, device = inventory_and_device(args)
    model = load_model(args.model, parse_shapes(args.shape))
    if args.list_tasks:
        from farm.tune import list_tasks

        names = list_tasks(device, model)
        emit_json(names) if args.json else print("\n".join(names))
        return 0
    from farm.tune import TuneStatus, export_database, import_database

    out: dict[str, Any] = {"device": device.name, "model": model.name}
    with Store(args.db) as store:
        if args.import_dir:
            out["imported_records"] = import_database(store, device, Path(args.import_dir))
        if session_trials(args.trials, args.minutes):
            out.update(_session(args, inventory, device, model, store))
        if args.export_dir:
            out["exported_records"] = len(export_database(store, device, Path(args.export_dir)).records)
        if args.report and out.get("status") not in (TuneStatus.INTERRUPTED, TuneStatus.DEVICE_LOST):
            out["comparison"] = _tuned_vs_untuned(inventory, device, model, store, bench_config(args), args.progress)
    emit_json(out) if args.json else _print_outcome(out)
    if out.get("status") == TuneStatus.DEVICE_LOST:
        raise FarmError(f"{out['reason']}; {out['new_records']} new records kept",
                        "bring the device back (farm devices) and rerun the same command to continue")
    if out.get("status") == TuneStatus.INTERRUPTED:
        print(f"interrupted: every measured record is kept ({out['total_records']} for this target);"
              " rerun the same command to continue", file=sys.stderr)
        return 130
    return 0


def _session(args: argparse.Namespace, inventory, device, model, store) -> dict[str, Any]:
    """One tuning session as the command's output: what it did, and which budget ended it."""
    from farm.tune import TuneConfig, runner_timeout_for, tune_model

    trials = session_trials(args.trials, args.minutes)
    config = TuneConfig(trials=trials, per_task=args.per_task, minutes=args.minutes, tasks=args.tasks,
                        runner_timeout_s=args.runner_timeout or runner_timeout_for(device), request_timeout_s=args.timeout,
                        max_runners=args.max_runners, fresh_cost_model=args.fresh_cost_model,
                        by_share=not args.no_profile, min_share=args.min_share,
                        candidate_cooldown_s=args.candidate_cooldown, builds_ahead=args.builds_ahead,
                        population=args.population)
    printer = (lambda m: print(m, file=sys.stderr, flush=True)) if args.progress else None
    with graceful_interrupt("stopping after the batch in flight; Ctrl-C again to abort") as stop:
        outcome = tune_model(inventory.tracker, device, model, store, home_dir() / "tune", config, printer,
                             should_stop=stop.is_set)
    return {"session_id": outcome.session_id, "status": outcome.status, "reason": outcome.reason,
            "ended_by": outcome.ended_by, "trials": outcome.trials_done, "trials_budget": args.trials,
            "minutes_budget": args.minutes, "new_records": outcome.new_records,
            "total_records": outcome.total_records, "seconds": round(outcome.seconds, 1),
            "runners": outcome.runners, "builds_ahead": outcome.builds_ahead,
            "population": outcome.population, "seeded": outcome.seeded,
            "search_seconds": round(outcome.search_seconds, 1),
            "device_busy_seconds": round(outcome.device_busy_seconds, 1),
            "candidates_measured": outcome.candidates_measured,
            "cost_model_samples_before": outcome.cost_model_samples_before,
            "cost_model_samples": outcome.cost_model_samples,
            "tasks": [{"name": t.name, "trials": t.trials, "best_s": t.best_s, "untuned_s": t.untuned_s,
                       "share": t.share, "allotted": t.allotted, "speedup": t.speedup} for t in outcome.tasks]}


def _print_outcome(out: dict[str, Any]) -> None:
    if "status" in out:
        print(f"tune session {out['session_id']}: {out['status']}" + (f" ({out['reason']})" if out["reason"] else "")
              + f", ended by {out['ended_by']}"
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

