"""farm tune: search faster schedules on a device with MetaSchedule. The handler is farm/cli/tuning.py's cmd_tune
(to move here once farm/tune is a package)."""

from __future__ import annotations

import argparse

from farm.task_profile import DEFAULT_MIN_SHARE

from farm.cli.common import (add_bench_options, add_progress, add_shape_option, add_verb, count, non_negative_float,
                             positive_float, positive_int)
from farm.cli.tuning import cmd_tune as run

DESCRIPTION = (
    "Extracts the model's tasks, tunes them on the device through the tracker (candidates built\n"
    "for its target, measured on it), and keeps every record in the results database: bench,\n"
    "compile and sweep then use the best records for that device's target automatically.\n"
    "Ctrl-C or a lost device keeps what was measured; the same command again continues.\n"
    "Sessions build on each other: the XGBoost cost model is saved with the records of the\n"
    "device's target and the next session starts from it (--fresh-cost-model to start blank).\n"
    "Several servers under the device's key measure candidates at once (--max-runners K).\n"
    "On a device that is not this host's CPU, candidates are built while the device measures\n"
    "(--builds-ahead; on this host's CPU a batch is built first, so compiles do not slow its runs).\n"
    "Trials go where the time is: each task is first timed untuned on the device, and the budget\n"
    "is shared by its share of the model's time (tasks under --min-share get none).\n"
    "--export writes a pack (MetaSchedule's JSON database, the cost model as plain arrays, a\n"
    "manifest with target and TVM version); --import refuses a pack for another target or TVM.\n\n"
    "  farm tune --device x86-local --model convnet --trials 256 --report\n"
    "  farm tune --device x86-local --model convnet --trials 256 --max-runners 4\n"
    "  farm tune --device x86-local --model convnet --trials 0 --export shared-records/")


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    # the defaults below are TuneConfig's (farm/tune.py), copied: importing farm.tune imports TVM, seconds for --help
    p = add_verb(subparsers, common, "tune", run,
                 "search faster schedules on a device with MetaSchedule (XGBoost cost model)", DESCRIPTION)
    p.add_argument("--device", required=True)
    p.add_argument("--model", required=True)
    add_shape_option(p)
    p.add_argument("--trials", type=count, default=64, help="trials this session (default 64; 0 = no tuning)")
    p.add_argument("--per-task", type=positive_int, default=None, help="at most this many trials per task")
    p.add_argument("--minutes", type=positive_float, default=None, help="stop after this many minutes")
    p.add_argument("--tasks", help="only tasks whose name contains this (see --list-tasks)")
    p.add_argument("--list-tasks", action="store_true", help="print the model's tuning tasks and exit")
    p.add_argument("--runner-timeout", type=positive_float, default=None,
                   help="seconds per candidate on the device (default: the device's runner_timeout_s, else 60)")
    p.add_argument("--report", action="store_true", help="then bench untuned vs tuned on the device and print both")
    p.add_argument("--export", dest="export_dir", help="write the records as MetaSchedule JSON database files to DIR")
    p.add_argument("--import", dest="import_dir", help="merge MetaSchedule JSON database files from DIR first")
    p.add_argument("--max-runners", type=positive_int, default=1,
                   help="measure up to K candidates at once, each on its own server of the key (default 1; each "
                        "runner is a process of ~300 MB)")
    p.add_argument("--fresh-cost-model", action="store_true",
                   help="do not start from the cost model earlier sessions saved for this target")
    p.add_argument("--min-share", type=non_negative_float, default=DEFAULT_MIN_SHARE,
                   help="tasks below this share of the model's untuned time get no search (default "
                        f"{DEFAULT_MIN_SHARE:g}, i.e. {DEFAULT_MIN_SHARE * 100:g}%%); the share is measured on the device first")
    p.add_argument("--candidate-cooldown", type=non_negative_float, default=0.0, metavar="S",
                   help="the device rests S seconds after each candidate, its session held (phones that must cool "
                        "between measurements; default 0)")
    p.add_argument("--no-profile", action="store_true",
                   help="do not time the tasks first: MetaSchedule's own scheduler shares the trials over every task")
    p.add_argument("--builds-ahead", action=argparse.BooleanOptionalAction, default=None,
                   help="build candidates while the device measures earlier ones (default: yes, unless the device "
                        "measures on this host's CPU: local, opencl, qemu)")
    add_progress(p)
    add_bench_options(p)
