#!/usr/bin/env python3
"""Are TVM and its reference runtime measured on equal terms? One run on this host, its figures.

Starts a private tracker and local servers as `farm serve` starts them, one per thread setting (devices.toml's
`threads`: 1, 2, and left out, which is the target's num-cores here), benches each model on each (untuned TVM beside
onnxruntime, the cell pipeline of `farm bench`), and prints per cell the threads TVM's session reported, the threads
onnxruntime was given, both steady medians and the comparison. The last line is the share of stored runs whose TVM
and reference thread counts are equal (the goal: 100 % on farm's own servers).

    .venv/bin/python tools/bench_fairness.py [--models mlp,convnet,onnx:squeezenet] [--threads 1,2,default]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from farm.devices import kinds
from farm.models import load_model
from farm.records import BenchConfig, Device, TrackerAddress
from farm.analysis.results import run_rows, versus_reference
from farm.procs.supervise import free_port, stop_process
from farm.rpc.launch import start_tracker
from farm.rpc.tracker import wait_for_servers
from farm.stats import format_duration
from farm.store import Store
from farm.sweep import bench_cell


def devices(settings: list[str]) -> list[Device]:
    return [Device(f"cpu-{s}", "local", f"fairness-{s}", {"kind": "llvm"}, threads=None if s == "default" else int(s))
            for s in settings]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,convnet,onnx:squeezenet")
    parser.add_argument("--threads", default="1,2,default", help="thread settings, comma-separated ('default': none)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="farm-bench-fairness-"))
    config = BenchConfig(repeat=15, min_repeat_ms=100, timeout_s=60)
    port = free_port()
    tracker = TrackerAddress("127.0.0.1", port)
    started = [start_tracker(tracker.host, port, work)]
    try:
        fleet = devices(args.threads.split(","))
        for device in fleet:
            started.extend(kinds()["local"].bring_up(device, tracker, work))
        wait_for_servers(tracker, {d.key: 1 for d in fleet}, timeout_s=120)
        with Store(work / "results.db") as store:
            for model in (load_model(name) for name in args.models.split(",")):
                for device in fleet:
                    cell = bench_cell(tracker, device, model, store, work / "cache", config, tuned=False)
                    if cell.result.status != "ok":
                        print(f"{device.name} {model.name}: {cell.result.reason}", file=sys.stderr)
            runs = run_rows(store)
    finally:
        for record in reversed(started):
            stop_process(record)
    tvm, versus = versus_reference(runs)
    print("device      model            TVM threads  reference threads  TVM steady   onnxruntime  comparison")
    equal = 0
    for run in sorted(tvm, key=lambda r: (r.model, r.device)):
        pair = versus[run.run_id]
        ref = pair.reference
        equal += bool(ref and ref.threads == run.threads)
        print(f"{run.device:11s} {run.model:16s} {run.threads!s:12s} {(ref.threads if ref else None)!s:18s} "
              f"{format_duration(run.steady_median_s):12s} {format_duration(ref.steady_median_s if ref else None):12s} "
              f"{pair.text}")
    print(f"equal threads: {equal}/{len(tvm)} TVM runs ({equal / max(len(tvm), 1):.0%}); results in {work}")
    return 0 if equal == len(tvm) else 1


if __name__ == "__main__":
    sys.exit(main())
