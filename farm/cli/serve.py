"""farm serve: bring the inventory's devices onto the tracker; --watch restarts what dies."""

from __future__ import annotations

import argparse
import sys
import time

from pathlib import Path

from farm.errors import FarmError

from farm.cli.common import (add_verb, address, emit_json, home_dir, load_inventory_of, non_negative_float, positive_float,
                             print_error, print_table)


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    from farm.devices import kinds

    p = add_verb(subparsers, common, "serve", run,
                 "bring the inventory's devices onto the tracker (servers, proxies, phones, boards)",
                 "Per device kind:\n" + "".join(f"  {k.name} → {k.serve_help}\n" for k in kinds().values()) +
                 "Each runs in its own process group with a pid record; farm waits until the tracker lists them.\n"
                 "--watch then stays in the foreground and restarts any of them that dies (Ctrl-C or `farm down` ends it).")
    p.add_argument("--device", action="append", help="only this device (repeatable)")
    p.add_argument("--tracker", type=address, help="HOST:PORT of the tracker (default: [tracker] in devices.toml)")
    p.add_argument("--wait", type=non_negative_float, default=60.0, help="seconds to wait for registration (default 60)")
    p.add_argument("--stop", action="store_true", help="stop the servers farm started instead")
    p.add_argument("--watch", action="store_true", help="stay and restart servers that die (a watchdog)")
    p.add_argument("--interval", type=positive_float, default=2.0, help="--watch: seconds between checks (default 2)")


def run(args: argparse.Namespace) -> int:
    from farm.devices import bring_up_devices, can_bring_up
    from farm.inventory import find_device
    from farm.records import TrackerAddress, split_address
    from farm.rpc.tracker import query_summary

    if args.stop:
        return _stop(args.json)
    inventory = load_inventory_of(args)
    tracker = inventory.tracker
    if args.tracker and (given := split_address(args.tracker)):  # argparse's `address` type checked it
        tracker = TrackerAddress(*given)
    query_summary(tracker)  # fail early and clearly when there is no tracker
    names = [find_device(inventory, n).name for n in args.device] if args.device else \
        [n for n, d in inventory.devices.items() if can_bring_up(d)]
    started, records, failures = bring_up_devices(inventory, names, tracker, home_dir(), args.wait,
                                                  lambda note: print(note, file=sys.stderr))
    rows = [{"device": r.name, "key": r.key, "pid": r.pid, "port": r.port, "log": r.log_path}
            for r in records if r.role == "server"]
    if args.json:
        emit_json({"tracker": str(tracker), "servers": rows,
                   "failed": [{"device": n, "error": e.message, "hint": e.hint} for n, e in failures]})
    else:
        print(f"{sum(r.role == 'server' for r in started)} server(s) started, {len(rows)} running, registered with "
              f"{tracker}")
        print_table(rows, ["device", "key", "pid", "port", "log"])
    if failures:
        name, error = failures[0]
        others = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        failed = FarmError(f"could not bring up {name!r}{others}: {error.message}", error.hint)
        if not args.watch:
            raise failed
        print_error(failed.message, failed.hint)  # the watch goes on: it restarts what it can
    if args.watch:
        _watch({n: find_device(inventory, n) for n in names}, tracker, home_dir(), args.interval)
    return 0


def _stop(as_json: bool) -> int:
    """--stop: the watchdog, then the servers farm started (``farm down`` stops the tracker too)."""
    from farm.cli.down import failed_json, raise_if_failed
    from farm.devices import stop_roles

    stopped, failed = stop_roles(home_dir(), ("watchdog", "server", "relay"))
    if as_json:
        emit_json({"stopped_servers": [r.pid for r in stopped if r.role == "server"], "failed": failed_json(failed)})
    else:
        print(f"stopped {sum(r.role == 'server' for r in stopped)} server(s)")
    raise_if_failed(failed)
    return 0


def _watch(devices, tracker, state: Path, interval_s: float) -> None:
    """The watchdog: restart what dies until SIGTERM/SIGINT; recorded so `farm down` can end it."""
    import signal
    import threading

    from farm.devices import watch
    from farm.procs.registry import update_records
    from farm.procs.supervise import own_record

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    me = own_record("watchdog", "--watch")
    update_records(state, lambda current: current + [me])
    print(f"watching {len(devices)} device(s) every {interval_s:g} s; `farm down` or Ctrl-C ends the watch",
          file=sys.stderr, flush=True)
    try:
        watch(devices, tracker, state, interval_s, stop,
              on_event=lambda text: print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True))
    finally:
        update_records(state, lambda current: [r for r in current if r != me])
