"""Verbs that run the farm: tracker, serve, down, devices, dashboard."""

from __future__ import annotations

import sys
import time

from dataclasses import asdict
from pathlib import Path
from typing import Any

from farm.errors import FarmError

from farm.cli.common import home_dir, emit_json, print_table, load_inventory_of, log


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
        processes.update_records(state, lambda current: [r for r in current if r not in mine] + [record])
        if args.json:
            emit_json(asdict(record))
        else:
            print(f"tracker started on {address.host}:{address.port} (pid {record.pid}, log {record.log_path})")
        return 0
    if args.action == "stop":
        stopped = [r.pid for r in mine if processes.stop_process(r)]
        processes.update_records(state, lambda current: [r for r in current if r not in mine])
        print(f"tracker stopped (pid {stopped[0]})" if stopped else "no tracker started by farm is running")
        return 0
    summary = query_summary(TrackerAddress("127.0.0.1" if address.host == "0.0.0.0" else address.host, address.port))
    data = {"address": str(address), "managed_pid": next((r.pid for r in mine if processes.is_running(r)), None),
            "keys": {k: asdict(v) for k, v in summary.keys.items()},
            "servers": [{"key": k, "host": h, "port": p} for k, h, p in summary.servers]}
    if args.json:
        emit_json(data)
    else:
        print(f"tracker at {address} is up"
              + (f" (pid {data['managed_pid']})" if data["managed_pid"] else " (not started by farm)"))
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
    from farm.devices import bring_up, can_bring_up, kind_of
    from farm.rpc import processes
    from farm.rpc.tracker import query_summary, wait_for_servers

    state = home_dir()
    if args.stop:
        return _stop_servers(state, args.json)
    inventory = load_inventory_of(args)
    tracker = inventory.tracker
    if args.tracker:
        from farm.records import TrackerAddress, split_address

        if given := split_address(args.tracker):  # argparse's `address` type checked it
            tracker = TrackerAddress(*given)
    query_summary(tracker)  # fail early and clearly when there is no tracker
    names = args.device or [n for n, d in inventory.devices.items() if can_bring_up(d)]
    # the registry is read here and changed after the bring-ups, under its lock, as it is then: others' records
    # (a watchdog's restart, another `farm serve`) stay; only the ones found gone here are dropped, never the
    # "unknown" ones (a host that did not answer): `farm down` tries those again
    states = {r: processes.process_state(r) for r in processes.load_records(state)}
    running = {r.name for r, s in states.items() if r.role == "server" and s != "gone"}
    for r, s in states.items():
        if r.role == "server" and s == "unknown" and r.name in names:
            print(f"{r.name}: could not check server pid {r.pid} (its host did not answer); not starting another",
                  file=sys.stderr)
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
    gone = {r for r, s in states.items() if s == "gone"}
    records = processes.update_records(state, lambda current: [r for r in current if r not in gone] + started)
    waiting = {r.key: 1 for r in started if kind_of(inventory.devices[r.name]).registers_at_start}
    wait_for_servers(tracker, waiting, timeout_s=args.wait)
    for r in started:
        if note := kind_of(inventory.devices[r.name]).started_note(r):
            print(note, file=sys.stderr)
    rows = [{"device": r.name, "key": r.key, "pid": r.pid, "port": r.port, "log": r.log_path}
            for r in records if r.role == "server"]
    if args.json:
        emit_json({"tracker": str(tracker), "servers": rows,
                   "failed": [{"device": n, "error": e.message, "hint": e.hint} for n, e in failures]})
    else:
        print(f"{len(started)} server(s) started, {len(rows)} running, registered with {tracker}")
        print_table(rows, ["device", "key", "pid", "port", "log"])
    if failures:
        name, error = failures[0]
        others = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        print(f"error: could not bring up {name!r}{others}: {error.message}", file=sys.stderr)
        print(f"hint: {error.hint}", file=sys.stderr)
        if not args.watch:
            return 1
    if args.watch:
        watched = {n: find_device(inventory, n) for n in names}
        _watch(watched, tracker, state, args.interval)
    return 0


def _watch(devices, tracker, state: Path, interval_s: float) -> None:
    """The watchdog: restart what dies until SIGTERM/SIGINT; recorded so `farm down` can end it."""
    import signal
    import threading

    from farm.devices import watch
    from farm.rpc import processes

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    me = processes.own_record("watchdog", "--watch")
    processes.update_records(state, lambda current: current + [me])
    print(f"watching {len(devices)} device(s) every {interval_s:g} s; `farm down` or Ctrl-C ends the watch",
          file=sys.stderr, flush=True)
    try:
        watch(devices, tracker, state, interval_s, stop,
              on_event=lambda text: print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True))
    finally:
        processes.update_records(state, lambda current: [r for r in current if r != me])


def cmd_phones(args) -> int:
    from farm.devices.android import adb_address, list_phones

    address = adb_address(given=args.adb)
    rows = [asdict(p) for p in list_phones(address)]
    if args.json:
        emit_json({"adb": f"{address[0]}:{address[1]}", "phones": rows})
    else:
        print(f"adb server {address[0]}:{address[1]}: {len(rows)} phone(s)")
        print_table(rows, ["serial", "state", "model", "abi", "soc", "android", "opencl", "battery_pct", "battery_temp_c"])
    return 0


def _stop_servers(state: Path, as_json: bool) -> int:
    stopped, failed = stop_roles(state, ("watchdog", "server"))
    if as_json:
        emit_json({"stopped_servers": [r.pid for r in stopped], "failed": _failed_json(failed)})
    else:
        print(f"stopped {len(stopped)} server(s)")
    return _report_failed(failed)


WATCHDOG_GRACE_S = 30.0  # a watchdog ends after the restart it is making (an adb push, a server start)


def stop_roles(state: Path, roles: tuple[str, ...]) -> tuple[list, list]:
    """Stop the recorded processes of each role in turn, the watchdog first so it restarts nothing. Records are read
    again before each role: a watchdog that was restarting a server when told to stop records that server as it
    ends. Returns (the records that were running and are stopped, [(record, error)] for those that could not be);
    the records it handled are dropped from the state file but for the failed ones, kept for another try. Records
    added meanwhile by another command (a `farm serve` that ran at the same time) are kept: what was started after
    the stop is still recorded, for the next `farm down`."""
    from farm.errors import DeviceError
    from farm.rpc import processes

    stopped, failed, handled = [], [], set()
    for role in roles:
        for record in [r for r in processes.load_records(state) if r.role == role]:
            try:
                if processes.stop_process(record, WATCHDOG_GRACE_S if role == "watchdog" else 3.0):
                    stopped.append(record)
                handled.add(record)
            except DeviceError as exc:
                failed.append((record, exc))
    processes.update_records(state, lambda current: [r for r in current if r not in handled])
    return stopped, failed


def _failed_json(failed: list) -> list[dict]:
    return [{**asdict(r), "error": exc.message, "hint": exc.hint} for r, exc in failed]


def _report_failed(failed: list) -> int:
    if not failed:
        return 0
    record, exc = failed[0]
    others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    print(f"error: could not stop {record.role} {record.name!r}{others}: {exc.message}", file=sys.stderr)
    print(f"hint: {exc.hint}", file=sys.stderr)
    return 1


def cmd_down(args) -> int:
    stopped, failed = stop_roles(home_dir(), ("watchdog", "server", "tracker"))
    if args.json:
        emit_json({"stopped": [asdict(r) for r in stopped], "failed": _failed_json(failed)})
    else:
        print(f"stopped {len(stopped)} process(es) farm had started")
    return _report_failed(failed)


def cmd_devices(args) -> int:
    from farm.records import describe_target
    from farm.rpc.tracker import KeyStatus, key_state, query_summary

    if args.kinds:
        return _print_kinds(args.json)
    inventory = load_inventory_of(args)
    summary = query_summary(inventory.tracker)
    rows = []
    for name, device in inventory.devices.items():
        status = summary.keys.get(device.key, KeyStatus(device.key, 0, 0, 0))
        state = key_state(status)
        rows.append({"device": name, "kind": device.kind, "key": device.key, "target": describe_target(device.target),
                     "export": device.export, "emulated": device.emulated, "state": state,
                     "servers": status.servers, "free": status.free, "pending": status.pending})
    known = {d.key for d in inventory.devices.values()}
    extra = sorted(k for k in summary.keys if k not in known and summary.keys[k].servers)
    columns = ["device", "kind", "key", "target", "state", "servers", "free", "pending"]
    if args.probe:
        # TVM's RPC client is all a probe needs, but tvm_ffi imports torch whenever it is installed (1.1 s of the
        # 3.3 s TVM takes to import here); this process never needs torch, so it is marked absent first
        sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
        from farm.rpc.probe import probe_all
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


def _print_kinds(as_json: bool) -> int:
    from farm.devices import kinds

    rows: list[dict[str, Any]] = [
        {"kind": k.name, "summary": k.summary, "serve": k.serve_help, "missing_here": k.prerequisites(),
         "fields": {name: {"type": f.type, "example": f.example, "help": f.help} for name, f in k.fields.items()},
         "example": f"[devices.NAME]\nkind = \"{k.name}\"\n{k.example}"} for k in kinds().values()]
    if as_json:
        emit_json({"kinds": rows})
        return 0
    for row in rows:
        print(f"{row['kind']}: {row['summary']}")
        print(f"  farm serve: {row['serve']}")
        if row["missing_here"]:
            print(f"  this host lacks: {row['missing_here']}")
        for name, field in row["fields"].items():
            print(f"  {name}: {field['help']} (e.g. {field['example']})")
    return 0


def cmd_dashboard(args) -> int:
    from farm.dashboard import serve_dashboard

    inventory = load_inventory_of(args)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("the dashboard binds %s: anyone who reaches it sees the farm's devices and results", args.host)
    url = f"http://{args.host}:{args.port}/"
    try:
        serve_dashboard(inventory, args.db, args.host, args.port,
                        on_ready=lambda: print(f"farm dashboard on {url} (Ctrl-C stops it)", flush=True))
    except KeyboardInterrupt:
        pass
    return 0

