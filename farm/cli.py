"""``farm VERB``: parse, call, print, exit. The only place that catches FarmError.

stdout carries results (tables, paths, --json); progress and logs go to stderr.
Exit codes: 0 success, 1 error (one ``error:`` line and a hint on stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from farm.errors import FarmError

log = logging.getLogger("farm")

EPILOG = """\
examples:
  farm demo                               # private tracker + 2 local devices, built-in models, DB + HTML report
  farm tracker start && farm serve        # tracker and the inventory's local devices, in the background
  farm devices                            # inventory merged with the tracker's live view
  farm bench --device x86-local --model convnet --json
  farm report                             # HTML report of the latest run per device × model
  farm down                               # stop every server and the tracker farm started

environment: FARM_DEVICES (inventory), FARM_DB (results database), FARM_HOME (state: pid files, logs, artifact cache)
"""


# -- shared helpers -------------------------------------------------------------------------

def home_dir() -> Path:
    return Path(os.environ.get("FARM_HOME", ".farm"))


def default_db() -> str:
    return os.environ.get("FARM_DB", str(home_dir() / "results.db"))


def emit_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    if not rows:
        print("(none)")
        return
    cells = [[("" if row.get(c) is None else str(row.get(c))) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip())
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())


def _progress_printer(enabled: bool):
    if not enabled:
        return None
    start = time.monotonic()

    def progress(device: str, model: str, step: str, detail: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] {device} · {model} · {step}: {detail}", file=sys.stderr, flush=True)
    return progress


def _ms(value: float | None) -> str:
    from farm.stats import format_duration

    return "-" if value is None else format_duration(value)


def _parse_shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for item in items:
        name, _, dims = item.partition("=")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(","))
            if not name or not shapes[name]:
                raise ValueError
        except ValueError:
            raise FarmError(f"bad --shape {item!r}", "write --shape NAME=1,3,224,224") from None
    return shapes


def _load_with_variant(args):
    from farm.models import load_model, make_variant

    model = load_model(args.model, _parse_shapes(args.shape))
    return make_variant(model, args.variant, args.calibration, args.calibration_data)


def _add_variant_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("variants")
    g.add_argument("--variant", default="fp32", choices=["fp32", "fp16", "int8"],
                   help="fp16: graph converted to float16; int8: static QDQ quantization (default fp32)")
    g.add_argument("--calibration", default="minmax", choices=["minmax", "entropy", "percentile"],
                   help="int8 calibration method (default minmax)")
    g.add_argument("--calibration-data", help="folder of .npz input samples for int8 calibration (default: generated)")


def _inventory(args):
    from farm.inventory import load_inventory

    return load_inventory(args.devices)


def _bench_config(args):
    from farm.records import BenchConfig

    if args.repeat < 1 or (args.number is not None and args.number < 1):
        raise FarmError("--repeat and --number must be at least 1", "e.g. --repeat 20 --number 10")
    return BenchConfig(repeat=args.repeat, number=args.number, min_repeat_ms=args.min_repeat_ms,
                       timeout_s=args.timeout, rtol=args.rtol, atol=args.atol)


def _add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action="store_true", default=sys.stderr.isatty(),
                   help="print each step to stderr (default: on when stderr is a terminal)")


def _add_bench_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("measurement")
    g.add_argument("--repeat", type=int, default=20, help="steady-state repeats kept raw (default 20)")
    g.add_argument("--number", type=int, default=None,
                   help="calls averaged per repeat (default: calibrated so a repeat lasts --min-repeat-ms)")
    g.add_argument("--min-repeat-ms", type=float, default=50.0, help="minimum length of one repeat when calibrating (default 50)")
    g.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a free device (default 30)")
    g.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance of the output check (default 1e-4)")
    g.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance of the output check (default 1e-4)")


# -- commands -------------------------------------------------------------------------------

def cmd_tracker(args) -> int:
    from farm.records import TrackerAddress
    from farm.rpc import processes
    from farm.rpc.tracker import query_summary

    state = home_dir()
    address = _tracker_address(args)
    records = processes.load_records(state)
    mine = [r for r in records if r.role == "tracker"]
    if args.action == "start":
        running = [r for r in mine if processes.is_running(r)]
        if running:
            print(f"tracker already running (pid {running[0].pid}, port {running[0].port})")
            return 0
        record = processes.start_tracker(address.host, address.port, state)
        processes.save_records(state, [r for r in records if r.role != "tracker"] + [record])
        if args.json:
            emit_json(asdict(record))
        else:
            print(f"tracker started on {address.host}:{address.port} (pid {record.pid}, log {record.log_path})")
        return 0
    if args.action == "stop":
        stopped = [r.pid for r in mine if processes.stop_process(r)]
        processes.save_records(state, [r for r in records if r.role != "tracker"])
        print(f"tracker stopped (pid {stopped[0]})" if stopped else "no tracker started by farm is running")
        return 0
    summary = query_summary(TrackerAddress("127.0.0.1" if address.host == "0.0.0.0" else address.host, address.port))
    data = {"address": str(address), "managed_pid": next((r.pid for r in mine if processes.is_running(r)), None),
            "keys": {k: asdict(v) for k, v in summary.keys.items()},
            "servers": [{"key": k, "host": h, "port": p} for k, h, p in summary.servers]}
    if args.json:
        emit_json(data)
    else:
        print(f"tracker at {address} is up" + (f" (pid {data['managed_pid']})" if data["managed_pid"] else " (not started by farm)"))
        print_table([asdict(v) for v in summary.keys.values()], ["key", "servers", "free", "pending"])
    return 0


def _tracker_address(args):
    from farm.inventory import DEFAULT_TRACKER, load_inventory
    from farm.records import TrackerAddress

    base = DEFAULT_TRACKER
    if Path(args.devices).exists() or args.devices_given:
        base = load_inventory(args.devices).tracker
    return TrackerAddress(args.host or base.host, args.port or base.port)


def cmd_serve(args) -> int:
    from farm.devices import bring_up, can_bring_up
    from farm.rpc import processes
    from farm.rpc.tracker import query_summary, wait_for_servers

    state = home_dir()
    if args.stop:
        return _stop_servers(state, args.json)
    inventory = _inventory(args)
    tracker = inventory.tracker
    if args.tracker:
        host, _, port = args.tracker.rpartition(":")
        from farm.records import TrackerAddress

        tracker = TrackerAddress(host, int(port))
    query_summary(tracker)  # fail early and clearly when there is no tracker
    names = args.device or [n for n, d in inventory.devices.items() if can_bring_up(d)]
    records = processes.load_records(state)
    running = {r.name for r in records if r.role == "server" and processes.is_running(r)}
    started = []
    from farm.inventory import find_device

    failures: list[tuple[str, FarmError]] = []
    for name in names:
        device = find_device(inventory, name)
        if name in running:
            continue
        try:
            started.extend(bring_up(device, tracker, state))
        except FarmError as exc:  # one device's failure does not stop the others
            failures.append((name, exc))
    records = [r for r in records if processes.is_running(r)] + started
    processes.save_records(state, records)
    # an RPC proxy (ios) registers its device only once the phone's app connects: do not wait for it
    waiting = {r.key: 1 for r in started if r.marker != "tvm.exec.rpc_proxy"}
    wait_for_servers(tracker, waiting, timeout_s=args.wait)
    for r in started:
        if r.marker == "tvm.exec.rpc_proxy":
            print(f"{r.name}: RPC proxy listening on port {r.port}; in the iOS RPC app set that proxy address "
                  f"and key {r.key!r}", file=sys.stderr)
    rows = [{"device": r.name, "key": r.key, "pid": r.pid, "port": r.port, "log": r.log_path}
            for r in records if r.role == "server"]
    if args.json:
        emit_json({"tracker": str(tracker), "servers": rows,
                   "failed": [{"device": n, "error": e.message, "hint": e.hint} for n, e in failures]})
    else:
        print(f"{len(started)} server(s) started, {len(rows)} running, registered with {tracker}")
        print_table(rows, ["device", "key", "pid", "port", "log"])
    if failures:
        name, exc = failures[0]
        others = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        print(f"error: could not bring up {name!r}{others}: {exc.message}", file=sys.stderr)
        print(f"hint: {exc.hint}", file=sys.stderr)
        return 1
    return 0


def _stop_servers(state: Path, as_json: bool) -> list[int] | int:
    from farm.rpc import processes

    records = processes.load_records(state)
    stopped = [r.pid for r in records if r.role == "server" and processes.stop_process(r)]
    processes.save_records(state, [r for r in records if r.role != "server"])
    if as_json:
        emit_json({"stopped_servers": stopped})
    else:
        print(f"stopped {len(stopped)} server(s)")
    return 0


def cmd_down(args) -> int:
    from farm.rpc import processes

    state = home_dir()
    records = processes.load_records(state)
    stopped = [asdict(r) for r in records if r.role == "server" and processes.stop_process(r)]
    stopped += [asdict(r) for r in records if r.role == "tracker" and processes.stop_process(r)]
    processes.save_records(state, [])
    if args.json:
        emit_json({"stopped": stopped})
    else:
        print(f"stopped {len(stopped)} process(es) farm had started")
    return 0


def cmd_devices(args) -> int:
    from farm.rpc.tracker import KeyStatus, query_summary

    inventory = _inventory(args)
    summary = query_summary(inventory.tracker)
    rows = []
    for name, device in inventory.devices.items():
        status = summary.keys.get(device.key, KeyStatus(device.key, 0, 0, 0))
        state = "online" if status.free else ("busy" if status.servers else "missing")
        rows.append({"device": name, "kind": device.kind, "key": device.key, "target": device.target["kind"],
                     "export": device.export, "emulated": device.emulated, "state": state,
                     "servers": status.servers, "free": status.free, "pending": status.pending})
    known = {d.key for d in inventory.devices.values()}
    extra = sorted(k for k in summary.keys if k not in known and summary.keys[k].servers)
    columns = ["device", "kind", "key", "target", "state", "servers", "free", "pending"]
    if args.probe:
        from farm.devices.probe import probe_all
        from farm.store import Store

        probes = {p.device: p for p in probe_all(inventory.tracker, list(inventory.devices.values()), summary, args.timeout)}
        with Store(args.db) as store:
            store.record_probes(list(probes.values()))
            seen = store.last_online()
        now = time.time()
        for row in rows:
            p = probes[row["device"]]
            row.update(state=p.state, reason=p.reason, probe_ms=None if p.latency_s is None else round(p.latency_s * 1000, 1),
                       last_seen_s_ago=None if row["device"] not in seen else round(now - seen[row["device"]], 1))
        columns = ["device", "kind", "key", "state", "probe_ms", "last_seen_s_ago", "reason"]
    if args.json:
        emit_json({"tracker": str(inventory.tracker), "devices": rows, "unknown_keys": extra})
    else:
        print(f"tracker {inventory.tracker}")
        print_table(rows, columns)
        if extra:
            print(f"keys registered but not in {inventory.path}: {', '.join(extra)}")
    return 0


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
    from farm.models import load_model

    inventory = _inventory(args)
    devices = [find_device(inventory, args.device)] if args.device else list(inventory.devices.values())
    if args.export:
        import dataclasses

        devices = [dataclasses.replace(d, export=args.export) for d in devices]
    model = _load_with_variant(args)
    tunings = _tuning_sets(args.db, devices) if not args.untuned else {}
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


def _tuning_sets(db_path: str, devices) -> dict:
    """Each device's tuning records from the store (none when there is no database yet)."""
    if not Path(db_path).exists():
        return {}
    from farm.store import Store
    from farm.sweep import tuning_set

    with Store(db_path) as store:
        return {d.name: tuning_set(store, d) for d in devices}


def cmd_bench(args) -> int:
    from farm.inventory import find_device
    from farm.models import load_model
    from farm.store import Store
    from farm.sweep import bench_cell

    inventory = _inventory(args)
    device = find_device(inventory, args.device)
    model = _load_with_variant(args)
    config = _bench_config(args)
    with Store(args.db) as store:
        cell = bench_cell(inventory.tracker, device, model, store, home_dir() / "cache", config,
                          reference_file=args.reference, progress=_progress_printer(args.progress), tuned=not args.untuned)
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
        print(f"  load {_ms(r.load_s)}   first run {_ms(r.first_run_s)}   steady median {_ms(steady_median)}"
              f" ({len(r.steady_samples_s)} repeats × {r.steady_number or 0} calls)")
        for c in data["copy_s"]:
            print(f"  copy output {c['output']} ({c['bytes']} B): {_ms(c['median_s'])}")
        err = r.check.max_abs_err
        print(f"  check: {r.check.status}" + (f" (max abs error {err:.3g})" if err is not None else ""))
    if r.status != "ok":
        print(f"error: {r.reason}", file=sys.stderr)
        print(f"hint: {r.hint or 'the failed run is stored; see farm results'} (stored as run {cell.run_id})", file=sys.stderr)
        return 1
    return 0


def cmd_tune(args) -> int:
    from farm.inventory import find_device
    from farm.models import load_model
    from farm.store import Store

    inventory = _inventory(args)
    device = find_device(inventory, args.device)
    model = load_model(args.model, _parse_shapes(args.shape))
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
                                runner_timeout_s=runner_timeout, request_timeout_s=args.timeout)
            printer = (lambda m: print(m, file=sys.stderr, flush=True)) if args.progress else None
            with _graceful_interrupt("stopping after the batch in flight; Ctrl-C again to abort") as stop:
                outcome = tune_model(inventory.tracker, device, model, store, home_dir() / "tune", config, printer,
                                     should_stop=stop.is_set)
            out.update({"session_id": outcome.session_id, "status": outcome.status, "reason": outcome.reason,
                        "trials": outcome.trials_done, "new_records": outcome.new_records,
                        "total_records": outcome.total_records, "seconds": round(outcome.seconds, 1),
                        "tasks": [{"name": t.name, "trials": t.trials, "best_s": t.best_s} for t in outcome.tasks]})
            if outcome.status in ("interrupted", "device-lost"):
                exit_code = 130 if outcome.status == "interrupted" else 1
        if args.export_dir:
            out["exported_records"] = len(export_database(store, device, Path(args.export_dir)).records)
        if args.report and exit_code == 0:
            out["comparison"] = _tuned_vs_untuned(inventory, device, model, store, _bench_config(args), args.progress)
    if args.json:
        emit_json(out)
    else:
        if "status" in out:
            print(f"tune session {out['session_id']}: {out['status']}" + (f" ({out['reason']})" if out["reason"] else "")
                  + f", {out['trials']} trials in {out['seconds']:.0f} s, {out['new_records']} new records,"
                  f" {out['total_records']} in the store for this target")
            print_table([{**t, "best": _ms(t["best_s"])} for t in out["tasks"]], ["name", "trials", "best"])
        for k in ("imported_records", "exported_records"):
            if k in out:
                print(f"{k.replace('_', ' ')}: {out[k]}")
        if "comparison" in out:
            c = out["comparison"]
            print(f"untuned {_ms(c['untuned_s'])}  tuned {_ms(c['tuned_s'])}  speedup {c['speedup']:.2f}x"
                  f"  ({c['tuned_tasks']}/{c['total_tasks']} tasks tuned; runs {c['untuned_run']}, {c['tuned_run']})")
    if exit_code == 1:
        print(f"error: {out['reason']}; {out['new_records']} new records kept", file=sys.stderr)
        print("hint: bring the device back (farm devices) and rerun the same command to continue", file=sys.stderr)
    elif exit_code == 130:
        print(f"interrupted: every measured record is kept ({out['total_records']} for this target);"
              " rerun the same command to continue", file=sys.stderr)
    return exit_code


@contextlib.contextmanager
def _graceful_interrupt(message: str):
    """First Ctrl-C sets the yielded event (work stops at a safe point); a second one aborts."""
    stop = threading.Event()

    def on_sigint(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print(message, file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def _tuned_vs_untuned(inventory, device, model, store, config, progress: bool) -> dict[str, Any]:
    """Bench the model untuned and tuned on the same device, in this run."""
    from farm.sweep import bench_cell

    printer = _progress_printer(progress)
    runs = {}
    for tuned in (False, True):
        cell = bench_cell(inventory.tracker, device, model, store, home_dir() / "cache", config, progress=printer, tuned=tuned)
        if cell.result.status != "ok":
            raise FarmError(f"{'tuned' if tuned else 'untuned'} bench failed at {cell.result.failed_step}: {cell.result.reason}",
                            cell.result.hint or "see farm results")
        runs[tuned] = cell
    medians = {k: sorted(c.result.steady_samples_s)[len(c.result.steady_samples_s) // 2] for k, c in runs.items()}
    return {"untuned_s": medians[False], "tuned_s": medians[True], "speedup": medians[False] / medians[True],
            "untuned_run": runs[False].run_id, "tuned_run": runs[True].run_id,
            "tuned_tasks": runs[True].artifact.tuned_tasks, "total_tasks": runs[True].artifact.total_tasks}


def cmd_sweep(args) -> int:
    from farm.models import BUILTINS
    from farm.records import BenchConfig
    from farm.store import Store
    from farm.sweep import SweepSpec, run_sweep

    inventory = _inventory(args)
    sweep_id = None
    if args.resume is not None:
        _require_db(args.db)
        with Store(args.db) as store:
            sweep = store.sweep(None if args.resume == "latest" else int(args.resume))
        if sweep is None:
            raise FarmError(f"no sweep {args.resume} in {args.db}", "see farm results --json for sweep ids")
        spec, sweep_id = SweepSpec.from_json(sweep["spec"]), sweep["id"]
    else:
        file_spec = _sweep_file(args.file) if args.file else {}
        devices = tuple(args.device or file_spec.get("devices") or inventory.devices)
        models = tuple(args.model or file_spec.get("models") or BUILTINS)
        reference = args.reference if args.reference is not None else file_spec.get("reference", "mlp")
        config = _bench_config(args)
        if "bench" in file_spec:
            config = BenchConfig(**{**asdict(config), **file_spec["bench"]})
        spec = SweepSpec(devices, models, None if reference in ("", "none") else reference, config,
                         retries=args.retries, tuned=not args.untuned,
                         variants=tuple(args.variant or file_spec.get("variants") or ("fp32",)),
                         shapes={m: {k: tuple(v) for k, v in d.items()} for m, d in file_spec.get("shapes", {}).items()})
    outcome = run_sweep(inventory.tracker, inventory.devices, spec, Path(args.db), home_dir() / "cache",
                        progress=_progress_printer(args.progress), sweep_id=sweep_id)
    report = None
    with Store(args.db) as store:
        alerts, _ = detect_and_confirm(store, inventory, outcome.sweep_id, args.confirm, spec.config,
                                       _progress_printer(args.progress))
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
                   "alerts": [{k: a[k] for k in ("device", "model", "metric", "status", "change", "z")} for a in alerts],
                   "cells": [{"run_id": c.run_id, "device": c.result.device, "model": c.result.model,
                              "status": c.result.status, "failed_step": c.result.failed_step, "reason": c.result.reason}
                             for c in final.values()]})
    else:
        print(f"sweep {outcome.sweep_id}: {len(final)} cell(s) measured, {len(failed)} failed, "
              f"{outcome.skipped} already done, {outcome.seconds:.0f} s")
        for (device, model), c in sorted(final.items()):
            med = sorted(c.result.steady_samples_s)[len(c.result.steady_samples_s) // 2] if c.result.steady_samples_s else None
            print(f"  {device:16s} {model:14s} {c.result.status:6s} {_ms(med):>10s}"
                  + (f"  {c.result.failed_step}: {c.result.reason}" if c.result.status != "ok" else ""))
        for a in alerts:
            print(f"  alert: {a['device']} · {a['model']} · {a['metric']}: {a['status']} ({a['change']:+.1%}, z {a['z']:.1f})")
        if report:
            print(f"report: {report}")
    return 0


def _sweep_file(path: str) -> dict[str, Any]:
    import tomllib

    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FarmError(f"sweep file {path} does not exist", "write devices = [...] and models = [...] in a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise FarmError(f"{path}: not valid TOML: {exc}", "fix the syntax at that line") from None
    unknown = set(data) - {"devices", "models", "reference", "bench", "variants", "shapes"}
    if unknown:
        raise FarmError(f"{path}: unknown key {sorted(unknown)[0]!r}",
                        "allowed: devices, models, variants, reference, [bench], [shapes.MODEL]")
    return data


def cmd_regressions(args) -> int:
    from farm.store import Store

    _require_db(args.db)
    inventory = _inventory(args) if args.confirm else None
    with Store(args.db) as store:
        alerts, sweep_id = detect_and_confirm(store, inventory, None if args.sweep is None else int(args.sweep),
                                              args.confirm, _bench_config(args), _progress_printer(args.progress))
    if args.json:
        emit_json({"sweep_id": sweep_id, "alerts": alerts})
    else:
        print(f"sweep {sweep_id}: {len(alerts)} alert(s)")
        print_table([{**a, "change": f"{a['change']:+.1%}", "z": f"{a['z']:.1f}", "value": _ms(a["value"]),
                      "centre": _ms(a["baseline"]["centre"])} for a in alerts],
                    ["device", "model", "metric", "status", "value", "centre", "change", "z"])
    return 0


def detect_and_confirm(store, inventory, sweep_id, confirm_candidates: bool, config, progress=None):
    """Store the sweep's candidate/improved verdicts as alerts; with ``confirm_candidates``, rerun
    old and new artifacts interleaved on the device and store the confirmation."""
    from farm.regress import METHOD, confirm, detect
    from farm.results import run_rows

    sweep = store.sweep(sweep_id)
    if sweep is None:
        raise FarmError("no sweep in the database yet" if sweep_id is None else f"no sweep {sweep_id}",
                        "run farm sweep first; regressions compare sweeps")
    verdicts = [v for v in detect(run_rows(store), sweep["id"]) if v["status"] in ("candidate", "improved")]
    for verdict in verdicts:
        store.save_alert(verdict, METHOD.to_json())
        if not (confirm_candidates and verdict["status"] == "candidate" and verdict["metric"] == "steady"):
            continue
        status, detail = _confirm_one(store, inventory, verdict, config, confirm, progress)
        store.save_alert(verdict, METHOD.to_json(), status, detail)
    return store.alerts(sweep["id"]), sweep["id"]


def _confirm_one(store, inventory, verdict, config, confirm, progress):
    from farm.measure import interleaved_samples
    from farm.models import load_model, make_inputs
    from farm.records import Artifact

    if verdict["artifact_key"] == verdict["baseline_artifact_key"]:
        return "drift", {"reason": "same artifact as the baseline: the device changed, not the model"}
    rows = [store.artifact(verdict["baseline_artifact_key"] or ""), store.artifact(verdict["artifact_key"])]
    if any(r is None or not Path(r["path"]).exists() for r in rows):
        return "unknown", {"reason": "an artifact is no longer in the cache; cannot rerun"}
    old, new = [Artifact(cache_key=r["cache_key"], path=r["path"], model_name=verdict["model"],
                         model_digest=r["model_digest"], target=r["target"], export=r["export"],
                         toolchain=r["toolchain"], tvm_version=r["tvm_version"], file_digest=r["file_digest"],
                         build_s=r["build_s"]) for r in rows]
    device = inventory.devices.get(verdict["device"])
    if device is None:
        return "unknown", {"reason": f"device {verdict['device']!r} is not in the inventory"}
    try:
        inputs = make_inputs(load_model(verdict["model"]), config.seed)
    except FarmError as exc:
        return "unknown", {"reason": exc.message}
    if progress:
        progress(device.name, verdict["model"], "confirm", "old and new artifacts interleaved")
    try:
        status, comparison = confirm(lambda n: interleaved_samples(inventory.tracker, device, old, new, inputs, n, config))
    except FarmError as exc:
        return "unknown", {"reason": exc.message}
    return status, {"method": "interleaved rerun, Mann-Whitney U and KS", **asdict(comparison)}


def cmd_compare(args) -> int:
    from farm.regress import compare_samples
    from farm.store import Store

    _require_db(args.db)
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
        print(f"run {args.run_a}: {runs[args.run_a]['device']} · {runs[args.run_a]['model']}  median {_ms(result.median_old)} ({result.n_old} samples)")
        print(f"run {args.run_b}: {runs[args.run_b]['device']} · {runs[args.run_b]['model']}  median {_ms(result.median_new)} ({result.n_new} samples)")
        print(f"change {result.change:+.2%}; Mann-Whitney U p={result.mann_whitney_p:.3g}, KS p={result.ks_p:.3g}: {result.verdict}")
    return 0


def cmd_dashboard(args) -> int:
    from farm.dashboard import serve_dashboard

    inventory = _inventory(args)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("the dashboard binds %s: anyone who reaches it sees the farm's devices and results", args.host)
    url = f"http://{args.host}:{args.port}/"
    try:
        serve_dashboard(inventory, Path(args.db), args.host, args.port,
                        on_ready=lambda: print(f"farm dashboard on {url} (Ctrl-C stops it)", flush=True))
    except KeyboardInterrupt:
        pass
    return 0


def cmd_results(args) -> int:
    from farm.results import rows_frame, run_rows
    from farm.store import Store

    _require_db(args.db)
    with Store(args.db) as store:
        rows = run_rows(store, device=args.device, model=args.model, latest_only=args.latest)
    if args.csv:
        rows_frame(rows).to_csv(sys.stdout, index=False)
    elif args.json:
        emit_json(rows)
    else:
        table = [{**r, "steady": _ms(r["steady_median_s"]), "load": _ms(r["load_s"]), "first": _ms(r["first_run_s"])}
                 for r in rows]
        print_table(table, ["run_id", "started_at", "device", "model", "status", "failed_step", "load", "first", "steady", "check"])
    return 0


def cmd_report(args) -> int:
    from farm.report import render_report
    from farm.store import Store

    _require_db(args.db)
    out = Path(args.out) if args.out else Path("reports") / f"report-{time.strftime('%Y%m%d-%H%M%S')}.html"
    with Store(args.db) as store:
        path = render_report(store, out, title=args.title)
    if args.json:
        emit_json({"report": str(path)})
    else:
        print(path)
    return 0


def _require_db(path: str) -> None:
    if not Path(path).exists():
        raise FarmError(f"no results database at {path}", "run `farm bench` or `farm demo` first, or pass --db PATH")


def cmd_demo(args) -> int:
    from farm.demo import run_demo

    models = tuple(m for m in args.models.split(",") if m)
    outcome = run_demo(Path(args.db), Path(args.report_dir), home_dir(), home_dir() / "cache", models,
                       _bench_config(args), progress=_progress_printer(args.progress))
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
            print(f"{r.device:14s} {r.model:10s} {r.status:6s} steady {_ms(med):>12s}  check {r.check.status}"
                  + (f"  ({r.failed_step}: {r.reason})" if r.status != "ok" else ""))
        print(f"results database: {outcome.db_path}")
        print(f"report: {outcome.report_path}")
        print(f"finished in {outcome.seconds:.0f} s; every process the demo started is stopped")
    return 1 if failed else 0


# -- parser ---------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--devices", default=argparse.SUPPRESS,
                        help="inventory file (env FARM_DEVICES, default ./devices.toml)")
    common.add_argument("--db", default=argparse.SUPPRESS, help="results database (env FARM_DB, default .farm/results.db)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output on stdout")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log more to stderr")

    parser = argparse.ArgumentParser(
        prog="farm", parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Benchmark ML models on a farm of devices through TVM RPC: compile, push, measure, store, report.",
    )
    sub = parser.add_subparsers(dest="command", metavar="VERB", required=True)

    def add(name: str, func, help_text: str, description: str = "") -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=description or help_text,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=func)
        return p

    p = add("tracker", cmd_tracker, "start, stop or query TVM's RPC tracker (a managed background process)",
            "Runs `python -m tvm.exec.rpc_tracker` in the background with a pid record and a log in $FARM_HOME.\n"
            "Binds 127.0.0.1 unless --host says otherwise: TVM RPC has no authentication.")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--host", help="address to bind (default: [tracker] host in devices.toml, else 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: [tracker] port in devices.toml, else 9190)")

    p = add("serve", cmd_serve, "start rpc_servers for the inventory's local devices",
            "Starts one `python -m tvm.exec.rpc_server` per local device, each in its own process group,\n"
            "registered with the tracker under the device's key, and waits until the tracker lists them.")
    p.add_argument("--device", action="append", help="only this device (repeatable)")
    p.add_argument("--tracker", help="HOST:PORT of the tracker (default: [tracker] in devices.toml)")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for registration (default 60)")
    p.add_argument("--stop", action="store_true", help="stop the servers farm started instead")

    add("down", cmd_down, "stop every server and tracker farm started")

    p = add("devices", cmd_devices, "inventory merged with the tracker's live summary; --probe checks each device",
            "Each device's state: online (a free server), busy (servers, none free), missing (no server).\n"
            "--probe opens a no-op session on every device at once (bounded by --timeout): online, busy,\n"
            "missing or unreachable with the reason and when it was last seen online; probes are stored.")
    p.add_argument("--probe", action="store_true", help="health-check every device with a no-op session")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds per probe (default 3)")

    add("models", cmd_models, "list the built-in models and the onnx package's architectures")

    p = add("compile", cmd_compile, "compile a model for a device (or every device) and export it",
            "Compiles with Relax for the device's target, exports in its format, caches by\n"
            "model digest + target + export + toolchain + TVM version. Prints each artifact's\n"
            "format, architecture and embedded device code (OpenCL, Metal, CUDA).")
    p.add_argument("--device", help="inventory device (default: every device, nothing is run)")
    p.add_argument("--model", required=True, help="built-in name (mlp, convnet), onnx:NAME, or a .onnx path")
    p.add_argument("--shape", action="append", default=[], help="bind an input shape: NAME=1,3,224,224 (repeatable)")
    p.add_argument("--export", choices=["so", "tar", "system-lib"],
                   help="override the devices' export format (e.g. tar: objects, no linker needed)")
    p.add_argument("--untuned", action="store_true", help="ignore the store's tuning records")
    _add_variant_options(p)

    p = add("bench", cmd_bench, "compile, push, measure, check and store one model on one device",
            "Steps: session, upload, load, first run, steady state (time_evaluator, raw repeats),\n"
            "device→host copy per output, output check. A failed step is stored with its reason;\n"
            "the command then prints `error:` and exits 1.")
    p.add_argument("--device", required=True, help="inventory device name")
    p.add_argument("--model", required=True, help="built-in name (mlp, convnet), onnx:NAME, or a .onnx path")
    p.add_argument("--shape", action="append", default=[], help="bind an input shape: NAME=1,3,224,224 (repeatable)")
    p.add_argument("--reference", help="expected outputs (.npz, np.savez order) instead of onnxruntime's")
    p.add_argument("--untuned", action="store_true", help="ignore the store's tuning records for this device")
    _add_variant_options(p)
    _add_progress(p)
    _add_bench_options(p)

    p = add("tune", cmd_tune, "search faster schedules on a device with MetaSchedule (XGBoost cost model)",
            "Extracts the model's tasks, tunes them on the device through the tracker (candidates built\n"
            "for its target, measured on it), and keeps every record in the results database: bench,\n"
            "compile and sweep then use the best records for that device's target automatically.\n"
            "Ctrl-C or a lost device keeps what was measured; the same command again continues.\n\n"
            "  farm tune --device x86-local --model convnet --trials 256 --report\n"
            "  farm tune --device x86-local --model convnet --trials 0 --export shared-records/")
    p.add_argument("--device", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--shape", action="append", default=[], help="bind an input shape: NAME=1,3,224,224 (repeatable)")
    p.add_argument("--trials", type=int, default=64, help="trials this session (default 64; 0 = no tuning)")
    p.add_argument("--per-task", type=int, default=None, help="at most this many trials per task")
    p.add_argument("--minutes", type=float, default=None, help="stop after this many minutes")
    p.add_argument("--tasks", help="only tasks whose name contains this (see --list-tasks)")
    p.add_argument("--list-tasks", action="store_true", help="print the model's tuning tasks and exit")
    p.add_argument("--runner-timeout", type=float, default=None,
                   help="seconds per candidate on the device (default: the device's runner_timeout_s, else 60)")
    p.add_argument("--report", action="store_true", help="then bench untuned vs tuned on the device and print both")
    p.add_argument("--export", dest="export_dir", help="write the records as MetaSchedule JSON database files to DIR")
    p.add_argument("--import", dest="import_dir", help="merge MetaSchedule JSON database files from DIR first")
    _add_progress(p)
    _add_bench_options(p)

    p = add("sweep", cmd_sweep, "measure every device × model in parallel (one worker per device), resumable",
            "Compiles each artifact once (cached, with tuning records) while the devices measure, one\n"
            "worker per device; a dropped session is retried; a failed cell is stored with its reason.\n"
            "A reference model runs first on every device in every sweep, so device drift can be told\n"
            "from model regressions. After a crash: farm sweep --resume finishes only the missing cells.\n\n"
            "  farm sweep                                   # every device × the built-in models\n"
            "  farm sweep --device x86-local --model convnet --model my.onnx\n"
            "  farm sweep --file nightly.toml               # devices = [...], models = [...], [bench] repeat = 30\n"
            "  farm sweep --resume                          # the latest sweep (or --resume ID)")
    p.add_argument("--device", action="append", help="a device (repeatable; default: every inventory device)")
    p.add_argument("--model", action="append", help="a model (repeatable; default: the built-in zoo)")
    p.add_argument("--file", help="sweep file (TOML: devices, models, variants, reference, [bench], [shapes.MODEL])")
    p.add_argument("--reference", default=None, help="reference model run on every device first (default mlp; none to skip)")
    p.add_argument("--retries", type=int, default=1, help="retries of a cell whose session dropped (default 1)")
    p.add_argument("--variant", action="append", choices=["fp32", "fp16", "int8"],
                   help="a variant axis (repeatable; default fp32); int8 is calibrated with min-max")
    p.add_argument("--untuned", action="store_true", help="ignore the store's tuning records")
    p.add_argument("--resume", nargs="?", const="latest", help="finish a crashed sweep (default: the latest)")
    p.add_argument("--report-dir", default="reports", help="where the HTML report goes (default reports/)")
    p.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    p.add_argument("--confirm", action="store_true", help="confirm regression candidates by interleaved reruns")
    _add_progress(p)
    _add_bench_options(p)

    p = add("regressions", cmd_regressions, "judge a sweep against the nightly baseline; confirm candidates",
            "For every series (model × device × tuned, per metric) of the sweep (default: the latest), the\n"
            "baseline is the last 20 accepted nightly medians (median, 1.4826·MAD). Candidates pass a robust z\n"
            "and a relative change (generous); --confirm reruns old and new artifacts interleaved on the\n"
            "device and needs Mann-Whitney U and KS p < 0.01 (strict). Alerts are stored with method,\n"
            "parameters, baseline and confirmation, so every verdict can be reproduced.")
    p.add_argument("--sweep", help="sweep id (default: the latest)")
    p.add_argument("--confirm", action="store_true", help="rerun candidates' old and new artifacts interleaved on the device")
    _add_progress(p)
    _add_bench_options(p)

    p = add("compare", cmd_compare, "compare two runs' raw samples (Mann-Whitney U, Kolmogorov-Smirnov)")
    p.add_argument("run_a", type=int)
    p.add_argument("run_b", type=int)

    p = add("dashboard", cmd_dashboard, "a live, read-only web view: devices, running sweep, results, alerts",
            "Serves a small page (tornado) that refreshes every 5 s from the tracker and the results\n"
            "database, opened read-only. Binds 127.0.0.1 unless --host says otherwise.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8090)

    p = add("results", cmd_results, "list stored runs with computed summaries (--json, --csv)")
    p.add_argument("--device")
    p.add_argument("--model")
    p.add_argument("--latest", action="store_true", help="only the latest run per device × model")
    p.add_argument("--csv", action="store_true", help="CSV on stdout")

    p = add("report", cmd_report, "write a self-contained HTML report of the results")
    p.add_argument("--out", help="output file (default reports/report-TIMESTAMP.html)")
    p.add_argument("--title", default="farm report")

    p = add("demo", cmd_demo, "the main job on an embedded default: private tracker, 2 local devices, built-in models",
            "Needs no inventory. Starts a tracker and two local rpc_servers on free loopback ports,\n"
            "benchmarks the built-in models on both, writes the DB and an HTML report, prints where they\n"
            "are, and stops everything it started.")
    p.add_argument("--models", default="mlp,convnet", help="comma-separated models (default mlp,convnet)")
    p.add_argument("--report-dir", default="reports", help="where the HTML report goes (default reports/)")
    _add_progress(p)
    _add_bench_options(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.devices_given = hasattr(args, "devices")
    args.devices = getattr(args, "devices", None) or os.environ.get("FARM_DEVICES", "devices.toml")
    args.db = getattr(args, "db", None) or default_db()
    args.json = getattr(args, "json", False)
    verbose = getattr(args, "verbose", False)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not verbose:  # MetaSchedule logs every batch at INFO; farm prints its own progress
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    try:
        return args.func(args)
    except FarmError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
