"""farm tracker: start, stop or query TVM's RPC tracker."""

from __future__ import annotations

import argparse

from dataclasses import asdict
from pathlib import Path

from farm.cli.common import add_verb, emit_json, home_dir, port, print_table


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "tracker", run,
                 "start, stop or query TVM's RPC tracker (a managed background process)",
                 "Runs `python -m farm.rpc.tracker_server` (TVM's tracker) in the background with a pid record and a log\n"
                 "in $FARM_HOME.\n"
                 "Binds 127.0.0.1 unless --host says otherwise: TVM RPC has no authentication.")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--host", help="address to bind (default: [tracker] host in devices.toml, else 127.0.0.1)")
    p.add_argument("--port", type=port, help="port (default: [tracker] port in devices.toml, else 9190)")


def run(args: argparse.Namespace) -> int:
    from farm.procs.registry import load_records, update_records
    from farm.procs.supervise import stop_process

    address = _tracker_address(args)
    mine = [r for r in load_records(home_dir()) if r.role == "tracker"]
    if args.action == "start":
        return _start(address, mine, args.json, _allowed(args))
    if args.action == "stop":
        stopped = [r.pid for r in mine if stop_process(r)]
        update_records(home_dir(), lambda current: [r for r in current if r not in mine])
        print(f"tracker stopped (pid {stopped[0]})" if stopped else "no tracker started by farm is running")
        return 0
    return _status(address, mine, args.json)


def _allowed(args: argparse.Namespace) -> dict[str, list[str]] | None:
    """The inventory's registration sources (``rpc.registrations``), where it names its lab hosts' addresses."""
    from farm.inventory import load_inventory
    from farm.devices.registrations import allowed_sources

    if not (Path(args.devices).exists() or args.devices_given):
        return None
    return allowed_sources(load_inventory(args.devices))


def _start(address, mine: list, as_json: bool, allowed: dict[str, list[str]] | None = None) -> int:
    from farm.procs.registry import update_records
    from farm.procs.supervise import is_running
    from farm.rpc.launch import start_tracker

    running = [r for r in mine if is_running(r)]
    if running:
        print(f"tracker already running (pid {running[0].pid}, port {running[0].port})")
        return 0
    record = start_tracker(address.host, address.port, home_dir(), allowed=allowed)
    update_records(home_dir(), lambda current: [r for r in current if r not in mine] + [record])
    if as_json:
        emit_json(asdict(record))
    else:
        print(f"tracker started on {address.host}:{address.port} (pid {record.pid}, log {record.log_path})")
    return 0


def _status(address, mine: list, as_json: bool) -> int:
    from farm.records import TrackerAddress
    from farm.procs.supervise import is_running
    from farm.rpc.tracker import query_summary

    summary = query_summary(TrackerAddress("127.0.0.1" if address.host == "0.0.0.0" else address.host, address.port))
    data = {"address": str(address), "managed_pid": next((r.pid for r in mine if is_running(r)), None),
            "keys": {k: asdict(v) for k, v in summary.keys.items()},
            "servers": [{"key": k, "host": h, "port": p} for k, h, p in summary.servers]}
    if as_json:
        emit_json(data)
    else:
        print(f"tracker at {address} is up"
              + (f" (pid {data['managed_pid']})" if data["managed_pid"] else " (not started by farm)"))
        print_table([asdict(v) for v in summary.keys.values()], ["key", "servers", "free", "pending"])
    return 0


def _tracker_address(args: argparse.Namespace):
    from farm.inventory import DEFAULT_TRACKER, load_inventory
    from farm.records import TrackerAddress

    base = DEFAULT_TRACKER
    if Path(args.devices).exists() or args.devices_given:
        base = load_inventory(args.devices).tracker
    return TrackerAddress(args.host or base.host, args.port or base.port)
