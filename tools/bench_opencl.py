#!/usr/bin/env python3
"""The GPU path in one run: a conv net on this host's OpenCL device (POCL here), untuned and tuned.

Starts a private tracker and farm's GPU server with TVM's OpenCL runtime (the ``opencl`` device kind),
then, on the same device, in one run:
  1. untuned (TVM's default GPU schedules): cold first run (driver kernel cache cleared), warm first
     run (second load), steady kernel time (TVM's time_evaluator on OpenCL) and wall time per call,
     copies of the outputs and their share of one run;
  2. farm tune within the stated budget (trials and minutes), then the same figures tuned, checked
     against onnxruntime;
  3. the copy curve: device→host and host→device time and bandwidth from 4 KiB to 64 MiB.
The last lines state the budget used and what else was measured.

    .venv/bin/python tools/bench_opencl.py [--model convnet] [--trials 128] [--minutes 10]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from farm.devices import bring_up
from farm.devices.opencl_runtime import runtime_available
from farm.inventory import parse_inventory
from farm.measure import measure_copy_curve
from farm.models import load_model
from farm.records import BenchConfig, TrackerAddress
from farm.procs.supervise import free_port, stop_process
from farm.rpc.launch import start_tracker
from farm.rpc.tracker import wait_for_servers
from farm.stats import summarize
from farm.store import Store
from farm.sweep import bench_cell
from farm.tune import TuneConfig, tune_model


def ms(seconds: float | None) -> str:
    return "      -   " if seconds is None else f"{seconds * 1e3:9.3f} ms"


def describe(label: str, cell) -> float | None:
    r = cell.result
    if r.status != "ok":
        print(f"{label}: failed at {r.failed_step}: {r.reason}", file=sys.stderr)
        return None
    kernel = summarize(r.steady_samples_s).median
    wall = summarize(r.steady_wall_samples_s).median if r.steady_wall_samples_s else None
    copies = sum(summarize(c.samples_s).median for c in r.copies)
    print(f"{label}:")
    print(f"  first run cold   {ms(r.first_run_s)}   (kernel cache: {r.context.get('kernel_cache')})")
    print(f"  first run warm   {ms(r.first_run_warm_s)}   (second load of the same artifact)")
    print(f"  steady kernel    {ms(kernel)}   (sum of kernel event times, {len(r.steady_samples_s)} × {r.steady_number})")
    print(f"  steady wall      {ms(wall)}   (per call + sync, {len(r.steady_wall_samples_s)} × {r.steady_wall_number})")
    print(f"  output copies    {ms(copies)}   = {copies / (wall or kernel):.1%} of one run (wall)")
    print(f"  check            {r.check.status} (max abs error {r.check.max_abs_err:.2g} vs {r.check.reference})",
          flush=True)
    return wall or kernel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="convnet")
    parser.add_argument("--trials", type=int, default=128)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--work", default=None, help="keep the store, cache and logs here (default: a temp dir)")
    args = parser.parse_args()
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)  # per-batch tables: --progress shows them
    if not runtime_available():
        print("error: no OpenCL device here\nhint: bash tools/setup.sh --opencl", file=sys.stderr)
        return 1

    work = Path(args.work or tempfile.mkdtemp(prefix="farm-bench-opencl-"))
    model = load_model(args.model)
    port = free_port()
    tracker = TrackerAddress("127.0.0.1", port)
    inventory = parse_inventory(f'[devices.bench-opencl]\nkind = "opencl"\nkey = "bench-opencl-{port}"\n'
                                'target = { kind = "opencl" }\n')
    device = inventory.devices["bench-opencl"]
    config = BenchConfig(repeat=15, min_repeat_ms=100, timeout_s=60)
    started = []
    try:
        started.append(start_tracker(tracker.host, port, work))
        started.extend(bring_up(device, tracker, work))
        wait_for_servers(tracker, {device.key: 1}, timeout_s=120)
        with Store(work / "results.db") as store:
            untuned = describe(f"{model.name}, untuned (default GPU schedules)",
                               bench_cell(tracker, device, model, store, work / "cache", config, tuned=False))
            start = time.monotonic()
            outcome = tune_model(tracker, device, model, store, work / "tune",
                                 TuneConfig(trials=args.trials, minutes=args.minutes),
                                 progress=lambda m: print(m, file=sys.stderr, flush=True))
            tune_min = (time.monotonic() - start) / 60
            tuned = describe(f"{model.name}, tuned", bench_cell(tracker, device, model, store, work / "cache", config))
            curve = measure_copy_curve(tracker, device, "opencl", config)
        print(f"copy curve ({curve.context['clock']}):")
        for point in curve.points:
            median = summarize(point.samples_s).median
            print(f"  {point.direction} {point.nbytes:>9} B  {median * 1e6:10.1f} µs  {point.nbytes / median / 1e9:6.2f} GB/s")
        if untuned and tuned:
            print(f"tuned vs untuned (wall per call): {untuned / tuned:.2f}× faster")
        tasks = sum(1 for t in outcome.tasks if t.trials)
        print(f"budget: --trials {args.trials} --minutes {args.minutes:g}; used {outcome.trials_done} trials on "
              f"{tasks}/{len(outcome.tasks)} tasks in {tune_min:.1f} min ({outcome.status})")
        print(f"device: TVM's OpenCL runtime on {os.uname().nodename}'s OpenCL platform (POCL on this CPU: "
              "timings are POCL's, not a GPU's); host: {} cores".format(os.cpu_count()))
    finally:
        for record in reversed(started):
            stop_process(record)
    return 0 if untuned and tuned else 1


if __name__ == "__main__":
    sys.exit(main())
