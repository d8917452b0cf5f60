"""farm compare: two runs' raw samples side by side (Mann-Whitney U, Kolmogorov-Smirnov), and where both runs have a
profile, which kernels account for the change (``kernel_diff``)."""

from __future__ import annotations

import argparse

from farm.analysis.kernel_diff import COMMON_SHOWN

from farm.cli.common import add_verb, duration, emit_json, positive_int, print_error, print_table, require_db


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "compare", run,
                 "compare two runs' raw samples and their kernels, or two nights' every series",
                 "Two runs: their raw samples (Mann-Whitney U, Kolmogorov-Smirnov) and, where both runs were\n"
                 "profiled (a sweep profiles by default, farm bench --profile), the kernels that account for the\n"
                 "change, each with its share of it, and the kernels that appeared or disappeared:\n"
                 "  kernels: 92% of the +1.3 ms is fused_conv2d16 (1.06 ms → 1.31 ms)\n"
                 "Runs of different libraries whose kernels are not the same ones compare by op class, and say so.\n\n"
                 "Two nights: farm compare --sweep 56 --sweep 57 gives every series measured in both, its change\n"
                 "with an interval (from the two runs' bootstrap intervals of the median) and whether it excludes 0,\n"
                 "largest first, grouped by device and by model, with the kernels where both runs were profiled.")
    p.add_argument("run_a", type=positive_int, nargs="?", help="a run id (farm results: run_id)")
    p.add_argument("run_b", type=positive_int, nargs="?", help="another run id")
    p.add_argument("--sweep", type=positive_int, action="append", default=[],
                   help="a night (give two: --sweep A --sweep B) instead of two runs")
    p.add_argument("--top", type=positive_int, default=20, help="nights: the series shown, largest change first "
                   "(default 20; --json gives all)")


def run(args: argparse.Namespace) -> int:
    from farm.analysis.compare import compare_nights, compare_runs
    from farm.store import Store

    nights = len(args.sweep) == 2 and args.run_a is None
    if not nights and (args.sweep or args.run_a is None or args.run_b is None):
        print_error("farm compare: give two run ids, or two nights", "farm compare 12 15, or farm compare --sweep 56 "
                    "--sweep 57")
        raise SystemExit(2)
    require_db(args.db)
    with Store(args.db) as store:
        data = compare_nights(store, *args.sweep) if nights else compare_runs(store, args.run_a, args.run_b)
    if args.json:
        emit_json(data if nights else {k: v for k, v in data.items() if k != "runs"})
    elif nights:
        _print_nights(data, args.top)
    else:
        _print_runs(data)
    return 0


def _print_runs(data: dict) -> None:
    for run_id, median_s, n in ((data["run_a"], data["median_old"], data["n_old"]),
                                (data["run_b"], data["median_new"], data["n_new"])):
        run = data["runs"][run_id]
        threads = "threads not known" if run["threads"] is None else f"{run['threads']} threads"
        print(f"run {run_id}: {run['device']} · {run['model']} · {run['runtime']}, {threads}  median "
              f"{duration(median_s)} ({n} samples)")
    print(f"change {data['change']:+.2%}; Mann-Whitney U p={data['mann_whitney_p']:.3g}, KS p={data['ks_p']:.3g}: "
          f"{data['verdict']}")
    kernels = data["kernels"]
    print_kernel_diff(kernels if "moves" in kernels else None, kernels.get("reason", ""), kernels.get("named", False),
                      data["verdict"], kernels.get("same_library", False))
    print("note: the p-values take each run's samples as independent; samples of one load are not, so they "
          "overstate certainty. farm regressions --confirm reruns both in rounds of fresh loads.")


def _print_nights(data: dict, top: int) -> None:
    series = data["series"]
    shown = sum(s["shown"] for s in series)
    print(f"sweep {data['sweep_a']} → {data['sweep_b']}: {len(series)} series in both, {shown} whose interval "
          f"excludes 0; {data['only_a']} only in {data['sweep_a']}, {data['only_b']} only in {data['sweep_b']}")
    print_table([{"device": s["device"], "model": s["model"], "before": duration(s["median_a"]),
                  "after": duration(s["median_b"]), "change": f"{s['change']:+.1%}",
                  "interval": f"{s['low']:+.1%} to {s['high']:+.1%}", "shown": "yes" if s["shown"] else "no",
                  "runs": f"{s['run_a']} → {s['run_b']}", "kernels": s["kernels"]} for s in series[:top]],
                ["device", "model", "before", "after", "change", "interval", "shown", "runs", "kernels"])
    for title, groups in (("by device", data["by_device"]), ("by model", data["by_model"])):
        print(f"{title}: " + "; ".join(f"{g['name']} {g['change']:+.1%} ({g['shown']}/{g['series']} shown)"
                                      for g in groups[:8]))


def print_kernel_diff(diff, why: str, named: bool, verdict: str, same_library: bool = False, top: int = 5) -> None:
    """The kernels' difference as ``kernel_diff`` says it (``KernelDiff.to_json``), or why there is none."""
    if diff is None:
        print(f"kernels: {why}")
        return
    if named:
        print(f"kernels: {diff['headline']}")
    elif same_library and verdict in ("slower", "faster"):
        print(f"kernels: none named: both runs ran the same library, so the change ({verdict}) is the device's or the "
              "session's, not a kernel's code; how each kernel moved:")
    else:
        print(f"kernels: none named: the samples show no change ({verdict}); how each kernel moved:")
    if abs(diff["common"] - 1.0) >= COMMON_SHOWN:
        print(f"  every kernel shared a {diff['common'] - 1:+.1%} shift (the median kernel's: the device or the "
              "session); each share below is of the change beyond it")
    for move in diff["moves"][:top]:
        old = duration(move["old_s"]) if move["old_s"] is not None else "absent"
        new = duration(move["new_s"]) if move["new_s"] is not None else "absent"
        print(f"  {move['name']:44s} {move['op_class']:18s} {old:>9s} → {new:>9s}  {move['share']:+7.0%} of the change")
    for label, names in (("appeared", diff["appeared"]), ("disappeared", diff["disappeared"])):
        if names:
            print(f"  {label}: {', '.join(names)}")
