#!/usr/bin/env python3
"""Is the parallel sweep worth it, and does a repeated sweep reuse its artifacts?

Scenario A (device-bound): K local devices whose cells are dominated by cooldown. The same
cells run once as one sweep over all K devices (one worker each) and once one device at a
time (K sweeps). Acceptance: parallel is >= 0.8·K times faster.

Scenario B (compile-bound): a smoke sweep (one repeat of one call per cell, so compiling
dominates: shufflenet compiles in ~2 s and runs in ~60 ms here) over two devices, then the
same sweep again with unchanged inputs. Acceptance: the repeat compiles nothing and takes
<= 0.2x the first.

    .venv/bin/python tools/bench_sweep.py [--devices 4] [--cooldown 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from farm.records import BenchConfig, Device, TrackerAddress
from farm.procs.supervise import free_port, stop_process
from farm.rpc.launch import start_server, start_tracker
from farm.rpc.tracker import wait_for_servers

FAST = BenchConfig(repeat=3, min_repeat_ms=5, copy_repeat=3, timeout_s=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--cooldown", type=float, default=3.0)
    args = parser.parse_args()
    from farm.sweep import SweepSpec, run_sweep  # TVM: after the arguments, so --help is instant

    k = args.devices
    work = Path(tempfile.mkdtemp(prefix="farm-bench-sweep-"))
    port = free_port()
    tracker = TrackerAddress("127.0.0.1", port)
    devices = {f"dev{i}": Device(f"dev{i}", "local", f"bench-sweep-{i}", {"kind": "llvm"}, cooldown_s=args.cooldown)
               for i in range(k)}
    started = []
    try:
        started.append(start_tracker(tracker.host, port, work))
        for device in devices.values():
            started.append(start_server(tracker, device.name, device.key, work))
        wait_for_servers(tracker, {d.key: 1 for d in devices.values()}, timeout_s=60)
        models = ("mlp", "convnet", "mobile-block")
        spec = SweepSpec(tuple(devices), models, reference=None, config=FAST)
        run_sweep(tracker, devices, spec, work / "warm.db", work / "cache")  # compile once: scenario A times devices
        t0 = time.monotonic()
        parallel = run_sweep(tracker, devices, spec, work / "a.db", work / "cache")
        parallel_s = time.monotonic() - t0
        t0 = time.monotonic()
        for name in devices:
            run_sweep(tracker, devices, SweepSpec((name,), models, reference=None, config=FAST), work / "a.db", work / "cache")
        serial_s = time.monotonic() - t0
        speedup = serial_s / parallel_s
        print(f"A: {k} devices x {len(models)} models, cooldown {args.cooldown:g} s: one at a time {serial_s:.1f} s, "
              f"parallel {parallel_s:.1f} s, speedup {speedup:.2f}x (goal >= {0.8 * k:.1f}x) "
              f"[{sum(c.result.status == 'ok' for c in parallel.cells)}/{len(parallel.cells)} ok]")

        heavy = {name: Device(name, "local", d.key, {"kind": "llvm"}) for name, d in list(devices.items())[:2]}
        # a smoke-test configuration (one repeat of one call): the cells' cost is compilation
        smoke = BenchConfig(repeat=1, number=1, min_repeat_ms=0, copy_repeat=1, timeout_s=60)
        spec_b = SweepSpec(tuple(heavy), ("onnx:shufflenet", "convnet", "mobile-block", "mlp"), reference=None,
                           config=smoke)
        b_cache = work / "cache-b"
        t0 = time.monotonic()
        first = run_sweep(tracker, heavy, spec_b, work / "b.db", b_cache)
        first_s = time.monotonic() - t0
        t0 = time.monotonic()
        again = run_sweep(tracker, heavy, spec_b, work / "b.db", b_cache)
        again_s = time.monotonic() - t0
        compiled_first = sum(1 for c in first.cells if c.artifact and not c.artifact.cached)
        compiled_again = sum(1 for c in again.cells if c.artifact and not c.artifact.cached)
        print(f"B: first sweep {first_s:.1f} s ({compiled_first} compiled), repeat {again_s:.1f} s "
              f"({compiled_again} compiled), ratio {again_s / first_s:.2f} (goal <= 0.2, 0 compiled)")
        ok = speedup >= 0.8 * k and compiled_again == 0 and again_s <= 0.2 * first_s
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        for record in reversed(started):
            stop_process(record)


if __name__ == "__main__":
    sys.exit(main())
