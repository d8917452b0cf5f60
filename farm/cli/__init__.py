"""``farm VERB``: parse, call, print, exit. One module per verb (asv's ``commands/``), each with
``add_parser(subparsers, common)`` and ``run(args) -> int``; ``build_parser`` lists them in ``--help``'s order.

stdout carries results (tables, paths, --json); progress and logs go to stderr.
Exit codes: 0 success, 1 error (one ``error:`` line and a hint on stderr), 2 usage.
A verb ends on a failure by raising a FarmError: ``main`` prints it (``common.print_error``) and exits 1. A verb
catches one only to go on with the rest of its work (the other devices of ``farm compile`` or ``farm serve``);
the modules below the CLI that catch one, and why, are listed in tests/test_layers.py (CATCHERS).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from farm.errors import FarmError, message_line
from farm.tvm_private import import_tvm_without_torch

from farm.cli import (bench, compare, compile, copies, dashboard, demo, devices, down, drift, models, phones,
                      regressions, report, results, serve, sweep, tracker, tune, worker)
from farm.cli.common import Parser, default_db, keep_out_secrets, print_error

EPILOG = """\
examples:
  farm demo                               # private tracker + 2 local devices, built-in models, DB + HTML report
  farm tracker start && farm serve        # tracker and the inventory's local devices, in the background
  farm devices                            # inventory merged with the tracker's live view
  farm bench --device x86-local --model convnet --json
  farm report                             # HTML report of the latest run per device × model
  farm sweep --confirm                    # nightly: every device × model, regressions confirmed by rerun
  farm drift                              # slow drift: where each series' history changed level
  farm phones                             # Android phones the adb server sees (then kind = "android")
  farm serve --watch                      # bring devices up and restart any server that dies
  farm down                               # stop every server and the tracker farm started

environment: FARM_DEVICES (inventory), FARM_DB (results database: a file or postgresql://...),
             FARM_HOME (state: pid files, logs, artifact cache)
"""

# the verbs in the order `farm --help` lists them
VERBS = (tracker, serve, phones, down, devices, models, compile, bench, copies, tune, sweep, worker, regressions, drift,
         compare, dashboard, results, report, demo)


def _common_options() -> argparse.ArgumentParser:
    """The options every verb takes, before or after its name."""
    common = Parser(add_help=False)
    common.add_argument("--devices", default=argparse.SUPPRESS,
                        help="inventory file (env FARM_DEVICES, default ./devices.toml)")
    common.add_argument("--db", default=argparse.SUPPRESS,
                        help="results database: a file or postgresql://USER@HOST:PORT/DB (env FARM_DB, then [store] db "
                             "in the inventory, default .farm/results.db)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output on stdout")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log more to stderr")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common_options()
    parser = Parser(
        prog="farm", parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Benchmark ML models on a farm of devices through TVM RPC: compile, push, measure, store, report.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="VERB", required=True)
    for verb in VERBS:
        verb.add_parser(subparsers, common)
    return parser


def _inventory_db(path: str) -> str | None:
    """[store] db from the inventory, when it exists and reads; the verb reports a broken inventory itself."""
    from farm.inventory import load_inventory

    if not os.path.exists(path):
        return None
    try:
        return load_inventory(path).db
    except FarmError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    import_tvm_without_torch()  # seconds less for every command that imports TVM (tvm_private says why)
    args.devices_given = hasattr(args, "devices")
    args.devices = getattr(args, "devices", None) or os.environ.get("FARM_DEVICES", "devices.toml")
    args.db = getattr(args, "db", None) or os.environ.get("FARM_DB") or _inventory_db(args.devices) or default_db()
    args.json = getattr(args, "json", False)
    keep_out_secrets(args.db)  # before logging takes stderr: nothing printed carries the database's password
    verbose = getattr(args, "verbose", False)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not verbose:  # MetaSchedule logs every batch at INFO; farm prints its own progress
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    try:
        return args.func(args)
    except FarmError as exc:
        if verbose and exc.__cause__ is not None:  # what farm translated (TVM's trace, the database's error)
            traceback.print_exception(exc.__cause__, file=sys.stderr)
        print_error(exc.message, exc.hint)
        return 1
    except KeyboardInterrupt:
        print_error("interrupted")
        return 130
    except BrokenPipeError:  # `farm ... --json | head`: the reader left; not an error of farm's
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a farm bug: one line; the traceback with -v (everything measured is already stored)
        if verbose:
            traceback.print_exc(file=sys.stderr)
        print_error(f"unexpected {type(exc).__name__}: {message_line(exc)}",
                    "a farm bug or an untranslated library error: rerun with -v for the traceback and report it")
        return 1
