"""farm worker: on a lab host, measure the queued sweeps' cells of the devices attached to it."""

from __future__ import annotations

import argparse
import os
import socket
import sys

from farm.errors import FarmError

from farm.cli.common import add_progress, add_verb, emit_json, home_dir, load_inventory_of, print_table, progress_printer

DESCRIPTION = (
    "A lab of several hosts shares one PostgreSQL database (--db postgresql://...). Each device names the host it\n"
    "is attached to (lab_host = \"lab2\" in devices.toml); a sweep over such devices queues its cells there, and\n"
    "the farm worker of each host measures its own devices' cells through its own tracker, adb and loopback,\n"
    "and spends a sweep file's [tune] budget on its own device keys (one job per key: keys tune at once).\n\n"
    "  farm worker --lab-host lab2                  # serve lab2's devices (farm serve first, or --serve)\n"
    "  farm worker --lab-host lab2 --serve          # bring them up as farm serve does, then serve them\n"
    "  farm worker --builds                         # compile queued sweeps' artifacts (any host with the toolchain)\n"
    "  farm worker --status                         # each lab host's queued, running and stalled jobs\n\n"
    "A sweep's compiles are jobs of their own. A build worker takes those of every device whose toolchain is on\n"
    "its host, one at a time (start one per core), and puts each artifact in the lab's store on the database;\n"
    "the measuring host reads it there and checks its sha256. With no build worker, each cell compiles on its\n"
    "own host, as before.\n\n"
    "Several workers on one host share its devices: a device runs one job at a time, whichever worker takes it.\n"
    "Each worker holds at most --slots sessions at once (default: one per device, at most 24).\n"
    "A worker that dies has its running cells queued again on its host once it is silent for {stalled:g} s\n"
    "(they run again within about {within:g} s on another worker of the host); a cell is never stored twice.")


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    from farm.lab.jobs import RETRY_WITHIN_S, STALLED_S

    p = add_verb(subparsers, common, "worker", run,
                 "on a lab host: measure the queued cells of the devices attached to it (PostgreSQL)",
                 DESCRIPTION.format(stalled=STALLED_S, within=RETRY_WITHIN_S))
    p.add_argument("--lab-host", help="this host's name, as the inventory's lab_host says it")
    p.add_argument("--slots", type=int, default=None, help="cells measured at once (default: its devices, at most 24)")
    p.add_argument("--serve", action="store_true", help="bring the host's devices up first, as farm serve does")
    p.add_argument("--until-empty", action="store_true",
                   help="stop when the host's queue is empty instead of waiting for more (scripts, tests)")
    p.add_argument("--builds", action="store_true",
                   help="compile the queued sweeps' artifacts instead of measuring cells (no --lab-host)")
    p.add_argument("--status", action="store_true", help="show each lab host's jobs instead of working")
    add_progress(p)


def run(args: argparse.Namespace) -> int:
    from farm.lab.queue import LabQueue
    from farm.rpc.session import SESSION_SLOTS
    from farm.store.locations import require_server

    require_server(args.db, "farm worker")
    if args.status:
        return _status(LabQueue(args.db), args.json)
    if args.builds:
        return _builds(args)
    if not args.lab_host:
        raise FarmError("farm worker needs --lab-host NAME", "name this host as the inventory's lab_host does")
    inventory = load_inventory_of(args)
    devices = {n: d for n, d in inventory.devices.items() if d.lab_host == args.lab_host}
    if not devices:
        hosts = sorted({d.lab_host for d in inventory.devices.values() if d.lab_host})
        raise FarmError(f"no device of {args.devices} names lab_host = {args.lab_host!r}",
                        f"the inventory's lab hosts: {', '.join(hosts) or 'none'}; write lab_host on each device")
    slots = args.slots or min(len(devices), SESSION_SLOTS)
    if not 1 <= slots <= SESSION_SLOTS:
        raise FarmError(f"--slots {slots} is not between 1 and {SESSION_SLOTS}",
                        f"one process holds at most {SESSION_SLOTS} sessions: start another worker for more")
    if args.serve:
        _serve(inventory, sorted(devices))
    from farm.night.tuning import LabTuning
    from farm.lab.worker import LabWorker, serve_lab_host

    name = f"{args.lab_host}:{socket.gethostname()}:{os.getpid()}"
    _check_reachable(args.db, inventory.tracker)
    print(f"worker {name}: started: {len(devices)} device(s) of lab host {args.lab_host}, {slots} slot(s), "
          f"tracker {inventory.tracker} and the lab's queue answered", file=sys.stderr, flush=True)
    worker = LabWorker(args.db, devices, inventory.tracker, home_dir() / "cache", progress_printer(args.progress),
                       name=name)
    tuning = LabTuning(worker, home_dir() / "tune", lambda message: print(f"tune: {message}", file=sys.stderr, flush=True))
    serve_lab_host(args.db, args.lab_host, worker, slots, name, wait=not args.until_empty, tuning=tuning)
    return 0


def _builds(args: argparse.Namespace) -> int:
    if args.lab_host or args.serve:
        raise FarmError("farm worker --builds takes no --lab-host or --serve: it builds for every host",
                        "start a build worker and a lab host's worker as two processes")
    from farm.lab.worker import LabWorker, buildable, serve_builds

    inventory = load_inventory_of(args)
    names, not_here = buildable(inventory.devices)
    if not names:
        raise FarmError(f"this host has the toolchain of no device in {args.devices}",
                        "; ".join(f"{n}: {why}" for n, why in sorted(not_here.items()))[:400])
    name = f"builds:{socket.gethostname()}:{os.getpid()}"
    _check_reachable(args.db, None)
    print(f"worker {name}: started: builds for {len(names)} device(s)" + (
        f"; not for {', '.join(sorted(not_here))} (no toolchain here)" if not_here else ""), file=sys.stderr, flush=True)
    worker = LabWorker(args.db, {n: inventory.devices[n] for n in names}, inventory.tracker, home_dir() / "cache",
                       progress_printer(args.progress), name=name)
    serve_builds(args.db, worker, names, name, wait=not args.until_empty)
    return 0


def _check_reachable(db: str, tracker) -> None:
    """The lab's queue and (for a lab host's worker) its tracker answer now, before the worker says it started (#50:
    a worker against an unreachable database first printed its start, then the error)."""
    from farm.lab.queue import LabQueue
    from farm.rpc.tracker import query_summary

    LabQueue(db).check()
    if tracker is not None:
        query_summary(tracker)


def _serve(inventory, names: list[str]) -> None:
    from farm.devices import bring_up_devices, can_bring_up

    started, _, failures = bring_up_devices(inventory, [n for n in names if can_bring_up(inventory.devices[n])],
                                            inventory.tracker, home_dir(), 60.0, lambda note: print(note, file=sys.stderr))
    print(f"{sum(r.role == 'server' for r in started)} server(s) started", file=sys.stderr)
    for name, error in failures:  # its cells are stored offline: the other devices go on
        print(f"could not bring up {name}: {error.message}", file=sys.stderr)


def _status(lab, as_json: bool) -> int:
    from farm.lab.monitor import HOST_COLUMNS, host_row

    lab.prune_dead_workers()  # whoever looks removes the long-dead workers' rows (lab.jobs.PRUNE_S)
    hosts, live = lab.hosts(), lab.live_workers()
    if as_json:
        emit_json({"hosts": hosts, "live_workers": live})
        return 0
    print_table([host_row(h) for h in hosts], list(HOST_COLUMNS))
    print(f"{live} live worker(s) in the lab")
    return 0
