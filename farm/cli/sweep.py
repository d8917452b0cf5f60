"""farm sweep: measure every device × model in parallel, resumable; then review, tune and report."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.errors import FarmError
from farm.lab.jobs import HOST_WAIT_S
from farm.records import CellStanding, Inventory, SweepSpec
from farm.stats import is_unstable, median

from farm.cli.common import (REPORT_DIR, VARIANTS, add_bench_options, add_budget_option, add_progress, add_verb,
                             bench_config, count, duration, emit_json, home_dir, load_inventory_of, positive_float,
                             progress_printer, record_default, reference_text, require_db, sweep_or_latest)
from farm.cli.regressions import alert_change, rounds_text
from farm.night.sweep_file import SweepFile, load_sweep_file

if TYPE_CHECKING:  # the sweep's and the nightly's modules are imported where the verb runs
    from farm.night.confirmation import SweepRegressions
    from farm.tune.config import TuneBudget
    from farm.sweep import SweepOutcome

# a sweep's status when it was killed, or a worker ended early, or a cell is left that a resume measures; a sweep
# "finished with failures" (each failure for good) has nothing to resume (farm.sweep.run.sweep_status)
UNFINISHED = ("running", "incomplete")

DESCRIPTION = (
    "Compiles each artifact once (cached, with tuning records) while the devices measure, one\n"
    "worker per device; a dropped session is retried; a failed cell is stored with its reason.\n"
    "A reference model runs first on every device in every sweep, so device drift can be told\n"
    "from model regressions. After a crash: farm sweep --resume finishes only the missing cells.\n\n"
    "  farm sweep                                   # every device × the built-in models\n"
    "  farm sweep --device x86-local --model convnet --model my.onnx\n"
    "  farm sweep --file nightly.toml               # devices = [...], models = [...], [bench] repeat = 30\n"
    "  farm sweep --no-profile                      # without where each cell's time goes (on by default)\n"
    "  farm sweep --resume                          # the latest sweep (or --resume ID)\n"
    "  farm sweep --resume --if-incomplete          # only if it never finished (cron: after a reboot)\n\n"
    "A device with no server on the tracker when the sweep starts has its cells stored 'offline' at\n"
    "once (no wait, no retry spent); farm sweep --resume ID measures them once it is up.\n\n"
    "Every cell is profiled by default (each kernel timed on the device, in a share of the cell's time:\n"
    "farm results --kernels, the report, a finding's kernels); a sweep file's profile = false turns it off,\n"
    "profile = [\"mate10\", \"resnet50\"] keeps the cells of those devices and models.\n\n"
    "Over lab hosts (devices with lab_host, a postgresql:// --db): the cells are queued for each host's\n"
    "farm worker, and the sweep follows them; --detach leaves them to run, --status ID shows where they are.")


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    reference, retries = record_default(SweepSpec, "reference"), record_default(SweepSpec, "retries")
    variants = ", ".join(record_default(SweepSpec, "variants"))
    p = add_verb(subparsers, common, "sweep", run,
                 "measure every device × model in parallel (one worker per device), resumable", DESCRIPTION)
    p.add_argument("--device", action="append", help="a device (repeatable; default: every inventory device)")
    p.add_argument("--model", action="append", help="a model (repeatable; default: the built-in zoo)")
    p.add_argument("--file", help="sweep file (TOML: devices, models, variants, reference, profile, [bench], "
                                  "[shapes.MODEL], [tune])")
    p.add_argument("--reference", default=None,
                   help=f"reference model run on every device first (default {reference}; none to skip)")
    p.add_argument("--retries", type=count, default=retries,
                   help=f"retries of a cell whose session dropped (default {retries})")
    p.add_argument("--variant", action="append", choices=VARIANTS,
                   help=f"a variant axis (repeatable; default {variants}); int8 is calibrated with min-max")
    p.add_argument("--untuned", action="store_true", help="ignore the store's tuning records")
    p.add_argument("--tvm-only", action="store_true",
                   help="do not time each cell's model in its reference runtime (onnxruntime …) beside TVM")
    p.add_argument("--resume", nargs="?", const="latest", type=sweep_or_latest,
                   help="finish a crashed sweep (default: the latest)")
    p.add_argument("--if-incomplete", action="store_true",
                   help="with --resume: do nothing (exit 0) unless that sweep never finished or is incomplete")
    p.add_argument("--report-dir", default=REPORT_DIR, help=f"where the HTML report goes (default {REPORT_DIR}/)")
    p.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    p.add_argument("--confirm", action="store_true",
                   help=f"confirm regression candidates by interleaved reruns ({rounds_text()})")
    p.add_argument("--detach", action="store_true",
                   help="over lab hosts: queue the cells and return (farm sweep --status ID follows them)")
    p.add_argument("--status", type=int, metavar="ID", help="over lab hosts: the queued sweep's progress, by host")
    p.add_argument("--host-wait", type=positive_float, default=HOST_WAIT_S / 60, metavar="MINUTES",
                   help="over lab hosts: a host whose farm worker took none of the sweep's waiting cells for MINUTES has "
                        f"them stored offline, with the reason (default {HOST_WAIT_S / 60:g}; --resume measures them later)")
    add_budget_option(p)
    add_progress(p)
    add_bench_options(p, profile=True, profile_default=True)


def run(args: argparse.Namespace) -> int:
    from farm.night import NightPlan, run_night
    from farm.sweep.run import standing_text

    if args.status is not None:
        return _status(args)
    inventory = load_inventory_of(args)
    if args.if_incomplete and args.resume is None:
        raise FarmError("--if-incomplete goes with --resume", "farm sweep --resume --if-incomplete")
    budget = None  # the sweep file's [tune]: a fresh sweep's, never a resumed one's
    if args.resume is not None:
        resumed = _resumed_spec(args)
        if resumed is None:
            return 0
        spec, sweep_id = resumed
        _say_resumed(args.db, spec, sweep_id)
    else:
        (spec, budget), sweep_id = _fresh_spec(args, inventory), None
    night = run_night(NightPlan(
        inventory, spec, args.db, home_dir() / "cache", home_dir() / "tune", sweep_id=sweep_id, budget=budget,
        confirm=args.confirm, confirm_budget_min=args.confirm_budget,
        report_dir=None if args.no_report else Path(args.report_dir), detach=args.detach, host_wait_s=args.host_wait * 60,
        progress=progress_printer(args.progress), say=lambda line: print(line, file=sys.stderr, flush=True)))
    if night.outcome is None or night.reviewed is None:  # queued for the lab's workers, not followed (--detach)
        if args.json:
            emit_json({"sweep_id": night.sweep_id, "status": "queued"})
        else:
            print(f"sweep {night.sweep_id} queued; farm sweep --status {night.sweep_id} shows its progress")
        return 0
    outcome = night.outcome
    final = {(c.result.device, c.result.model): c for c in outcome.cells}  # the last attempt of each cell
    stored = _stored_cells(args.db, outcome) if night.queued else {}  # a queued sweep's cells: its workers measured them
    if args.json:
        emit_json(_sweep_json(outcome, final, night.reviewed, list(night.tuning), night.report) | stored)
    else:
        _print_sweep(outcome, final, night.reviewed, list(night.tuning), night.report, stored.get("cells", []))
    if outcome.not_ok:
        count = sum(len(cells) for cells in outcome.not_ok.values())
        redo = len(outcome.missing)
        raise FarmError(f"sweep {outcome.sweep_id} is {outcome.status}: {count} cell(s) not ok "
                        f"({standing_text(outcome.not_ok)})",
                        (f"farm sweep --resume {outcome.sweep_id} measures the {redo} never measured, offline or with "
                         "retries left again" if redo else "no cell is left to measure again")
                        + ("; the failed ones stay as stored (farm results --json says why each failed)"
                           if CellStanding.FAILED in outcome.not_ok else ""))
    return 0


def _say_resumed(db: str, spec: SweepSpec, sweep_id: int) -> None:
    """What a resume measures again and what it leaves, on stderr (#50: it named 2 cells and measured 4)."""
    from farm.store import Store
    from farm.sweep.run import cells_not_ok, standing_text

    with Store(db) as store:
        not_ok = cells_not_ok(store, spec, sweep_id)
    redo = {s: cells for s, cells in not_ok.items() if s.redone}
    kept = {s: cells for s, cells in not_ok.items() if not s.redone}
    print(f"sweep {sweep_id}: resuming: " + (f"to measure: {standing_text(redo)}" if redo else "nothing to measure")
          + (f"; leaving {standing_text(kept)}" if kept else ""), file=sys.stderr, flush=True)


def _status(args: argparse.Namespace) -> int:
    """--status ID: a queued sweep's jobs by lab host, and its stored cells."""
    from farm.lab.queue import LabQueue
    from farm.store import Store
    from farm.store.locations import require_server
    from farm.lab.follow import progress_text

    require_server(args.db, "farm sweep --status (a sweep over lab hosts)")
    with Store(args.db) as store:
        sweep = store.sweep(args.status)
    if sweep is None:
        raise FarmError(f"there is no sweep {args.status} in the database", "farm results --json shows the sweeps' ids")
    jobs = LabQueue(args.db).sweep_jobs(args.status)
    if args.json:
        emit_json({"sweep_id": args.status, "status": sweep["status"], "jobs": jobs.by_host, "builds": jobs.builds})
    else:
        print(f"{progress_text(args.status, jobs)} · {sweep['status']}")
    return 0


def _stored_cells(db: str, outcome: SweepOutcome) -> dict[str, Any]:
    """A queued sweep's cells as its workers stored them: the last attempt's status and the attempts made."""
    from farm.store import Store

    with Store(db) as store:
        attempts = store.sweep_attempts(outcome.sweep_id)
    return {"cells": [{"device": d, "model": m, "status": tried[-1].status, "attempts": len(tried)}
                      for (d, m), tried in sorted(attempts.items())]}


def _resumed_spec(args: argparse.Namespace) -> tuple[SweepSpec, int] | None:
    """The spec and id of the sweep --resume names; None when --if-incomplete finds nothing to do (said on stderr)."""
    from farm.store import Store, exists

    if args.if_incomplete and not exists(args.db):
        print(f"no sweep to resume: {args.db} does not exist yet", file=sys.stderr)
        return None
    require_db(args.db)
    with Store(args.db) as store:
        sweep = store.sweep(None if args.resume == "latest" else args.resume)
    if sweep is None and args.if_incomplete:
        print(f"no sweep to resume in {args.db}", file=sys.stderr)
        return None
    if sweep is None and args.resume == "latest":
        raise FarmError(f"there is no sweep to resume in {args.db}: no farm sweep has run with this database",
                        "start one with farm sweep (runs of farm bench and farm demo are not sweeps)")
    if sweep is None:
        raise FarmError(f"there is no sweep {args.resume} in {args.db}",
                        "farm results --json shows the sweep_id of each stored run; farm sweep --resume takes the latest")
    if args.if_incomplete and sweep["status"] not in UNFINISHED:
        print(f"sweep {sweep['id']} is {sweep['status']}: nothing to resume", file=sys.stderr)
        return None
    return SweepSpec.from_json(sweep["spec"]), sweep["id"]


def _fresh_spec(args: argparse.Namespace, inventory: Inventory) -> tuple[SweepSpec, TuneBudget | None]:
    """A new sweep's spec: the command line first, then the sweep file, then SweepSpec's defaults; and its [tune]."""
    from farm.models import BUILTINS

    sweep_file = load_sweep_file(args.file) if args.file else SweepFile()
    budget = _tune_budget(sweep_file.tune, args.file, inventory) if sweep_file.tune is not None else None
    reference = next((r for r in (args.reference, sweep_file.reference) if r is not None),
                     record_default(SweepSpec, "reference"))
    # profiles by default (#63), within a share of each cell; --profile or a sweep file that asks: as asked;
    # --no-profile, profile = false or [bench] profile = false: none; a sweep file's list: those cells only
    said = next((p for p in (args.profile, sweep_file.profile, sweep_file.bench.get("profile")) if p is not None), None)
    profile = True if said is None else said
    spec = SweepSpec(tuple(args.device or sweep_file.devices or inventory.devices),
                     tuple(args.model or sweep_file.models or BUILTINS),
                     None if reference in ("", "none") else reference,
                     dataclasses.replace(bench_config(args), **sweep_file.bench),
                     retries=args.retries, tuned=not args.untuned,
                     variants=tuple(args.variant or sweep_file.variants or record_default(SweepSpec, "variants")),
                     shapes=sweep_file.shapes, reference_runtime=not args.tvm_only,
                     profile_cells=() if isinstance(profile, bool) else profile)
    spec = dataclasses.replace(spec, config=dataclasses.replace(spec.config, profile=profile is True,
                                                                profile_share=said is None))
    return spec, budget


def _tune_budget(tune: dict[str, Any], path: str, inventory: Inventory) -> TuneBudget:
    """The sweep file's [tune] as nightly's TuneBudget, its devices checked against the inventory."""
    from farm.tune.config import TuneBudget

    budget = TuneBudget(**tune)
    if unknown := [d for d in budget.devices if d not in inventory.devices]:
        raise FarmError(f"{path}: [tune] devices names unknown device(s): {', '.join(unknown)}",
                        "name devices of the inventory (farm devices)")
    return budget


def _sweep_json(outcome: SweepOutcome, final: dict, reviewed: SweepRegressions, tuning: list,
                report: Path | None) -> dict[str, Any]:
    return {"sweep_id": outcome.sweep_id, "status": outcome.status, "seconds": round(outcome.seconds, 1),
            "skipped": outcome.skipped, "report": str(report) if report else None,
            "not_ok": {standing.value: [list(cell) for cell in cells] for standing, cells in outcome.not_ok.items()},
            "alerts": [{"device": a.device, "model": a.model, "runtime": a.runtime, "metric": a.metric,
                        "status": a.status, "change": a.change, "z": a.z} for a in reviewed.alerts],
            "findings": reviewed.findings,
            "tuning": [dataclasses.asdict(t) for t in tuning],
            "cells": [{"run_id": c.run_id, "device": c.result.device, "model": c.result.model,
                       "status": c.result.status, "failed_step": c.result.failed_step, "reason": c.result.reason,
                       "steady_median_s": median(c.result.steady_samples_s),
                       "unstable": is_unstable(c.result.steady_samples_s), "threads": c.result.threads,
                       "versus_reference": reference_text(c.result, c.reference)}
                      for c in final.values()]}


def _print_sweep(outcome: SweepOutcome, final: dict, reviewed: SweepRegressions, tuning: list,
                 report: Path | None, stored: list[dict[str, Any]]) -> None:
    """The sweep's summary: its cells as this process measured them (``final``), or as the lab's workers stored
    them (``stored``: a queued sweep's last attempt of each cell)."""
    failed = sum(c.result.status != "ok" for c in final.values()) + sum(c["status"] != "ok" for c in stored)
    print(f"sweep {outcome.sweep_id}: {len(final) + len(stored)} cell(s) measured, {failed} failed, "
          f"{outcome.skipped} already done, {outcome.seconds:.0f} s")
    for cell in stored:
        print(f"  {cell['device']:16s} {cell['model']:14s} {cell['status']:6s} (attempts: {cell['attempts']})")
    for (device, model), c in sorted(final.items()):
        print(f"  {device:16s} {model:14s} {c.result.status:6s} {duration(median(c.result.steady_samples_s)):>10s}"
              + (f"  {c.result.failed_step}: {c.result.reason}" if c.result.status != "ok"
                 else f"  {reference_text(c.result, c.reference)}"))
    for t in tuning:
        print(f"  tuned {t.device} · {t.model}: {t.status}" + (f" ({t.reason})" if t.reason else ""))
    for finding in reviewed.findings:
        print(f"  finding {finding.finding_id} [{finding.kind}, {finding.state}]: {finding.sentence}")
    for a in reviewed.alerts:
        runtime = "" if a.runtime == "tvm" else f" [{a.runtime}]"
        print(f"  alert: {a.device} · {a.model}{runtime} · {a.metric}: {a.status} ({alert_change(a)})")
    if report:
        print(f"report: {report}")
