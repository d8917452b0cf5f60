#!/usr/bin/env python3
"""Fault injection: kill a device's server mid-sweep, again and again.

Starts a private tracker and three local devices, then runs sweeps while a killer thread
kills one device's rpc_server (its whole process group) at a random moment and restarts it
a moment later. After --kills kills, checks that:
  - every cell of the other devices is measured (ok),
  - every cell of the victim is ok (retried) or failed with a reason,
  - no sample is lost: each ok run has exactly `repeat` steady samples and `copy_repeat`
    samples per output.
Last line: PASS or FAIL.

    .venv/bin/python tools/fault_sweep.py [--kills 20]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

from farm.records import BenchConfig, Device, TrackerAddress
from farm.procs.supervise import free_port, stop_process
from farm.rpc.launch import start_server, start_tracker
from farm.rpc.tracker import wait_for_servers

CONFIG = BenchConfig(repeat=5, min_repeat_ms=20, copy_repeat=4, timeout_s=10)
MODELS = ("mlp", "convnet", "mobile-block")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from farm.sweep import SweepSpec, run_sweep  # TVM: after the arguments, so --help is instant

    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="farm-fault-"))
    db_path = work / "results.db"
    port = free_port()
    tracker = TrackerAddress("127.0.0.1", port)
    devices = {f"dev{i}": Device(f"dev{i}", "local", f"fault-{i}", {"kind": "llvm"}, cooldown_s=0.3) for i in range(3)}
    victim = devices["dev0"]
    others = {"tracker": [], "victim": None}
    try:
        others["tracker"].append(start_tracker(tracker.host, port, work))
        for device in devices.values():
            record = start_server(tracker, device.name, device.key, work)
            if device is victim:
                others["victim"] = record
            else:
                others["tracker"].append(record)
        wait_for_servers(tracker, {d.key: 1 for d in devices.values()}, timeout_s=60)
        spec = SweepSpec(tuple(devices), MODELS, reference=None, config=CONFIG, retries=1)
        kills = 0
        sweep_ids = []
        while kills < args.kills:
            done = threading.Event()

            def killer(done: threading.Event = done):
                nonlocal kills
                if done.wait(rng.uniform(0.2, 2.0)):
                    return  # the sweep finished first: no kill this time
                stop_process(others["victim"])
                kills += 1
                time.sleep(rng.uniform(0.2, 1.0))
                others["victim"] = start_server(tracker, victim.name, victim.key, work)

            thread = threading.Thread(target=killer)
            thread.start()
            outcome = run_sweep(tracker, devices, spec, db_path, work / "cache")
            done.set()
            thread.join()
            sweep_ids.append(outcome.sweep_id)
            wait_for_servers(tracker, {victim.key: 1}, timeout_s=60)
            print(f"sweep {outcome.sweep_id}: kills so far {kills}", file=sys.stderr, flush=True)
        return verify(db_path, sweep_ids, devices, victim, kills)
    finally:
        if others["victim"] is not None:
            stop_process(others["victim"])
        for record in reversed(others["tracker"]):
            stop_process(record)


def verify(db_path: Path, sweep_ids: list[int], devices: dict, victim: Device, kills: int) -> int:
    db = sqlite3.connect(db_path)
    problems = []
    counts = {"cells": 0, "victim_ok_first": 0, "victim_retried_ok": 0, "victim_failed": 0, "runs": 0}
    for sweep_id in sweep_ids:
        for name in devices:
            for model in MODELS:
                runs = db.execute("SELECT id, status, reason, attempt FROM runs WHERE sweep_id=? AND device=? AND model=?"
                                  " ORDER BY attempt", (sweep_id, name, model)).fetchall()
                counts["cells"] += 1
                counts["runs"] += len(runs)
                if not runs:
                    problems.append(f"sweep {sweep_id} {name} {model}: no run stored")
                    continue
                final = runs[-1]
                if name != victim.name and final[1] != "ok":
                    problems.append(f"sweep {sweep_id} {name} {model}: {final[1]} ({final[2]}) on a device nobody killed")
                if name == victim.name:
                    if final[1] == "ok":
                        counts["victim_ok_first" if len(runs) == 1 else "victim_retried_ok"] += 1
                    elif final[2]:
                        counts["victim_failed"] += 1
                    else:
                        problems.append(f"sweep {sweep_id} {name} {model}: failed without a reason")
                for run_id, status, _, _ in runs:
                    if status != "ok":
                        continue
                    steady = db.execute("SELECT COUNT(*) FROM samples WHERE run_id=? AND metric='steady'",
                                        (run_id,)).fetchone()[0]
                    outputs = db.execute("SELECT COUNT(*) FROM copies WHERE run_id=?", (run_id,)).fetchone()[0]
                    copy = db.execute("SELECT COUNT(*) FROM samples WHERE run_id=? AND metric='copy'", (run_id,)).fetchone()[0]
                    if steady != CONFIG.repeat or copy != outputs * CONFIG.copy_repeat:
                        problems.append(f"run {run_id}: {steady} steady / {copy} copy samples, expected "
                                        f"{CONFIG.repeat} / {outputs * CONFIG.copy_repeat}")
    print(f"{kills} kills over {len(sweep_ids)} sweeps; {counts['cells']} cells, {counts['runs']} runs stored")
    print(f"victim cells: {counts['victim_ok_first']} ok at once, {counts['victim_retried_ok']} ok after a retry, "
          f"{counts['victim_failed']} failed with a reason; other devices: every cell ok unless listed below")
    for problem in problems[:20]:
        print("problem:", problem)
    print("PASS" if not problems else f"FAIL ({len(problems)} problems)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
