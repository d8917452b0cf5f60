"""``farm VERB``: parse, call, print, exit. The only place that catches FarmError.

stdout carries results (tables, paths, --json); progress and logs go to stderr.
Exit codes: 0 success, 1 error (one ``error:`` line and a hint on stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from farm.errors import FarmError, message_line

from farm.cli.common import (Parser, add_bench_options, add_progress, add_variant_options, address, byte_size, count,
                             default_db, non_negative_float, port, positive_float, positive_int, sweep_id,
                             sweep_or_latest, triage, add_budget_option)
from farm.cli.lab import cmd_tracker, cmd_serve, cmd_down, cmd_devices, cmd_dashboard, cmd_phones
from farm.cli.measuring import cmd_models, cmd_compile, cmd_bench, cmd_copies, cmd_results, cmd_report, cmd_demo, cmd_compare
from farm.cli.tuning import cmd_tune
from farm.cli.sweeping import cmd_sweep, cmd_regressions, cmd_drift
from farm.drift import MIN_CHANGE, MIN_NIGHTS, MIN_SIZE, PENALTY
from farm.task_profile import DEFAULT_MIN_SHARE
from farm.regress import CONFIRM_ROUNDS, METHOD, METRICS
from farm.stats import MAD_TO_SD

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


_ROUNDS = f"{CONFIRM_ROUNDS[0]} rounds" + "".join(f", {n} in all if inconclusive" for n in CONFIRM_ROUNDS[1:])


def _thresholds_text() -> str:
    """The candidate thresholds of ``regress.METHOD``, one line per threshold, its metrics together."""
    groups: dict = {}
    for metric, limit in METHOD.thresholds.items():
        groups.setdefault(limit, []).append(metric)
    return "".join(f"  {', '.join(metrics)}: z ≥ {limit.z:g} and change ≥ +{limit.rel * 100:g} %\n"
                   for limit, metrics in groups.items())


def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument("--devices", default=argparse.SUPPRESS,
                        help="inventory file (env FARM_DEVICES, default ./devices.toml)")
    common.add_argument("--db", default=argparse.SUPPRESS,
                        help="results database: a file or postgresql://USER@HOST:PORT/DB (env FARM_DB, then [store] db "
                             "in the inventory, default .farm/results.db)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output on stdout")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log more to stderr")

    parser = Parser(
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
            "Runs `python -m farm.rpc.tracker_server` (TVM's tracker) in the background with a pid record and a log\n"
            "in $FARM_HOME.\n"
            "Binds 127.0.0.1 unless --host says otherwise: TVM RPC has no authentication.")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--host", help="address to bind (default: [tracker] host in devices.toml, else 127.0.0.1)")
    p.add_argument("--port", type=port, help="port (default: [tracker] port in devices.toml, else 9190)")

    from farm.devices import kinds

    p = add("serve", cmd_serve, "bring the inventory's devices onto the tracker (servers, proxies, phones, boards)",
            "Per device kind:\n" + "".join(f"  {k.name} → {k.serve_help}\n" for k in kinds().values()) +
            "Each runs in its own process group with a pid record; farm waits until the tracker lists them.\n"
            "--watch then stays in the foreground and restarts any of them that dies (Ctrl-C or `farm down` ends it).")
    p.add_argument("--device", action="append", help="only this device (repeatable)")
    p.add_argument("--tracker", type=address, help="HOST:PORT of the tracker (default: [tracker] in devices.toml)")
    p.add_argument("--wait", type=non_negative_float, default=60.0, help="seconds to wait for registration (default 60)")
    p.add_argument("--stop", action="store_true", help="stop the servers farm started instead")
    p.add_argument("--watch", action="store_true", help="stay and restart servers that die (a watchdog)")
    p.add_argument("--interval", type=positive_float, default=2.0, help="--watch: seconds between checks (default 2)")

    p = add("phones", cmd_phones, "Android phones the adb server sees: serial, model, ABI, SoC, OpenCL, battery",
            "Asks the adb server (--adb, default 127.0.0.1:$ANDROID_ADB_SERVER_PORT or 5037) for its devices and\n"
            "reads each one's properties over adb. Put a phone's serial into devices.toml (kind = \"android\").")
    p.add_argument("--adb", type=address, help="HOST:PORT of the adb server")

    add("down", cmd_down, "stop every server and tracker farm started")

    p = add("devices", cmd_devices, "inventory merged with the tracker's live summary; --probe checks each device",
            "Each device's state: online (a free server), busy (servers, none free), missing (no server).\n"
            "--probe opens a no-op session on every device at once (bounded by --timeout): online, busy,\n"
            "missing or unreachable with the reason and when it was last seen online; probes are stored.\n"
            "--kinds lists the device kinds instead (no tracker needed): their fields and what this host lacks.\n\n"
            "Device kinds (kind = ... in devices.toml):\n" +
            "".join(f"  {k.name}: {k.summary}" + (f" [fields: {', '.join(k.fields)}]" if k.fields else "") + "\n"
                    for k in kinds().values()))
    p.add_argument("--probe", action="store_true", help="health-check every device with a no-op session")
    p.add_argument("--timeout", type=positive_float, default=3.0, help="seconds per probe (default 3)")
    p.add_argument("--kinds", action="store_true", help="list the device kinds: summary, fields, what this host lacks")

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
    add_variant_options(p)

    p = add("bench", cmd_bench, "compile, push, measure, check and store one model on one device",
            "Steps: session, upload, load, first run, steady state (time_evaluator, raw repeats),\n"
            "device→host copy per output, output check. A failed step is stored with its reason;\n"
            "the command then prints `error:` and exits 1.\n\n"
            "Then the same model in the runtime users would otherwise ship, with the same inputs, warm-up\n"
            "and repeat statistics (onnxruntime for ONNX, LiteRT for TFLite, torch for torch.export; wall\n"
            "time per call, intra-op threads = the target's num-cores), stored as that runtime's run:\n"
            "  TVM 8.1 ms · onnxruntime 2.6 ms (TVM 3.1× slower)\n"
            "It runs only where the device's code runs on this host (local, opencl's host CPU); elsewhere\n"
            "farm says 'no reference runtime on this device', never a host figure as the device's.")
    p.add_argument("--device", required=True, help="inventory device name")
    p.add_argument("--model", required=True, help="built-in name (mlp, convnet), onnx:NAME, or a .onnx path")
    p.add_argument("--shape", action="append", default=[], help="bind an input shape: NAME=1,3,224,224 (repeatable)")
    p.add_argument("--reference", help="expected outputs instead of onnxruntime's: a .npz (np.savez order), or a "
                   "test_data_set folder (input_N.pb + output_N.pb: its inputs are used too). Default for an ONNX file "
                   "with a test_data_set_0 folder beside it: that folder")
    p.add_argument("--untuned", action="store_true", help="ignore the store's tuning records for this device")
    p.add_argument("--tvm-only", action="store_true", help="do not time the reference runtime beside TVM")
    add_variant_options(p)
    add_progress(p)
    add_bench_options(p)

    p = add("copies", cmd_copies, "copy curve of a GPU device: device→host and host→device time against size",
            "Times copies of 4 KiB … 64 MiB in both directions on the device (TVM's remote time evaluator around\n"
            "runtime.TVMTensorCopyFromTo: no network in the figure) and stores every raw sample. Answers\n"
            "\"is get_output eating my GPU gain?\" with a number; the report plots it (µs and GB/s per size).\n"
            "On OpenCL the CPU's clock times them (TVM's OpenCL copies block; its timer sees only kernels).\n\n"
            "  farm copies --device pocl-gpu\n"
            "  farm copies --device pocl-gpu --size 4K --size 1M --size 64M --json")
    p.add_argument("--device", required=True, help="inventory device name (a GPU target)")
    p.add_argument("--size", action="append", type=byte_size, help="copy size, e.g. 4K, 1M, 64M (repeatable; "
                   "default 4 KiB … 64 MiB, ×4)")
    add_progress(p)
    add_bench_options(p)

    p = add("tune", cmd_tune, "search faster schedules on a device with MetaSchedule (XGBoost cost model)",
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
    p.add_argument("--device", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--shape", action="append", default=[], help="bind an input shape: NAME=1,3,224,224 (repeatable)")
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

    p = add("sweep", cmd_sweep, "measure every device × model in parallel (one worker per device), resumable",
            "Compiles each artifact once (cached, with tuning records) while the devices measure, one\n"
            "worker per device; a dropped session is retried; a failed cell is stored with its reason.\n"
            "A reference model runs first on every device in every sweep, so device drift can be told\n"
            "from model regressions. After a crash: farm sweep --resume finishes only the missing cells.\n\n"
            "  farm sweep                                   # every device × the built-in models\n"
            "  farm sweep --device x86-local --model convnet --model my.onnx\n"
            "  farm sweep --file nightly.toml               # devices = [...], models = [...], [bench] repeat = 30\n"
            "  farm sweep --resume                          # the latest sweep (or --resume ID)\n"
            "  farm sweep --resume --if-incomplete          # only if it never finished (cron: after a reboot)\n\n"
            "A device with no server on the tracker when the sweep starts has its cells stored 'offline' at\n"
            "once (no wait, no retry spent); farm sweep --resume ID measures them once it is up.")
    p.add_argument("--device", action="append", help="a device (repeatable; default: every inventory device)")
    p.add_argument("--model", action="append", help="a model (repeatable; default: the built-in zoo)")
    p.add_argument("--file", help="sweep file (TOML: devices, models, variants, reference, [bench], [shapes.MODEL])")
    p.add_argument("--reference", default=None, help="reference model run on every device first (default mlp; none to skip)")
    p.add_argument("--retries", type=count, default=1, help="retries of a cell whose session dropped (default 1)")
    p.add_argument("--variant", action="append", choices=["fp32", "fp16", "int8"],
                   help="a variant axis (repeatable; default fp32); int8 is calibrated with min-max")
    p.add_argument("--untuned", action="store_true", help="ignore the store's tuning records")
    p.add_argument("--tvm-only", action="store_true",
                   help="do not time each cell's model in its reference runtime (onnxruntime …) beside TVM")
    p.add_argument("--resume", nargs="?", const="latest", type=sweep_or_latest,
                   help="finish a crashed sweep (default: the latest)")
    p.add_argument("--if-incomplete", action="store_true",
                   help="with --resume: do nothing (exit 0) unless that sweep never finished or is incomplete")
    p.add_argument("--report-dir", default="reports", help="where the HTML report goes (default reports/)")
    p.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    p.add_argument("--confirm", action="store_true", help=f"confirm regression candidates by interleaved reruns ({_ROUNDS})")
    add_budget_option(p)
    add_progress(p)
    add_bench_options(p)

    p = add("regressions", cmd_regressions, "judge a sweep against the nightly baseline; confirm candidates",
            f"For every series (model × device × tuned, per metric: {', '.join(METRICS)}) of the sweep\n"
            f"(default: the latest), the baseline is the last {METHOD.baseline_n} accepted nightly medians (at least "
            f"{METHOD.baseline_min}): centre\ntheir median, spread {MAD_TO_SD:g}·MAD (at least {METHOD.spread_floor * 100:g} % "
            "of the centre). Candidates pass a robust z and a\nrelative change (generous; improvements the same, "
            f"negative):\n{_thresholds_text()}"
            "--confirm reruns old and new artifacts on the device in rounds (a fresh load of both per round, run\n"
            f"interleaved: {_ROUNDS}) and needs Wilcoxon p < {METHOD.p_confirm:g} over the rounds\n"
            "(strict). Alerts are stored with method, parameters, baseline and confirmation, so every verdict\n"
            "can be reproduced.\n\n"
            "Alerts are grouped into findings, printed first, best first: an upgrade (the runs' TVM, pipeline or\n"
            "target changed: its new nights compared with the old context's last nights, unconfirmable by rounds,\n"
            "the reference runtime as control), changed tuning records, several models across the sweep, a model\n"
            "across devices, a device across models, a single series. --confirm reruns a few representatives of\n"
            "each finding within --confirm-budget device-minutes. Findings keep a triage state across nights:\n\n"
            "  farm regressions --triage 12:acknowledged     # or expected, fixed, new\n"
            "  farm regressions --fail-on new               # CI: exit 1 on a new (untriaged) confirmed finding")
    p.add_argument("--sweep", type=sweep_id, help="sweep id (default: the latest)")
    p.add_argument("--confirm", action="store_true",
                   help=f"rerun findings' representatives, old and new artifacts interleaved on the device ({_ROUNDS})")
    add_budget_option(p)
    p.add_argument("--triage", action="append", type=triage, default=[], metavar="ID:STATE",
                   help="set a finding's triage state: new, acknowledged, expected or fixed (repeatable)")
    p.add_argument("--fail-on", choices=["new", "new-any"],
                   help="exit 1 when a finding in triage state new exists: confirmed (new) or any the reruns did not "
                        "reject (new-any: upgrades cannot be confirmed)")
    add_progress(p)
    add_bench_options(p)

    p = add("drift", cmd_drift, "slow drift: where each series' nightly history changed level (change points)",
            "Segments every series' whole sweep history (one accepted value per sweep) with PELT's objective\n"
            f"(L2 cost on log values, penalty {PENALTY:g}·σ²·ln n with σ the series' own night-to-night noise, "
            f"≥ {MIN_SIZE} sweeps\nper segment, shifts under {MIN_CHANGE * 100:g} % merged). Catches a creep that no "
            f"single night's z-score flags.\nNeeds ≥ {MIN_NIGHTS} sweeps per series.")
    p.add_argument("--metric", choices=list(METRICS), default="steady")
    p.add_argument("--device", help="only this device")
    p.add_argument("--model", help="only this model")
    p.add_argument("--all", action="store_true", help="list series without change points too")

    p = add("compare", cmd_compare, "compare two runs' raw samples (Mann-Whitney U, Kolmogorov-Smirnov)")
    p.add_argument("run_a", type=positive_int, help="a run id (farm results: run_id)")
    p.add_argument("run_b", type=positive_int, help="another run id")

    p = add("dashboard", cmd_dashboard, "a live, read-only web view: devices, running sweep, results, alerts",
            "Serves a small page (tornado) that refreshes every 5 s from the tracker and the results\n"
            "database, opened read-only. Binds 127.0.0.1 unless --host says otherwise.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port, default=8090)

    p = add("results", cmd_results, "list stored runs with computed summaries (--json, --csv)")
    p.add_argument("--device")
    p.add_argument("--model")
    p.add_argument("--latest", action="store_true", help="only the latest run per device × model")
    p.add_argument("--csv", action="store_true", help="CSV on stdout")

    p = add("report", cmd_report, "write a self-contained HTML report of the results")
    p.add_argument("--out", help="output file (default reports/report-TIMESTAMP.html)")
    p.add_argument("--title", default="farm report")
    p.add_argument("--sweep", type=sweep_id, help="add that sweep's review (alerts with evidence, heatmap, data quality, "
                   "drift), as `farm sweep` writes it")

    p = add("demo", cmd_demo, "the main job on an embedded default: private tracker, 2 local devices, built-in models",
            "Needs no inventory. Starts a tracker and two local rpc_servers on free loopback ports,\n"
            "benchmarks the built-in models on both, writes the DB and an HTML report, prints where they\n"
            "are, and stops everything it started.")
    p.add_argument("--models", default="mlp,convnet", help="comma-separated models (default mlp,convnet)")
    p.add_argument("--report-dir", default="reports", help="where the HTML report goes (default reports/)")
    add_progress(p)
    add_bench_options(p)
    return parser


def _inventory_db(path: str) -> str | None:
    """[store] db from the inventory, when it exists and reads; the verb reports a broken inventory itself."""
    from farm.errors import FarmError as _Error
    from farm.inventory import load_inventory

    if not os.path.exists(path):
        return None
    try:
        return load_inventory(path).db
    except _Error:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.devices_given = hasattr(args, "devices")
    args.devices = getattr(args, "devices", None) or os.environ.get("FARM_DEVICES", "devices.toml")
    args.db = getattr(args, "db", None) or os.environ.get("FARM_DB") or _inventory_db(args.devices) or default_db()
    args.json = getattr(args, "json", False)
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
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `farm ... --json | head`: the reader left; not an error of farm's
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a farm bug: one line; the traceback with -v (everything measured is already stored)
        if verbose:
            traceback.print_exc(file=sys.stderr)
        print(f"error: unexpected {type(exc).__name__}: {message_line(exc)}", file=sys.stderr)
        print("hint: a farm bug or an untranslated library error: rerun with -v for the traceback and report it",
              file=sys.stderr)
        return 1

