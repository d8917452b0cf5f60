"""Helpers shared by the CLI's verbs: the verb's parser, the error lines, paths, output formats, shared options."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time

from pathlib import Path
from typing import Any, Callable, NoReturn

from farm.errors import FarmError
from farm.stats import median, versus_text
from farm.records import CALIBRATION_METHODS, TRIAGE_STATES, VARIANTS, BenchConfig, ModelSource, Record, split_address


log = logging.getLogger("farm")


REPORT_DIR = "reports"  # where an HTML report goes unless the verb is told otherwise
MODEL_HELP = "built-in name (mlp, convnet), onnx:NAME, or a .onnx path"


def add_verb(subparsers, common: argparse.ArgumentParser, name: str, run: Callable[[argparse.Namespace], int],
             help_text: str, description: str = "") -> argparse.ArgumentParser:
    """The verb's parser, with the options every verb takes (``common``); ``main`` calls ``run(args)``."""
    p = subparsers.add_parser(name, parents=[common], help=help_text, description=description or help_text,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=run)
    return p


def print_error(message: str, hint: str = "") -> None:
    """The one way the CLI says what went wrong: an ``error:`` line and a ``hint:`` line on stderr."""
    print(f"error: {message}", file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)


def record_default(record: type, name: str) -> Any:
    """A record's field default, read from its dataclass: the CLI never types a default again."""
    field = next(f for f in dataclasses.fields(record) if f.name == name)
    assert field.default is not dataclasses.MISSING, f"{record.__name__}.{name} has no plain default"
    return field.default


def home_dir() -> Path:
    return Path(os.environ.get("FARM_HOME", ".farm"))


def default_db() -> str:
    return os.environ.get("FARM_DB", str(home_dir() / "results.db"))


def emit_json(data: Any) -> None:
    """``data`` as JSON on stdout: its outer two levels indented, each record below them on one line (a run, an
    alert, a finding: one line each, for grep; ``jq .`` indents it all). The lines are json's C encoder's: an
    indented dump takes its pure-Python one, 0.5 s for a night's 1,000 alerts."""
    sys.stdout.write(_json_layout(data, 0) + "\n")


def _json_layout(value: Any, depth: int) -> str:
    """A dict in the outer two levels one key a line, a list one item a line; anything else, and every list item, one
    line of its own."""
    if depth < 2 and (isinstance(value, Record) or (dataclasses.is_dataclass(value) and not isinstance(value, type))):
        value = _jsonable(value)
    pad = "  " * (depth + 1)
    if depth < 2 and isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
        items = ",\n".join(f"{pad}{json.dumps(k)}: {_json_layout(v, depth + 1)}" for k, v in value.items())
        return f"{{\n{items}\n{pad[:-2]}}}"
    if depth < 2 and isinstance(value, (list, tuple)) and value:
        items = ",\n".join(f"{pad}{_json_layout(v, 2)}" for v in value)
        return f"[\n{items}\n{pad[:-2]}]"
    return json.dumps(value, default=_jsonable, separators=(", ", ": "))


def _jsonable(value: Any) -> Any:
    """The read side's records (a run, a verdict, an alert; a summary inside a run) as JSON objects."""
    if isinstance(value, Record):
        return dict(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    if not rows:
        print("(none)")
        return
    cells = [[("" if row.get(c) is None else str(row.get(c))) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip())
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())


def progress_printer(enabled: bool):
    if not enabled:
        return None
    start = time.monotonic()

    def progress(device: str, model: str, step: str, detail: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] {device} · {model} · {step}: {detail}", file=sys.stderr, flush=True)
    return progress


def duration(value: float | None) -> str:
    from farm.stats import format_duration

    return "-" if value is None else format_duration(value)


def parse_shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for item in items:
        name, _, dims = item.partition("=")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(","))
            if not name or not shapes[name]:
                raise ValueError
        except ValueError as exc:
            raise FarmError(f"bad --shape {item!r}", "write --shape NAME=1,3,224,224") from exc
    return shapes


def load_with_variant(args):
    from farm.models import load_model, make_variant

    model = load_model(args.model, parse_shapes(args.shape))
    return make_variant(model, args.variant, args.calibration, args.calibration_data)




def add_variant_options(p: argparse.ArgumentParser) -> None:
    variant = record_default(ModelSource, "variant")
    g = p.add_argument_group("variants")
    g.add_argument("--variant", default=variant, choices=VARIANTS,
                   help=f"fp16: graph converted to float16; int8: static QDQ quantization (default {variant})")
    g.add_argument("--calibration", default=CALIBRATION_METHODS[0], choices=CALIBRATION_METHODS,
                   help=f"int8 calibration method (default {CALIBRATION_METHODS[0]})")
    g.add_argument("--calibration-data", help="folder of .npz input samples for int8 calibration (default: generated)")


def add_shape_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", action="append", default=[], help="bind an input shape: NAME=1,3,224,224 (repeatable)")


def load_inventory_of(args):
    from farm.inventory import load_inventory

    return load_inventory(args.devices)


def inventory_and_device(args):
    """The inventory ``--devices`` names and its device ``--device`` (InventoryError says what to write)."""
    from farm.inventory import find_device

    inventory = load_inventory_of(args)
    return inventory, find_device(inventory, args.device)


class Parser(argparse.ArgumentParser):
    """argparse with farm's error format: one ``error:`` line and a ``hint:`` line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        print_error(f"{self.prog}: {message}", f"see {self.prog} --help")
        raise SystemExit(2)


def _number(kind, low: float | None, low_open: bool, what: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from exc
        if low is not None and (value <= low if low_open else value < low) or value != value:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    parse.__name__ = what  # argparse names the type in its messages
    return parse


positive_int = _number(int, 0, True, "a whole number of at least 1")
count = _number(int, 0, False, "a whole number of at least 0")
positive_float = _number(float, 0.0, True, "a number above 0")
non_negative_float = _number(float, 0.0, False, "a number of at least 0")


_port_number = _number(int, 1, False, "a port (1-65535)")
_sweep_number = _number(int, 0, True, "a sweep id (a whole number from farm results --json)")


def port(text: str) -> int:
    value = _port_number(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1-65535)")
    return value


def address(text: str) -> str:
    """HOST:PORT, e.g. 127.0.0.1:9190."""
    if split_address(text) is None:
        host, sep, number = text.rpartition(":")
        why = f": {number!r} is not a port (1-65535)" if sep and host else " (e.g. 127.0.0.1:9190)"
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT{why}")
    return text


def sweep_id(text: str) -> int:
    """A sweep id (see farm results --json: sweep_id)."""
    return _sweep_number(text)


def sweep_or_latest(text: str) -> int | str:
    return "latest" if text == "latest" else sweep_id(text)


def triage(text: str) -> tuple[int, str]:
    """ID:STATE, a finding's id (farm regressions lists them) and its triage state."""
    number, sep, state = text.partition(":")
    if not sep or not number.isdigit() or int(number) < 1 or state not in TRIAGE_STATES:
        raise argparse.ArgumentTypeError(f"{text!r} is not ID:STATE (STATE one of {', '.join(TRIAGE_STATES)}; "
                                         "e.g. 12:acknowledged)")
    return int(number), state


def add_budget_option(p: argparse.ArgumentParser) -> None:
    from farm.records import DEFAULT_BUDGET_MIN  # not farm.analysis.findings: its import (scipy) is most of every command's

    p.add_argument("--confirm-budget", type=_number(float, 0.0, False, "a number of at least 0"),
                   default=DEFAULT_BUDGET_MIN, metavar="MIN",
                   help=f"device-minutes --confirm may spend, findings in rank order (default {DEFAULT_BUDGET_MIN:g})")


def byte_size(text: str) -> int:
    """An argparse type: 4096, 4K, 4KiB, 64M, 1G (powers of 1024)."""
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    clean = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        value = float(clean[:-1]) * units[clean[-1]] if clean and clean[-1] in units else float(clean)
    except ValueError:
        value = -1
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in bytes: write e.g. 4096, 4K, 64M")
    return int(value)


def add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action="store_true", default=sys.stderr.isatty(),
                   help="print each step to stderr (default: on when stderr is a terminal)")


# The measurement options: BenchConfig's field, its option and type, and help; each default is read from BenchConfig
BENCH_OPTIONS = (
    ("repeat", "--repeat", positive_int, "steady-state repeats kept raw (default {})"),
    ("number", "--number", positive_int, "calls averaged per repeat (default: calibrated so a repeat lasts --min-repeat-ms)"),
    ("min_repeat_ms", "--min-repeat-ms", non_negative_float, "minimum length of one repeat when calibrating (default {})"),
    ("timeout_s", "--timeout", positive_float, "seconds to wait for a free device (default {})"),
    ("rtol", "--rtol", non_negative_float, "relative tolerance of the output check (default {})"),
    ("atol", "--atol", non_negative_float, "absolute tolerance of the output check (default {})"),
)


def add_bench_options(p: argparse.ArgumentParser, profile: bool = False, profile_default: bool = False) -> None:
    """The measurement options; ``profile``: and --profile (``profile_default``: on unless --no-profile, a sweep's)."""
    defaults = BenchConfig()
    g = p.add_argument_group("measurement")
    for field, option, kind, help_text in BENCH_OPTIONS:
        default = getattr(defaults, field)
        g.add_argument(option, type=kind, default=default,
                       help=help_text if default is None else help_text.format(f"{default:g}"))
    if not profile:  # the verbs that measure cells (bench, sweep) offer it
        return
    g.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None if profile_default else False,
                   help="then where the time goes: each kernel of the model timed on the device, in runs of its own "
                        "after the timed ones (farm's servers; a stock TVM server's run is stored with the profile "
                        "'not available'), stored with the run: by op class, the top kernels, their sum against the "
                        "steady median" + (" (default: on; its runs take at most a share of each cell: "
                                           "docs/measurement.md)" if profile_default else ""))


def bench_config(args: argparse.Namespace) -> BenchConfig:
    """The measurement options as a BenchConfig (its other fields keep their defaults)."""
    return BenchConfig(**{field: getattr(args, option[2:].replace("-", "_")) for field, option, _, _ in BENCH_OPTIONS},
                       profile=bool(getattr(args, "profile", False)))


def require_db(path: str) -> None:
    from farm.store import exists

    if not exists(path):
        raise FarmError(f"no results database at {path}", "run `farm bench` or `farm demo` first, or pass --db PATH")


def tuning_sets(db_path: str, devices) -> dict:
    """Each device's tuning records from the store (none when there is no database yet)."""
    from farm.store import Store, exists

    if not exists(db_path):
        return {}
    from farm.sweep import tuning_set

    with Store(db_path) as store:
        return {d.name: tuning_set(store, d) for d in devices}


@contextlib.contextmanager
def graceful_interrupt(message: str):
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



def threads_label(threads: int | None) -> str:
    return "threads not known" if threads is None else f"{threads} thread{'s' if threads != 1 else ''}"


def reference_text(result, reference) -> str:
    """A TVM result's reference runtime run (a ``CellResult`` or None) beside it, threads stated: 'onnxruntime
    2.6 ms (TVM 3.1× slower, 2 threads each)'; its failure; or, without one, TVM's threads and why there is none
    ('on 2 threads · no reference runtime on this device ...', or --tvm-only). The one wording for bench, sweep, demo."""
    ref = reference.result if reference is not None else None
    if ref is None:
        said = result.context.get("reference_runtime", "")
        why = said if said.startswith("no reference") else "no reference runtime measured"
        return f"on {threads_label(result.threads)} · {why}"
    if ref.status != "ok":
        return f"{ref.runtime} {ref.status}" + (f" at {ref.failed_step}: {ref.reason}" if ref.failed_step else f": {ref.reason}")
    tvm_s = median(result.steady_samples_s) if result.status == "ok" else None
    ref_s = median(ref.steady_samples_s)
    versus = versus_text(tvm_s, ref_s, ref.runtime, result.threads, ref.threads)
    return f"{ref.runtime} {duration(ref_s)}" + (f" ({versus})" if versus else f" on {threads_label(ref.threads)}")


class _Redacting:
    """A text stream that writes the passwords of database URLs as ``***`` (``keep_out_secrets``): in any URL it
    writes, and ``secrets`` of ``store.locations.BARE_SECRET_CHARS`` or more wherever they stand; anything else goes to
    the stream."""

    def __init__(self, stream: Any, secrets: list[str]) -> None:
        from farm.store.locations import BARE_SECRET_CHARS

        self._stream, self._secrets = stream, [s for s in secrets if len(s) >= BARE_SECRET_CHARS]

    def write(self, text: str) -> int:
        from farm.store.locations import redact

        text = redact(text)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def keep_out_secrets(db: str) -> None:
    """Keep the database URL's password out of everything this command prints: stdout (tables, ``--json``, CSV) and
    stderr (``error:`` lines, logs, progress) write it as ``***`` (#62: ``?password=`` was printed by six verbs).
    A password on the command line still shows in ``ps``: docs/nightly-and-lab.md says to give it by PGPASSFILE,
    PGPASSWORD or a service file instead, which libpq reads and farm never sees."""
    from farm.store.locations import url_secrets

    secrets = url_secrets(db)
    if secrets and not isinstance(sys.stdout, _Redacting):
        sys.stdout, sys.stderr = _Redacting(sys.stdout, secrets), _Redacting(sys.stderr, secrets)
