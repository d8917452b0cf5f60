#!/usr/bin/env python3
"""fp32 vs fp16 vs int8 for one conv net on this host, in one run: latency and accuracy drift.

Starts a private tracker and one local rpc_server, benchmarks each variant (untuned TVM code,
same device, same run) and prints steady median latency and the max absolute drift against
the fp32 model's onnxruntime outputs; the last line says which variant is fastest here.

    .venv/bin/python tools/bench_variants.py [--model convnet] [--calibration minmax]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from farm.models import load_model, make_variant
from farm.records import BenchConfig, Device
from farm.rpc.launch import private_farm
from farm.store import Store
from farm.sweep import bench_cell


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="convnet")
    parser.add_argument("--calibration", default="minmax")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="farm-bench-variants-"))
    device = Device("variants-cpu", "local", "bench-variants-cpu", {"kind": "llvm"})
    with private_farm(work, {device.name: device.key}) as tracker:
        base = load_model(args.model)
        results = {}
        with Store(work / "results.db") as store:
            for variant in ("fp32", "fp16", "int8"):
                model = make_variant(base, variant, args.calibration)
                cell = bench_cell(tracker, device, model, store, work / "cache",
                                  BenchConfig(repeat=20, min_repeat_ms=50), tuned=False)
                r = cell.result
                if not r.steady_samples_s:
                    print(f"{variant}: failed at {r.failed_step}: {r.reason}")
                    continue
                results[variant] = float(np.median(r.steady_samples_s))
                print(f"{variant:5s} steady {results[variant] * 1e3:8.4f} ms   drift vs fp32: max abs "
                      f"{r.check.max_abs_err:.3g} ({r.check.status}, tolerance {r.check.atol:.3g})")
        fastest = min(results, key=results.get)
        print(f"fastest here: {fastest} ({results['fp32'] / results[fastest]:.2f}x fp32) — model {base.name}, "
              f"untuned TVM on {device.key}; int8 calibrated with {args.calibration}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
