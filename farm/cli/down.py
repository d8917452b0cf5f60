"""farm down: stop every server, watchdog and tracker farm started."""

from __future__ import annotations

import argparse

from dataclasses import asdict

from farm.errors import FarmError

from farm.cli.common import add_verb, emit_json, home_dir

def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    add_verb(subparsers, common, "down", run, "stop every server and tracker farm started")


def run(args: argparse.Namespace) -> int:
    from farm.devices import stop_roles

    stopped, failed = stop_roles(home_dir(), ("watchdog", "server", "relay", "tracker"))
    if args.json:
        emit_json({"stopped": [asdict(r) for r in stopped], "failed": failed_json(failed)})
    else:
        print(f"stopped {len(stopped)} process(es) farm had started")
    raise_if_failed(failed)
    return 0


def failed_json(failed: list) -> list[dict]:
    return [{**asdict(r), "error": exc.message, "hint": exc.hint} for r, exc in failed]


def raise_if_failed(failed: list) -> None:
    """The first process that could not be stopped as the command's error (the others counted in it)."""
    if failed:
        record, exc = failed[0]
        others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise FarmError(f"could not stop {record.role} {record.name!r}{others}: {exc.message}", exc.hint)
