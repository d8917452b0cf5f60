"""farm sweep and farm regressions."""

from __future__ import annotations

import sys

from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.errors import FarmError
from farm.findings import DEFAULT_BUDGET_MIN
from farm.records import BenchConfig, Inventory
from farm.stats import median, model_label

from farm.cli.common import (home_dir, emit_json, print_table, progress_printer, duration, load_inventory_of, bench_config,
                              require_db)


if TYPE_CHECKING:  # the store and the confirmation are imported where a verb needs them
    from farm.confirmation import Progress, SweepRegressions
    from farm.store import Store

UNFINISHED = ("running", "incomplete")  # a sweep's status when it was killed, or a worker ended early


def cmd_sweep(args) -> int:
    from farm.models import BUILTINS
    from farm.store import Store, exists
    from farm.sweep import SweepSpec, run_sweep

    inventory = load_inventory_of(args)
    sweep_id = None
    budget = None  # the sweep file's [tune]: a fresh sweep's, never a resumed one's
    if args.if_incomplete and args.resume is None:
        raise FarmError("--if-incomplete goes with --resume", "farm sweep --resume --if-incomplete")
    if args.resume is not None:
        if args.if_incomplete and not exists(args.db):
            print(f"no sweep to resume: {args.db} does not exist yet", file=sys.stderr)
            return 0
        require_db(args.db)
        with Store(args.db) as store:
            sweep = store.sweep(None if args.resume == "latest" else args.resume)
        if sweep is None and args.if_incomplete:
            print(f"no sweep to resume in {args.db}", file=sys.stderr)
            return 0
        if sweep is None and args.resume == "latest":
            raise FarmError(f"there is no sweep to resume in {args.db}: no farm sweep has run with this database",
                            "start one with farm sweep (runs of farm bench and farm demo are not sweeps)")
        if sweep is None:
            raise FarmError(f"there is no sweep {args.resume} in {args.db}",
                            "farm results --json shows the sweep_id of each stored run; farm sweep --resume takes the latest")
        if args.if_incomplete and sweep["status"] not in UNFINISHED:
            print(f"sweep {sweep['id']} is {sweep['status']}: nothing to resume", file=sys.stderr)
            return 0
        spec, sweep_id = SweepSpec.from_json(sweep["spec"]), sweep["id"]
    else:
        file_spec = _sweep_file(args.file) if args.file else {}
        if "tune" in file_spec:
            from farm.nightly import TuneBudget

            tune = file_spec["tune"]
            budget = TuneBudget(float(tune["minutes"]), int(tune.get("trials", 64)), tuple(tune.get("devices", ())),
                                tune.get("models"))
            if unknown := [d for d in budget.devices if d not in inventory.devices]:
                raise FarmError(f"{args.file}: [tune] devices names unknown device(s): {', '.join(unknown)}",
                                "name devices of the inventory (farm devices)")
        devices = tuple(args.device or file_spec.get("devices") or inventory.devices)
        models = tuple(args.model or file_spec.get("models") or BUILTINS)
        reference = args.reference if args.reference is not None else file_spec.get("reference", "mlp")
        config = bench_config(args)
        if "bench" in file_spec:
            config = BenchConfig(**{**asdict(config), **file_spec["bench"]})
        spec = SweepSpec(devices, models, None if reference in ("", "none") else reference, config,
                         retries=args.retries, tuned=not args.untuned,
                         variants=tuple(args.variant or file_spec.get("variants") or ("fp32",)),
                         shapes={m: {k: tuple(v) for k, v in d.items()} for m, d in file_spec.get("shapes", {}).items()},
                         reference_runtime=not args.tvm_only)
    outcome = run_sweep(inventory.tracker, inventory.devices, spec, args.db, home_dir() / "cache",
                        progress=progress_printer(args.progress), sweep_id=sweep_id)
    report = None
    with Store(args.db) as store:
        reviewed = _detect_and_confirm(store, inventory, outcome.sweep_id, args.confirm, spec.config,
                                       progress_printer(args.progress), args.confirm_budget)
        alerts = reviewed.alerts
        tuning = _nightly_tuning(inventory, spec, outcome.sweep_id, budget, args.db) if budget else []
        if not args.no_report:
            from farm.report import render_report

            report = render_report(store, Path(args.report_dir) / f"sweep-{outcome.sweep_id}.html",
                                   title=f"farm sweep {outcome.sweep_id}", sweep_id=outcome.sweep_id)
    final = {}
    for cell in outcome.cells:  # the last attempt of each cell
        final[(cell.result.device, cell.result.model)] = cell
    failed = [c for c in final.values() if c.result.status != "ok"]
    if args.json:
        emit_json({"sweep_id": outcome.sweep_id, "status": outcome.status, "seconds": round(outcome.seconds, 1),
                   "skipped": outcome.skipped, "report": str(report) if report else None,
                   "alerts": [{"device": a.device, "model": a.model, "runtime": a.runtime, "metric": a.metric,
                               "status": a.status, "change": a.change, "z": a.z} for a in alerts],
                   "findings": reviewed.findings,
                   "tuning": [asdict(t) for t in tuning],
                   "cells": [{"run_id": c.run_id, "device": c.result.device, "model": c.result.model,
                              "status": c.result.status, "failed_step": c.result.failed_step, "reason": c.result.reason,
                              "steady_median_s": median(c.result.steady_samples_s)}
                             for c in final.values()]})
    else:
        print(f"sweep {outcome.sweep_id}: {len(final)} cell(s) measured, {len(failed)} failed, "
              f"{outcome.skipped} already done, {outcome.seconds:.0f} s")
        for (device, model), c in sorted(final.items()):
            med = median(c.result.steady_samples_s)
            print(f"  {device:16s} {model:14s} {c.result.status:6s} {duration(med):>10s}"
                  + (f"  {c.result.failed_step}: {c.result.reason}" if c.result.status != "ok" else ""))
        for t in tuning:
            print(f"  tuned {t.device} · {t.model}: {t.status}" + (f" ({t.reason})" if t.reason else ""))
        for finding in reviewed.findings:
            print(f"  finding {finding.finding_id} [{finding.kind}, {finding.state}]: {finding.sentence}")
        for a in alerts:
            runtime = "" if a.runtime == "tvm" else f" [{a.runtime}]"
            print(f"  alert: {a.device} · {a.model}{runtime} · {a.metric}: {a.status} ({alert_change(a)})")
        if report:
            print(f"report: {report}")
    if outcome.missing:
        cells = ", ".join(f"{d} × {m}" for d, m in outcome.missing[:5]) + (" …" if len(outcome.missing) > 5 else "")
        print(f"error: sweep {outcome.sweep_id} is incomplete: {len(outcome.missing)} cell(s) never measured ({cells})",
              file=sys.stderr)
        print(f"hint: the log above says why; farm sweep --resume {outcome.sweep_id} measures what is missing",
              file=sys.stderr)
        return 1
    return 0


# BenchConfig's fields, as a sweep file's [bench] writes them: a number, whole unless the field is a float
BENCH_KEYS = {f.name: float if "float" in str(f.type) else int for f in fields(BenchConfig)}
SWEEP_FILE_HINT = ('a sweep file: devices = ["cpu"], models = ["mlp"], variants = ["fp32"], reference = "mlp", '
                   "[bench] repeat = 20, [shapes.MODEL] input = [1, 3, 224, 224]")


TUNE_HINT = ("[tune] minutes = 20 (per device key, after measuring), trials = 64 (per model at most), "
             'models = 2 and devices = ["x86-local"] (both optional)')


def _nightly_tuning(inventory: Inventory, spec, sweep_id: int, budget, db: str) -> list:
    """The sweep file's [tune] budget, spent after measuring and confirming (``nightly.tune_after_sweep``)."""
    from farm.models import load_model_variant
    from farm.nightly import tune_after_sweep

    models = {}
    for name in spec.cell_models():
        model = load_model_variant(name, spec.shapes.get(name.rpartition("@")[0] if "@" in name else name))
        models[model.name] = model
    return tune_after_sweep(inventory.tracker, inventory.devices, spec.devices, sweep_id, models, spec.config, budget,
                            db, home_dir() / "cache", home_dir() / "tune",
                            lambda message: print(f"tune: {message}", file=sys.stderr))  # a few lines a night


def _sweep_file(path: str) -> dict[str, Any]:
    """The sweep file, every value checked: a wrong key or type is one error naming it, before any work."""
    import tomllib

    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise FarmError(f"sweep file {path} does not exist", "write devices = [...] and models = [...] in a TOML file") from exc
    except UnicodeDecodeError as exc:
        raise FarmError(f"{path}: not a TOML file (not UTF-8 text)", "pass the sweep file (TOML)") from exc
    except OSError as exc:
        raise FarmError(f"cannot read sweep file {path}: {exc.strerror or exc}", "pass a readable TOML file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise FarmError(f"{path}: not valid TOML: {exc}", "fix the syntax at that line") from exc

    def bad(what: str) -> FarmError:
        return FarmError(f"{path}: {what}", SWEEP_FILE_HINT)

    unknown = set(data) - {"devices", "models", "reference", "bench", "variants", "shapes", "tune"}
    if unknown:
        raise FarmError(f"{path}: unknown key {sorted(unknown)[0]!r}",
                        "allowed: devices, models, variants, reference, [bench], [shapes.MODEL], [tune]")
    tune = data.get("tune", {})
    if not isinstance(tune, dict) or set(tune) - {"minutes", "trials", "devices", "models"}:
        raise FarmError(f"{path}: [tune] takes minutes, trials, models and devices", TUNE_HINT)
    if "tune" in data:
        minutes = tune.get("minutes")
        if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or minutes <= 0:
            raise FarmError(f"{path}: [tune] minutes = {minutes!r} is not a positive number", TUNE_HINT)
        for key in ("trials", "models"):
            value = tune.get(key, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise FarmError(f"{path}: [tune] {key} = {value!r} is not a positive whole number", TUNE_HINT)
        if not (isinstance(tune.get("devices", []), list) and all(isinstance(v, str) for v in tune.get("devices", []))):
            raise FarmError(f"{path}: [tune] devices must be a list of names", TUNE_HINT)
    for key in ("devices", "models", "variants"):
        if key in data and not (isinstance(data[key], list) and all(isinstance(v, str) for v in data[key])):
            raise bad(f"{key} must be a list of names")
    if "reference" in data and not isinstance(data["reference"], str):
        raise bad('reference must be a model name (or "none")')
    bench = data.get("bench", {})
    if not isinstance(bench, dict):
        raise bad("bench must be a table: [bench]")
    for key, value in bench.items():
        if key not in BENCH_KEYS:
            raise FarmError(f"{path}: unknown [bench] key {key!r}", f"allowed: {', '.join(BENCH_KEYS)}")
        kind = BENCH_KEYS[key]
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value < 0 \
                or (value == 0 and key in ("repeat", "number", "copy_repeat", "timeout_s")):
            raise bad(f"[bench] {key} = {value!r} is not a {'positive ' if key != 'seed' else ''}"
                      f"{'whole number' if kind is int else 'number'}")
    shapes = data.get("shapes", {})
    for model, inputs in shapes.items() if isinstance(shapes, dict) else [(None, None)]:
        if not isinstance(inputs, dict) or not all(
                isinstance(dims, list) and dims and all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                                         for d in dims) for dims in inputs.values()):
            raise bad(f"[shapes.{model}] must map input names to lists of positive whole numbers")
    return data


def cmd_regressions(args) -> int:
    from farm.review import format_metric
    from farm.store import Store

    require_db(args.db)
    inventory = load_inventory_of(args) if args.confirm else None
    with Store(args.db) as store:
        for finding_id, state in args.triage:
            store.set_finding_state(finding_id, state)
        reviewed = _detect_and_confirm(store, inventory, args.sweep, args.confirm, bench_config(args),
                                       progress_printer(args.progress), args.confirm_budget)
    alerts, sweep_id, findings = reviewed.alerts, reviewed.sweep_id, reviewed.findings
    failing = [f for f in findings if f.state == "new" and f.direction == "slower"  # new-any: not what reruns rejected
               and ((args.fail_on == "new-any" and (f.confirmed or not f.rejected)) or (args.fail_on == "new" and f.confirmed))]
    if args.json:
        emit_json({"sweep_id": sweep_id, "findings": findings, "budget": reviewed.budget, "alerts": alerts})
    else:
        new = [f for f in findings if f.first_sweep == sweep_id]
        print(f"sweep {sweep_id}: {len(findings)} finding(s), {len(new)} new since the last review; {len(alerts)} alert(s)")
        for title, group in (("new", new), ("ongoing", [f for f in findings if f.first_sweep != sweep_id])):
            for f in group:
                print(f"  [{f.finding_id}] {title}, {'untriaged' if f.state == 'new' else f.state}: {f.sentence}")
        budget = reviewed.budget
        print(f"confirmation: {budget['rerun']} series rerun, {budget['spent_s'] / 60:.1f} of {budget['budget_s'] / 60:g} "
              f"device-minutes; {budget['left_unconfirmed']} finding(s) left unconfirmed")
        print_table([{**a, "change": "" if a.change is None else f"{a.change:+.1%}",
                      "z": "-" if a.z is None else f"{a.z:.1f}", "value": format_metric(a.metric, a.value),
                      "centre": format_metric(a.metric, a.baseline["centre"] if a.baseline else None)} for a in alerts],
                    ["device", "model", "runtime", "metric", "status", "value", "centre", "change", "z"])
    if failing:
        print(f"error: {len(failing)} new {'confirmed ' if args.fail_on == 'new' else ''}finding(s) in sweep {sweep_id}: "
              f"{failing[0].sentence}", file=sys.stderr)
        print("hint: triage them: farm regressions --triage ID:acknowledged (or expected, fixed)", file=sys.stderr)
        return 1
    return 0


def alert_change(alert) -> str:
    """'+12.0%, z 3.1', or for planned memory (deterministic, no z) the change and its value."""
    from farm.review import format_metric

    change = "" if alert.change is None else f"{alert.change:+.1%}"
    if alert.z is None:
        return f"{change}, now {format_metric(alert.metric, alert.value)}".lstrip(", ")
    return f"{change}, z {alert.z:.1f}"


def cmd_drift(args) -> int:
    from farm.drift import drift_rows
    from farm.regress import series_value
    from farm.results import run_rows
    from farm.review import format_metric
    from farm.store import Store

    require_db(args.db)
    with Store(args.db) as store:
        series = drift_rows(run_rows(store, device=args.device, model=args.model),
                            lambda r: series_value(args.metric, r))
    shown = series if args.all else [s for s in series if s["change_points"]]
    if args.json:
        emit_json({"metric": args.metric, "series_checked": len(series), "series": shown})
        return 0
    changed = sum(bool(s["change_points"]) for s in series)
    print(f"{args.metric}: {len(series)} series with enough sweeps, {changed} changed level")
    print_table([{"device": s["device"], "model": model_label(s["model"], s["tuned"]),
                  "change_points": ",".join(map(str, s["change_points"])) or "-",
                  "segments": "; ".join(f"{g['first_sweep']}-{g['last_sweep']}: {format_metric(args.metric, g['median'])}"
                                        for g in s["segments"]),
                  "first_to_last": f"{s['total_change']:+.1%}"} for s in shown],
                ["device", "model", "change_points", "segments", "first_to_last"])
    return 0


def _detect_and_confirm(store: Store, inventory: Inventory | None, sweep_id: int | None, confirm: bool,
                        config: BenchConfig, progress: Progress | None = None,
                        budget_min: float = DEFAULT_BUDGET_MIN) -> SweepRegressions:
    from farm.confirmation import detect_and_confirm

    return detect_and_confirm(store, sweep_id, confirm, inventory.tracker if inventory else None,
                              inventory.devices if inventory else None, config, progress, budget_min)
