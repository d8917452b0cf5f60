#!/usr/bin/env python3
"""Does farm's steady-state figure agree with TVM's own time_evaluator?

Starts a private tracker and one local rpc_server, then alternates, for the same model on
the same device: `farm`'s bench (store + samples) and a direct measurement written with
TVM's API only (TrackerSession.request, upload, VirtualMachine.time_evaluator). Prints both
medians per round and, on the last line, the difference in percent (acceptance: < 5 %).

    .venv/bin/python tools/bench_fidelity.py [--model convnet] [--rounds 5] [--repeat 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import tvm
from tvm import relax, rpc

from farm.compile import compile_model
from farm.models import load_model, make_inputs
from farm.records import BenchConfig, Device, TrackerAddress
from farm.rpc.launch import private_farm
from farm.store import Store
from farm.sweep import bench_cell


def direct_median(tracker: TrackerAddress, key: str, artifact_path: str, inputs, number: int, repeat: int) -> float:
    """The measurement a TVM user would write by hand."""
    session = rpc.connect_tracker(tracker.host, tracker.port).request(key, session_timeout=120)
    session.upload(artifact_path)
    lib = session.load_module(os.path.basename(artifact_path))
    dev = session.cpu(0)
    vm = relax.VirtualMachine(lib, dev)
    args = [tvm.runtime.tensor(v, dev) for v in inputs.values()]
    vm.set_input("main", *args)
    result = vm.time_evaluator("invoke_stateful", dev, number=number, repeat=repeat)("main")
    return float(np.median(result.results))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="convnet")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--min-repeat-ms", type=float, default=50.0)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="farm-fidelity-"))
    device = Device("fidelity-cpu", "local", "fidelity-cpu", {"kind": "llvm"})
    model = load_model(args.model)
    with private_farm(work, {device.name: device.key}) as tracker:
        artifact = compile_model(model, device, work / "cache")
        config = BenchConfig(repeat=args.repeat, min_repeat_ms=args.min_repeat_ms)
        farm_medians, direct_medians = [], []
        with Store(work / "fidelity.db") as store:
            for round_ in range(1, args.rounds + 1):
                cell = bench_cell(tracker, device, model, store, work / "cache", config)
                if cell.result.status != "ok":
                    print(f"farm bench failed: {cell.result.reason}", file=sys.stderr)
                    return 1
                farm_median = statistics.median(store.samples(cell.run_id))  # read back from the store
                direct = direct_median(tracker, device.key, artifact.path, make_inputs(model), cell.result.steady_number,
                                       args.repeat)
                farm_medians.append(farm_median)
                direct_medians.append(direct)
                print(f"round {round_}: farm {farm_median * 1e3:.4f} ms  direct time_evaluator {direct * 1e3:.4f} ms"
                      f"  (number={cell.result.steady_number}, repeat={args.repeat})")
        farm_overall = statistics.median(farm_medians)
        direct_overall = statistics.median(direct_medians)
        diff = (farm_overall - direct_overall) / direct_overall * 100
        print(f"model {model.name} on {device.name} ({artifact.target.get('mcpu', 'generic')}), {args.rounds} rounds")
        print(f"farm steady median:   {farm_overall * 1e3:.4f} ms")
        print(f"direct median:        {direct_overall * 1e3:.4f} ms")
        print(f"difference: {diff:+.2f} %")
        return 0 if abs(diff) < 5 else 1


if __name__ == "__main__":
    sys.exit(main())
