#!/usr/bin/env python3
"""Does farm's regression detection tell a 10 % step from 3 % night-to-night noise?

Generates series with known truth and runs farm's own detection on them (farm.regress):
  - nightly medians: base × (1 + step) × (1 + e_night), e_night ~ N(0, 3 %), 20-night baseline;
  - confirmation: old and new artifacts rerun interleaved, per-sample noise N(0, 2 %) on top of
    the same night's e_night (what interleaving cancels), 20 samples each, 60 if inconclusive.
Prints the A/A rate (no change: confirmed alerts must be ≤ 1 %) and the 10 % step rate
(confirmed ≥ 95 %), plus the candidate rates behind them.

    .venv/bin/python tools/bench_detect.py [--series 2000] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from farm.regress import METHOD, confirm, judge


def simulate(step: float, series: int, rng: np.random.Generator, night_noise: float = 0.03,
             sample_noise: float = 0.02, base: float = 1e-3) -> tuple[float, float]:
    """(candidate rate, confirmed rate) of a regression of ``step`` over ``series`` series."""
    candidates = confirmed = 0
    for _ in range(series):
        history = base * (1 + rng.normal(0, night_noise, 20))
        night = rng.normal(0, night_noise)
        value = base * (1 + step) * (1 + night)
        if judge(value, history).status != "candidate":
            continue
        candidates += 1

        def rerun(n: int, night: float = night):
            old = base * (1 + night) * (1 + rng.normal(0, sample_noise, n))
            new = base * (1 + step) * (1 + night) * (1 + rng.normal(0, sample_noise, n))
            return old, new

        status, _ = confirm(rerun)
        confirmed += status == "confirmed"
    return candidates / series, confirmed / series


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    limits = METHOD.thresholds["steady"]
    print(f"method: steady candidates at z >= {limits.z} and change >= {limits.rel:.1%}; baseline last "
          f"{METHOD.baseline_n} nights; confirmation Mann-Whitney U and KS p < {METHOD.p_confirm}")
    aa_candidates, aa_confirmed = simulate(0.0, args.series, rng)
    step_candidates, step_confirmed = simulate(0.10, args.series, rng)
    print(f"A/A (no change, 3% noise), {args.series} series: candidates {aa_candidates:.1%}, "
          f"confirmed {aa_confirmed:.2%} (goal <= 1%)")
    print(f"10% step, {args.series} series: candidates {step_candidates:.1%}, confirmed {step_confirmed:.1%} (goal >= 95%)")
    ok = aa_confirmed <= 0.01 and step_confirmed >= 0.95
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
