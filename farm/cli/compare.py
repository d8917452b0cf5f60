"""farm compare: two runs' raw samples side by side (Mann-Whitney U, Kolmogorov-Smirnov), and where both runs have a
profile, which kernels account for the change (``kernel_diff``)."""

from __future__ import annotations

import argparse

from dataclasses import asdict

from farm.errors import FarmError
from farm.records import BenchConfig

from farm.cli.common import add_verb, duration, emit_json, positive_int, require_db


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "compare", run,
                 "compare two runs' raw samples (Mann-Whitney U, Kolmogorov-Smirnov), and their kernels",
                 "Where both runs were profiled (farm bench --profile, a sweep with profile = true), the kernels\n"
                 "that account for the change, each with its share of it, and the kernels that appeared or\n"
                 "disappeared (another schedule or fusion):\n"
                 "  kernels: 92% of the +1.3 ms is fused_conv2d16 (1.06 ms → 1.31 ms)\n"
                 "Runs of different libraries whose kernels are not the same ones compare by op class, and say so.")
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
        profiles = store.profiles([args.run_a, args.run_b])
    if len(a) < 3 or len(b) < 3:
        raise FarmError("each run needs at least 3 steady samples to compare", f"bench with --repeat {BenchConfig().repeat}")
    result = compare_samples(a, b)
    data = {"run_a": args.run_a, "run_b": args.run_b, **asdict(result)}
    same = _same_library(runs, args.run_a, args.run_b)
    diff, why = _kernels(profiles, args.run_a, args.run_b, same)
    # a change the samples show is put on its kernels; not where both runs ran one library: no kernel's code changed,
    # and between two sessions of one library every kernel moves with the device's state (the moves are still listed)
    named = result.verdict in ("slower", "faster") and not same
    data["kernels"] = {**diff.to_json(), "named": named, "same_library": same} if diff is not None else {
        "status": "not available", "reason": why}
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
        print_kernel_diff(diff, why, named, result.verdict, same)
        print("note: the p-values take each run's samples as independent; samples of one load are not, so they "
              "overstate certainty. farm regressions --confirm reruns both in rounds of fresh loads.")
    return 0


def _kernels(profiles, run_a: int, run_b: int, same_library: bool):
    """(the kernels' difference from run A to run B, '') or (None, why there is none)."""
    from farm.kernel_diff import kernel_diff

    for run_id in (run_a, run_b):
        profile = profiles.get(run_id)
        if profile is None:
            return None, f"run {run_id} has no profile (bench it with --profile)"
        if profile.status != "ok":
            return None, f"run {run_id}'s profile is not available: {profile.reason}"
    return kernel_diff(profiles[run_a], profiles[run_b], same_artifact=same_library), ""


def _same_library(runs, run_a: int, run_b: int) -> bool:
    return runs[run_a]["artifact_key"] == runs[run_b]["artifact_key"] != ""


def print_kernel_diff(diff, why: str, named: bool, verdict: str, same_library: bool = False, top: int = 5) -> None:
    if diff is None:
        print(f"kernels: {why}")
        return
    if named:
        print(f"kernels: {diff.headline()}")
    elif same_library and verdict in ("slower", "faster"):
        print(f"kernels: none named: both runs ran the same library, so the change ({verdict}) is the device's or the "
              "session's, not a kernel's code; how each kernel moved:")
    else:
        print(f"kernels: none named: the samples show no change ({verdict}); how each kernel moved:")
    if diff.common_shown:
        print(f"  every kernel shared a {diff.common - 1:+.1%} shift (the median kernel's: the device or the session); "
              "each share below is of the change beyond it")
    for move in diff.moves[:top]:
        old = duration(move.old_s) if move.old_s is not None else "absent"
        new = duration(move.new_s) if move.new_s is not None else "absent"
        print(f"  {move.name:44s} {move.op_class:18s} {old:>9s} → {new:>9s}  {move.share:+7.0%} of the change")
    for label, names in (("appeared", diff.appeared), ("disappeared", diff.disappeared)):
        if names:
            print(f"  {label}: {', '.join(names)}")
