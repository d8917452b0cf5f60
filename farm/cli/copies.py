"""farm copies: a GPU device's copy curve, device→host and host→device time against size."""

from __future__ import annotations

import argparse

from typing import Any

from farm.errors import FarmError
from farm.stats import gb_per_s, nonempty_median

from farm.cli.common import (add_bench_options, add_progress, add_verb, bench_config, byte_size, duration, emit_json,
                             inventory_and_device, print_table, progress_printer)


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "copies", run,
                 "copy curve of a GPU device: device→host and host→device time against size",
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


def run(args: argparse.Namespace) -> int:
    from farm.compile import effective_target
    from farm.measure import COPY_CURVE_BYTES, measure_copy_curve
    from farm.records import target_kind
    from farm.store import Store

    inventory, device = inventory_and_device(args)
    sizes = tuple(args.size) if args.size else COPY_CURVE_BYTES
    curve = measure_copy_curve(inventory.tracker, device, target_kind(effective_target(device)), bench_config(args), sizes,
                               progress=progress_printer(args.progress))
    with Store(args.db) as store:
        curve_id = store.record_copy_curve(curve)
    points: list[dict[str, Any]] = [
        {"direction": p.direction, "bytes": p.nbytes, "number": p.number, "median_s": median_s,
         "gb_per_s": gb_per_s(p.nbytes, median_s), "samples_s": list(p.samples_s)}
        for p in curve.points for median_s in [nonempty_median(p.samples_s)]]
    if args.json:
        emit_json({"curve_id": curve_id, "device": curve.device, "device_type": curve.device_type,
                   "status": curve.status, "reason": curve.reason, "clock": curve.context.get("clock"), "points": points})
    else:
        print(f"copy curve {curve_id}: {curve.device} ({curve.device_type}), {curve.context.get('clock')}")
        print_table([{**p, "median": duration(p["median_s"]), "GB/s": f"{p['gb_per_s']:.2f}"} for p in points],
                    ["direction", "bytes", "median", "GB/s", "number"])
    if curve.status != "ok":
        raise FarmError(curve.reason, f"what was measured before the failure is stored as copy curve {curve_id}")
    return 0



