"""farm down: stop every server, watchdog and tracker farm started."""

from __future__ import annotations

import argparse

from dataclasses import asdict
from pathlib import Path

from farm.errors import FarmError

from farm.cli.common import add_verb, emit_json, home_dir

WATCHDOG_GRACE_S = 30.0  # a watchdog ends after the restart it is making (an adb push, a server start)


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    add_verb(subparsers, common, "down", run, "stop every server and tracker farm started")


def run(args: argparse.Namespace) -> int:
    stopped, failed = stop_roles(home_dir(), ("watchdog", "server", "relay", "tracker"))
    if args.json:
        emit_json({"stopped": [asdict(r) for r in stopped], "failed": failed_json(failed)})
    else:
        print(f"stopped {len(stopped)} process(es) farm had started")
    raise_if_failed(failed)
    return 0


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


def failed_json(failed: list) -> list[dict]:
    return [{**asdict(r), "error": exc.message, "hint": exc.hint} for r, exc in failed]


def raise_if_failed(failed: list) -> None:
    """The first process that could not be stopped as the command's error (the others counted in it)."""
    if failed:
        record, exc = failed[0]
        others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise FarmError(f"could not stop {record.role} {record.name!r}{others}: {exc.message}", exc.hint)
