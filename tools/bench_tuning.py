#!/usr/bin/env python3
"""How much does `farm tune` buy on this host? One conv net, one run, three figures.

Starts a private tracker and one local rpc_server, then measures the same model:
  1. onnxruntime on the CPU (the reference a user would otherwise ship),
  2. TVM untuned (farm bench --untuned),
  3. TVM tuned by farm tune within the stated budget (trials and minutes), then farm bench.
Prints the latencies and the ratios; the last lines state the budget used.

    .venv/bin/python tools/bench_tuning.py [--model onnx:squeezenet] [--trials 800] [--minutes 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from farm.models import load_model, make_inputs
from farm.records import BenchConfig, Device
from farm.rpc.processes import private_farm
from farm.store import Store
from farm.sweep import bench_cell
from farm.tune import TuneConfig, tune_model


def onnxruntime_median(model, repeat: int = 30) -> float:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    session = onnxruntime.InferenceSession(model.data, options, providers=["CPUExecutionProvider"])
    inputs = make_inputs(model)
    for _ in range(3):
        session.run(None, inputs)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        session.run(None, inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="onnx:squeezenet")
    parser.add_argument("--trials", type=int, default=800)
    parser.add_argument("--per-task", type=int, default=None)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--work", default=None, help="keep the store and cache here (default: a temp dir)")
    args = parser.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="farm-bench-tuning-"))
    model = load_model(args.model)
    device = Device("bench-cpu", "local", "bench-tuning-cpu", {"kind": "llvm"})
    config = BenchConfig(repeat=15, min_repeat_ms=100, timeout_s=60)
    with private_farm(work, {device.name: device.key}) as tracker:
        ort = onnxruntime_median(model)
        print(f"onnxruntime:  {ort * 1e3:9.2f} ms", flush=True)
        with Store(work / "results.db") as store:
            untuned = bench_cell(tracker, device, model, store, work / "cache", config, tuned=False)
            if untuned.result.status != "ok":
                print(f"untuned bench failed: {untuned.result.reason}", file=sys.stderr)
                return 1
            untuned_s = float(np.median(untuned.result.steady_samples_s))
            print(f"TVM untuned:  {untuned_s * 1e3:9.2f} ms", flush=True)
            start = time.monotonic()
            outcome = tune_model(tracker, device, model, store, work / "tune",
                                 TuneConfig(trials=args.trials, per_task=args.per_task, minutes=args.minutes),
                                 progress=lambda m: print(m, file=sys.stderr, flush=True))
            tune_min = (time.monotonic() - start) / 60
            tuned = bench_cell(tracker, device, model, store, work / "cache", config, tuned=True)
            if tuned.result.status != "ok":
                print(f"tuned bench failed: {tuned.result.reason}", file=sys.stderr)
                return 1
            tuned_s = float(np.median(tuned.result.steady_samples_s))
        print(f"TVM tuned:    {tuned_s * 1e3:9.2f} ms  ({tuned.artifact.tuned_tasks}/{tuned.artifact.total_tasks} tasks tuned)")
        print(f"speedup tuned vs untuned:      {untuned_s / tuned_s:6.2f}x  (goal >= 10x)")
        print(f"tuned vs onnxruntime:          {ort / tuned_s:6.2f}x  (>= 1 means at least as fast)")
        print(f"model {model.name}; budget: {outcome.trials_done} trials in {tune_min:.1f} min "
              f"(asked: {args.trials} trials, {args.minutes:g} min; stopped: {outcome.status}); host {device.key}, "
              f"target {tuned.artifact.target.get('mcpu')} x{tuned.artifact.target.get('num-cores')}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
