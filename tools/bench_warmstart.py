#!/usr/bin/env python3
"""Does a farm's tuning carry over to the next model? Model A is tuned; model B shares A's convs but with another
epilogue (its convs end in LeakyRelu where A's end in Relu), so no record of A is B's own. B is then tuned twice
per seed, same budget:

  cold: an empty store (no records, no cost model),
  warm: A's store (A's records, A's saved cost model): B's tasks start from A's records by anchor block
        (transferred and measured on the device) and the search from A's cost model.

Quality is the searched tasks' time (call sites × best measured candidate; farm tune's trajectory) within 5 % of
the cold session's best. B's sessions leave out its smallest tasks, together under --min-share of its untuned time
(default 0.1: all but its big conv), so the figure is not the luck of a 3-trial search on a small task. Printed
per seed: the trials each session needed to get there (a seed measured on the device counts as a trial), and
warm / cold.
Goal: warm <= 0.5 × cold on every seed.

    .venv/bin/python tools/bench_warmstart.py [--a convnet] [--trials-a 64] [--trials-b 48] [--seeds 3]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from farm.models import load_model
from farm.models.zoo import leaky_variant
from farm.records import Device
from farm.rpc.launch import private_farm
from farm.store import Store
from farm.tune import TuneConfig, TuneOutcome, tune_model

QUALITY = 1.05  # within 5 % of the cold session's best


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def trials_to(outcome: TuneOutcome, goal_s: float) -> int | None:
    """The trials after which the session's trajectory first reached ``goal_s`` (None: never)."""
    return next((trials for trials, time_s in outcome.trajectory if time_s <= goal_s), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", default="convnet", help="model A, a built-in (default convnet)")
    parser.add_argument("--trials-a", type=int, default=64, help="trials tuning A (default 64)")
    parser.add_argument("--trials-b", type=int, default=48, help="trials of each session on B (default 48)")
    parser.add_argument("--min-share", type=float, default=0.1, help="B's sessions leave out its smallest tasks, "
                        "together under this share of its untuned time (default 0.1)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds, each a cold and a warm session (default 3)")
    parser.add_argument("--work", default=None, help="keep the stores here (default: a temp dir)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="farm-bench-warmstart-"))
    work.mkdir(parents=True, exist_ok=True)
    model_a = load_model(args.a)
    model_b = load_model(str(leaky_variant(args.a, work)))
    device = Device("bench-cpu", "local", "bench-warmstart-cpu", {"kind": "llvm"})
    with private_farm(work, {device.name: device.key}) as tracker:
        with Store(work / "a.db") as store:
            a = tune_model(tracker, device, model_a, store, work / "tune-a", TuneConfig(trials=args.trials_a),
                           progress=progress)
        print(f"A = {model_a.name}: {a.trials_done} trials, {a.total_records} records, cost model "
              f"{a.cost_model_samples} samples; B = {model_b.name} (A's convs, LeakyRelu epilogues)", flush=True)
        print("seed  cold trials  cold best (µs)  warm trials  warm start (µs)  seeded  warm/cold", flush=True)
        ratios = []
        for seed in range(args.seeds):
            config = TuneConfig(trials=args.trials_b, seed=seed, min_share=args.min_share)
            with Store(work / f"cold-{seed}.db") as store:
                cold = tune_model(tracker, device, model_b, store, work / f"tune-cold-{seed}", config, progress=progress)
            shutil.copy(work / "a.db", work / f"warm-{seed}.db")
            with Store(work / f"warm-{seed}.db") as store:
                warm = tune_model(tracker, device, model_b, store, work / f"tune-warm-{seed}", config,
                                  progress=progress)
            if seed == 0:
                print("B's searched tasks: " + ", ".join(f"{t.name} ({t.share:.0%})" for t in cold.tasks
                                                         if t.allotted), flush=True)
            best = min(t for _, t in cold.trajectory)
            cold_n, warm_n = trials_to(cold, best * QUALITY), trials_to(warm, best * QUALITY)
            ratio = warm_n / cold_n if warm_n is not None and cold_n else None
            ratios.append(ratio)
            print(f"{seed:4d}  {cold_n!s:>11}  {best * 1e6:14.1f}  {warm_n!s:>11}  {warm.trajectory[0][1] * 1e6:15.1f}"
                  f"  {warm.seeded:6d}  {'-' if ratio is None else f'{ratio:.2f}':>9}", flush=True)
    met = all(r is not None and r <= 0.5 for r in ratios)
    print(f"warm start within {QUALITY - 1:.0%} of the cold best in <= 0.5x the cold trials on every seed: "
          f"{'PASS' if met else 'FAIL'}", flush=True)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
