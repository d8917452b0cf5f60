"""farm compare: two runs' raw samples side by side (Mann-Whitney U, Kolmogorov-Smirnov)."""

from __future__ import annotations

import argparse

from dataclasses import asdict

from farm.errors import FarmError
from farm.records import BenchConfig

from farm.cli.common import add_verb, duration, emit_json, positive_int, require_db


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "compare", run, "compare two runs' raw samples (Mann-Whitney U, Kolmogorov-Smirnov)")
    p.add_argument("run_a", type=positive_int, help="a run id (farm results: run_id)")
    p.add_argument("run_b", type=positive_int, help="another run id")


def run(args: argparse.Namespace) -> int:
    from farm.regress import compare_samples
    from farm.store import Store

    require_db(args.db)
    with Store(args.db) as store:
        runs = {run_id: store.run(run_id) for run_id in (args.run_a, args.run_b)}  # two rows, not the store's every run
        for run_id, found in runs.items():
            if found is None:
                raise FarmError(f"no run {run_id} in {args.db}", "see farm results")
        a, b = store.samples(args.run_a), store.samples(args.run_b)
    if len(a) < 3 or len(b) < 3:
        raise FarmError("each run needs at least 3 steady samples to compare", f"bench with --repeat {BenchConfig().repeat}")
    result = compare_samples(a, b)
    data = {"run_a": args.run_a, "run_b": args.run_b, **asdict(result)}
    if args.json:
        emit_json(data)
    else:
        for run_id, median_s, n in ((args.run_a, result.median_old, result.n_old),
                                    (args.run_b, result.median_new, result.n_new)):
            run = runs[run_id] or {}
            threads = "threads not known" if run["threads"] is None else f"{run['threads']} threads"
            print(f"run {run_id}: {run['device']} · {run['model']} · {run['runtime']}, {threads}  median "
                  f"{duration(median_s)} ({n} samples)")
        print(f"change {result.change:+.2%}; Mann-Whitney U p={result.mann_whitney_p:.3g}, KS p={result.ks_p:.3g}: "
              f"{result.verdict}")
        print("note: the p-values take each run's samples as independent; samples of one load are not, so they "
              "overstate certainty. farm regressions --confirm reruns both in rounds of fresh loads.")
    return 0
