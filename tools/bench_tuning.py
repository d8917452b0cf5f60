#!/usr/bin/env python3
"""How much does `farm tune` buy on this host, and how does it use a farm's devices? One run, its figures.

Default: starts a private tracker and one local server (TVM on the threads farm sets, given to onnxruntime too),
then for one conv net, with weight prepacking off and on (two tuning keys, each from no records):
  1. onnxruntime and TVM untuned, both through `farm bench`'s one cell pipeline (the reference runtime
     is timed beside TVM with the same inputs, statistics and threads),
  2. tuning sessions that build on each other (records and cost model kept), the two pipelines' sessions in
     turns, until each --points' accumulated minutes; at each point both tuned models are benched again beside
     onnxruntime: the budget → ratio curve, each row with the threads both runs reported,
  3. P1, per pipeline: tuned TVM at least as fast as onnxruntime within the last point? If not, the top five
     tasks by share of the tuned model's time, each with its best time and GFLOP/s (what holds it back),
  4. P1b: the same model with LeakyRelu for Relu (the same convs, another epilogue: no task of its own has a
     record) compiled with each pipeline's records and no session of its own, beside onnxruntime.

    .venv/bin/python tools/bench_tuning.py [--model onnx:squeezenet] [--points 10,20,40,60] [--pipelines off,on]

--confirm N: after the last point, each tuned model benched N more times beside onnxruntime, in turns, and P1
judged on the median ratio (one bench's ratio moves with the host's noise); --bench-only: no tuning, the models
tuned in a run's --work benched so (its curves' options given again).

    .venv/bin/python tools/bench_tuning.py --model onnx:resnet50 --no-shared --pipelines on --bench-only --confirm 5 --work DIR

--batches 16,64: a curve per batch size too (candidates a batch; farm's own when not given), each with its own
store (records, cost model), all in turns: whether a batch's generation shared by more candidates buys more.

    .venv/bin/python tools/bench_tuning.py --batches 16,64 --pipelines on --points 10,20,30

--populations 512,128: a curve per evolutionary-search population (farm tune --population; farm's own when not
given), each with its own store, all in turns: a smaller population generates a batch sooner (more rounds of
measuring and learning in the same minutes) and explores less of each round's space.

    .venv/bin/python tools/bench_tuning.py --populations 512,128 --pipelines on --points 10,20

--layouts model,NHWC: a curve per convolution layout (devices.toml's layout: the model's own, or NHWC), in turns;
their records are kept apart by the tuning key, so they share a store.

    .venv/bin/python tools/bench_tuning.py --layouts model,NHWC --pipelines on --points 10,20

--scaling: trials per minute of search (set-up and profile excluded) with K = 1 and K = 2 servers under
one key (farm tune --max-runners), builds running ahead of the measurements (farm tune --builds-ahead, as
for a device that is not this host), with a fixed device-side pause per candidate (--candidate-cooldown,
as phones need), then K = 2 without it (builds dominate on 2 cores). The devices' busy share is
measured: each candidate's time from asking for its session to releasing it (upload, load, runs,
cooldown, clean-up), summed, over K × the search's time (set-up and the untuned profile excluded).
With builds ahead, a pass's tasks take turns in one search (one task's batch is generated while another's
is measured); the row "K = 2, one task a search" is the same session without the turns, for comparison.
--session-minutes M bounds each session by minutes instead of --trials, as nightly tuning does (a task
takes turns only with whole batches to search, which a small trial budget rarely gives).

    .venv/bin/python tools/bench_tuning.py --scaling [--model convnet] [--trials 48] [--candidate-cooldown 1]
    .venv/bin/python tools/bench_tuning.py --scaling --model onnx:squeezenet --session-minutes 3

--prepack: both pipelines in one run, weight prepacking off then on (devices.toml's weight_prepack; records
under two tuning keys, each from none), on the same server (so the same threads), with the same --sessions of
--trials each (or --session-minutes), in turns; then each pipeline's tuned model benched beside onnxruntime, --rounds
times, in turns (off, on, off, on …) so a change in the host's load falls on both; the threads each run
reported, what main calls (kernels on prepacked weights, repacking left in it), and the ratio on / off per round.

    .venv/bin/python tools/bench_tuning.py --prepack [--model convnet] [--trials 48] [--sessions 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from farm.compile import (device_tuning_key, device_tuning_module, effective_target, is_schedule, main_calls,
                          make_target, record_databases)
from farm.models import load_model
from farm.models.zoo import leaky_variant
from farm.records import LAYOUTS, BenchConfig, Device
from farm.rpc.launch import private_farm
from farm.stats import median, versus_text
from farm.store import Store
from farm.sweep import bench_cell
from farm.tune.tuning_set import tuning_set
from farm.tune import TuneConfig, tune_model
from farm.tune.metaschedule import extract_tasks
from farm.tune.database import record_s

PIPELINE = {False: "prepack off", True: "prepack on"}


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def bench(tracker, device, model, store, work, config, tuned: bool) -> tuple[float, float | None, str]:
    """TVM's steady median, the reference runtime's, and the cell's tuning coverage."""
    cell = bench_run(tracker, device, model, store, work, config, tuned)
    return median(cell.result.steady_samples_s), reference_s(cell), coverage_of(cell)


def bench_run(tracker, device, model, store, work, config, tuned: bool):
    """One `farm bench` cell (TVM, then the reference runtime beside it); exits when TVM's run failed."""
    cell = bench_cell(tracker, device, model, store, work / "cache", config, tuned=tuned)
    if cell.result.status != "ok":
        raise SystemExit(f"bench failed: {cell.result.reason}")
    return cell


def reference_s(cell) -> float | None:
    ref = cell.reference.result if cell.reference else None
    return median(ref.steady_samples_s) if ref and ref.status == "ok" else None


def compared(cell) -> str:
    """TVM against the reference runtime in farm's one wording, with the threads each run reported."""
    ref = cell.reference.result if cell.reference else None
    return versus_text(median(cell.result.steady_samples_s), reference_s(cell), "onnxruntime", cell.result.threads,
                       ref.threads if ref else None)


def coverage_of(cell) -> str:
    coverage = f"{cell.artifact.tuned_tasks}/{cell.artifact.total_tasks} tasks tuned"
    if cell.artifact.anchor_tasks:
        coverage += f" ({cell.artifact.anchor_tasks} by anchor block)"
    return coverage


@dataclass
class Variant:
    """One curve of the run: a pipeline (weight prepacking off or on), a batch size (candidates a batch; None:
    farm's default) and a search population (None: farm's default), its own device and, when batch sizes or
    populations are compared, its own store (records and cost model); and a layout (the model's own, or NHWC)."""

    on: bool
    batch: int | None
    population: int | None
    layout: str | None  # None: farm's default for the target
    device: Device
    store: Store
    seconds: float = 0.0  # of tuning so far
    trials: int = 0
    sessions: int = 0
    best: tuple[float, float] | None = None  # the best tuned/reference ratio so far, at which minutes
    judged_on: str = "the best point"  # what ``best`` is: a point's single bench, or confirm's median

    @property
    def label(self) -> str:
        return (PIPELINE[self.on] + (f", batch {self.batch}" if self.batch else "")
                + (f", population {self.population}" if self.population else "")
                + (f", layout {self.layout}" if self.layout else ""))


def confirm(rounds: int, tracker, variants: list[Variant], model, work: Path, config) -> None:
    """Each tuned model benched ``rounds`` more times beside onnxruntime, in turns (a paired cell each: the host's
    load falls on both runtimes of a round), with no tuning between: one cell's ratio moves with the host's noise (on
    this VM onnxruntime's own median moved 18.3–21.2 ms within one run). Each round's figures, then the median ratio,
    which P1 is then judged on (``Variant.best``)."""
    ratios: dict[str, list[float]] = {v.label: [] for v in variants}
    for n in range(1, rounds + 1):
        for v in variants:
            cell = bench_run(tracker, v.device, model, v.store, work, config, tuned=True)
            tuned_s, ref_s = median(cell.result.steady_samples_s), reference_s(cell)
            if ref_s:
                ratios[v.label].append(tuned_s / ref_s)
            print(f"confirm {v.label:14s} round {n}: TVM {tuned_s * 1e3:.3g} ms · onnxruntime "
                  f"{ref_s * 1e3 if ref_s else float('nan'):.3g} ms ({compared(cell)}); {coverage_of(cell)}", flush=True)
    for v in variants:
        if got := sorted(ratios[v.label]):
            v.best = (median(got), v.seconds / 60)
            v.judged_on = f"the median of {len(got)} benches after the last point"
            print(f"confirm {v.label}: TVM / onnxruntime median {median(got):.3f} over {len(got)} rounds "
                  f"(from {got[0]:.3f} to {got[-1]:.3f})", flush=True)


def curve(args) -> int:
    work = Path(args.work or tempfile.mkdtemp(prefix="farm-bench-tuning-"))
    model = load_model(args.model)
    config = BenchConfig(repeat=15, min_repeat_ms=100, timeout_s=60)
    with private_farm(work, {"curve": "bench-tuning-cpu"}) as tracker, contextlib.ExitStack() as stores:
        variants = []
        searches = [(batch, population) for batch in args.batches for population in args.populations]
        for batch, population in searches:
            # batch sizes or populations compared: a store each, so neither's records nor cost model helps the other
            suffix = (f"-b{batch}" if batch else "") + (f"-p{population}" if population else "")
            store = stores.enter_context(Store(work / (f"results{suffix}.db" if len(searches) > 1 else "results.db")))
            for on, layout in ((on, layout) for layout in args.layouts for on in args.pipelines):
                name = f"curve-prepack-{'on' if on else 'off'}{suffix}" + (f"-{layout}" if layout else "")
                variants.append(Variant(on, batch, population, layout, Device(
                    name, "local", "bench-tuning-cpu", {"kind": "llvm"}, weight_prepack=on, layout=layout), store))
        if args.bench_only:
            print(f"model {model.name}: no tuning, the records of {work}; in turns: "
                  f"{'; '.join(v.label for v in variants)}", flush=True)
        else:
            untuned = bench_run(tracker, variants[0].device, model, variants[0].store, work, config, tuned=False)
            print(f"model {model.name}: TVM untuned {median(untuned.result.steady_samples_s) * 1e3:.3g} ms · "
                  f"onnxruntime {reference_s(untuned) * 1e3:.3g} ms ({compared(untuned)}); in turns: "
                  f"{'; '.join(v.label for v in variants)}; benched after {', '.join(f'{p:g}' for p in args.points)} "
                  "accumulated minutes", flush=True)
        print("curve                   minutes  sessions  trials  TVM tuned   onnxruntime  TVM vs onnxruntime            "
              "     coverage", flush=True)
        for point in ([] if args.bench_only else args.points):
            for v in variants:  # sessions in turns: the host's load falls on every curve
                start = time.monotonic()
                outcome = tune_model(tracker, v.device, model, v.store, work / "tune",
                                     TuneConfig(trials=100_000, minutes=point - v.seconds / 60,
                                                trials_per_iter=v.batch, population=v.population),
                                     progress=progress)
                v.seconds += time.monotonic() - start
                v.trials += outcome.trials_done
                v.sessions += 1
            for v in variants:
                cell = bench_run(tracker, v.device, model, v.store, work, config, tuned=True)
                tuned_s, ref_s = median(cell.result.steady_samples_s), reference_s(cell)
                if ref_s and (v.best is None or tuned_s / ref_s < v.best[0]):
                    v.best = (tuned_s / ref_s, v.seconds / 60)
                print(f"{v.label:22s}  {v.seconds / 60:7.1f}  {v.sessions:8d}  {v.trials:6d}  "
                      f"{tuned_s * 1e3:7.3g} ms  {ref_s * 1e3:8.3g} ms  {compared(cell):33s}  {coverage_of(cell)}",
                      flush=True)
        if args.confirm:
            confirm(args.confirm, tracker, variants, model, work, config)
        for v in variants:
            ratio, minutes = v.best or (float("inf"), 0.0)
            verdict = "reached" if ratio <= 1 else "not reached"
            print(f"P1 ({v.label}): TVM tuned at least as fast as onnxruntime on the same threads: {verdict}; "
                  f"TVM / onnxruntime {ratio:.2f} ({v.judged_on}"
                  f"{'' if args.bench_only else f', {minutes:.1f} min of tuning'})", flush=True)
            if ratio > 1:
                print_slowest_tasks(v.store, v.device, model)
        if args.shared:  # P1b: a model sharing the tuned convs (another epilogue), no session of its own
            other = load_model(str(leaky_variant(args.model, work)))
            for v in variants:
                cell = bench_run(tracker, v.device, other, v.store, work, config, tuned=True)
                print(f"P1b ({v.label}): {other.name} ({args.model}'s convs, LeakyRelu epilogues), compiled with "
                      f"the farm's records, no session of its own: TVM {median(cell.result.steady_samples_s) * 1e3:.3g} "
                      f"ms · onnxruntime {reference_s(cell) * 1e3:.3g} ms ({compared(cell)}); {coverage_of(cell)}",
                      flush=True)
    return 0


def print_slowest_tasks(store, device, model, top: int = 5) -> None:
    """The tasks that hold the tuned model back: the top ``top`` by share of its time (call sites × the best
    stored record, the untuned code's where a task has no schedule), each with its best time and its FLOPs as
    TVM counts them (``estimate_tir_flops``), in GFLOP/s."""
    import tvm  # after farm's imports, which load TVM without PyTorch
    from tvm.s_tir.analysis import estimate_tir_flops

    target = effective_target(device)
    tvm_target = make_target(target)
    tasks = extract_tasks(device_tuning_module(model, device, target), tvm_target, model)
    tuning = tuning_set(store, device)
    with tempfile.TemporaryDirectory(prefix="farm-bench-tasks-") as tmp:
        exact, _ = record_databases(tuning, Path(tmp))
        normalize = tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod")
        rows = []
        for task in tasks:
            record = exact.query_tuning_record(normalize(task.dispatched[0]), tvm_target, task.task_name)
            seconds = record_s(record.run_secs) if record is not None else None
            scheduled = record is not None and is_schedule(record.trace)
            flops = float(estimate_tir_flops(task.dispatched[0]))
            rows.append((task.task_name, task.weight, seconds, scheduled, flops))
    total = sum(weight * s for _, weight, s, _, _ in rows if s)
    print(f"  top {top} tasks by share of the tuned model's time (call sites × best record; {len(rows)} tasks):",
          flush=True)
    for name, weight, seconds, scheduled, flops in sorted(rows, key=lambda r: -(r[1] * (r[2] or 0)))[:top]:
        if seconds is None:
            print(f"    {name}: no record", flush=True)
            continue
        print(f"    {name}: {weight * seconds / total:5.1%} of the time, {weight} call(s), best {seconds * 1e6:.1f} µs "
              f"{'(tuned)' if scheduled else '(untuned code)'}, {flops / 1e6:.1f} MFLOP, "
              f"{flops / seconds / 1e9:.1f} GFLOP/s", flush=True)


def scaling(args) -> int:
    work = Path(args.work or tempfile.mkdtemp(prefix="farm-bench-scaling-"))
    model = load_model(args.model)
    budget = (f"{args.session_minutes:g} min" if args.session_minutes else f"{args.trials} trials") + " a session"
    print(f"model {model.name}, {budget}, candidate cooldown {args.candidate_cooldown:g} s, tasks by share, "
          f"{'each batch built, then measured' if args.build_first else 'builds ahead'}", flush=True)
    print("K  cooldown  turns  measured  minutes  trials/min  device busy  device idle", flush=True)
    rates = {}
    for k, cooldown, turns in ((1, args.candidate_cooldown, True), (2, args.candidate_cooldown, False),
                               (2, args.candidate_cooldown, True), (2, 0.0, True)):
        keys = {f"twin-{i}": "bench-twins" for i in range(k)}
        device = Device("twins", "local", "bench-twins", {"kind": "llvm"})
        run = work / f"k{k}-c{cooldown:g}-{'turns' if turns else 'one'}"
        with private_farm(run, keys) as tracker, Store(run / "results.db") as store:
            outcome = tune_model(tracker, device, model, store, run / "tune",
                                 TuneConfig(trials=100_000 if args.session_minutes else args.trials,
                                            minutes=args.session_minutes, max_runners=k, candidate_cooldown_s=cooldown,
                                            fresh_cost_model=True, builds_ahead=not args.build_first, take_turns=turns),
                                 progress=progress)
            wall = outcome.search_seconds  # builds and measurements: the session's set-up and profile excluded
        share = outcome.device_busy_seconds / (outcome.runners * wall)  # sessions held on candidates, measured
        rates[(k, cooldown, turns)] = outcome.candidates_measured / (wall / 60)  # the search's (no untuned record)
        print(f"{outcome.runners}  {cooldown:8g}  {'yes' if turns else 'no':5s}  {outcome.candidates_measured:8d}  "
              f"{wall / 60:7.2f}  {rates[(k, cooldown, turns)]:10.1f}  {share:11.0%}  {1 - share:11.0%}", flush=True)
    base = rates[(1, args.candidate_cooldown, True)]
    print(f"scaling at K = 2 with cooldown: {rates[(2, args.candidate_cooldown, True)] / base:.2f}x (goal >= 1.6x; "
          f"one task a search: {rates[(2, args.candidate_cooldown, False)] / base:.2f}x); "
          f"K = 2 without cooldown: {rates[(2, 0.0, True)]:.1f} trials/min", flush=True)
    return 0


def prepack(args) -> int:
    work = Path(args.work or tempfile.mkdtemp(prefix="farm-bench-prepack-"))
    model = load_model(args.model)
    devices = {on: Device(f"prepack-{'on' if on else 'off'}", "local", "bench-prepack-cpu", {"kind": "llvm"},
                          weight_prepack=on) for on in (False, True)}
    config = BenchConfig(repeat=15, min_repeat_ms=100, timeout_s=60)
    budget = (f"{args.sessions} session(s) of {args.session_minutes:g} min" if args.session_minutes else
              f"{args.sessions} session(s) of {args.trials} trials") if args.sessions else f"the records in {work}"
    with private_farm(work, {"prepack": "bench-prepack-cpu"}) as tracker, Store(work / "results.db") as store:
        untuned = bench_run(tracker, devices[False], model, store, work, config, tuned=False)
        print(f"model {model.name}, {budget} per pipeline; TVM untuned "
              f"{median(untuned.result.steady_samples_s) * 1e3:.3g} ms · onnxruntime "
              f"{reference_s(untuned) * 1e3:.3g} ms ({compared(untuned)})", flush=True)
        tuned = {on: (0, 0.0) for on in devices}  # trials, minutes
        for _ in range(args.sessions):  # the pipelines' sessions in turns too: the host's load falls on both
            for on, device in devices.items():
                start = time.monotonic()
                outcome = tune_model(tracker, device, model, store, work / "tune",
                                     TuneConfig(trials=100_000 if args.session_minutes else args.trials,
                                                minutes=args.session_minutes), progress=progress)
                tuned[on] = (tuned[on][0] + outcome.trials_done, tuned[on][1] + (time.monotonic() - start) / 60)
        times = bench_in_turns(tracker, devices, model, store, work, config, tuned, args.rounds)
    ratios = [on_s / off_s for off_s, on_s in zip(times[False], times[True])]
    print(f"prepacking on / off, TVM tuned, round by round: {', '.join(f'{r:.2f}' for r in ratios)}; median "
          f"{median(ratios):.2f} (< 1: faster with prepacking)", flush=True)
    return 0


def bench_in_turns(tracker, devices, model, store, work, config, tuned, rounds: int) -> dict[bool, list[float]]:
    """Each pipeline's tuned model benched beside onnxruntime, in turns (off, on, off, on …): its rows, and TVM's
    steady medians per pipeline in round order."""
    print("prepack  round  records  trials  tuning min  TVM tuned    onnxruntime  TVM vs onnxruntime                 "
          "coverage        main calls", flush=True)
    times: dict[bool, list[float]] = {False: [], True: []}
    for round_ in range(1, rounds + 1):
        for on, device in devices.items():
            cell = bench_run(tracker, device, model, store, work, config, tuned=True)
            times[on].append(median(cell.result.steady_samples_s))
            calls = main_calls(cell.artifact.path)
            packed = sum(c.endswith("_prepacked") for c in calls)
            repacking = sum(c.endswith("_weight_prepack") for c in calls)
            records = len(store.tuning_lines(device_tuning_key(device))[1])
            print(f"{'on' if on else 'off':7s}  {round_:5d}  {records:7d}  {tuned[on][0]:6d}  {tuned[on][1]:10.1f}  "
                  f"{times[on][-1] * 1e3:8.3g} ms  {reference_s(cell) * 1e3:8.3g} ms  {compared(cell):33s}  "
                  f"{coverage_of(cell):14s}  {packed} on prepacked weights, {repacking} repacking", flush=True)
    return times


def minutes_list(text: str) -> list[float]:
    points = [float(p) for p in text.split(",")]
    if not points or any(b <= a for a, b in zip([0.0] + points, points)):
        raise argparse.ArgumentTypeError("give increasing minutes above 0, e.g. 10,20,40,60")
    return points


def pipeline_list(text: str) -> list[bool]:
    names = {"off": False, "on": True}
    if not text or any(p not in names for p in text.split(",")):
        raise argparse.ArgumentTypeError("give off, on or off,on")
    return list(dict.fromkeys(names[p] for p in text.split(",")))


def layout_list(text: str) -> list[str]:
    if not text or any(layout not in LAYOUTS for layout in text.split(",")):
        raise argparse.ArgumentTypeError(f"give {', '.join(LAYOUTS)} or both, comma-separated")
    return list(dict.fromkeys(text.split(",")))


def count_list(example: str):
    """An argparse type: whole numbers >= 1, comma-separated (``example`` in its error)."""
    def parse(text: str) -> list[int]:
        try:
            counts = [int(b) for b in text.split(",")]
        except ValueError:
            counts = []
        if not counts or min(counts) < 1:
            raise argparse.ArgumentTypeError(f"give whole numbers, e.g. {example}")
        return list(dict.fromkeys(counts))
    return parse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: onnx:squeezenet (curve), convnet (--scaling)")
    parser.add_argument("--points", type=minutes_list, default=[10.0, 20.0, 40.0, 60.0],
                        help="curve: accumulated tuning minutes after which each pipeline is benched (default 10,20,40,60)")
    parser.add_argument("--pipelines", type=pipeline_list, default=[False, True],
                        help="curve: weight prepacking off, on, or off,on (default: both, in turns)")
    parser.add_argument("--batches", type=count_list("16,64"), default=[None],
                        help="curve: candidates a batch, e.g. 16,64: a curve each (own store), in turns (default: "
                             "farm's own)")
    parser.add_argument("--populations", type=count_list("512,128"), default=[None],
                        help="curve: the evolutionary search's population, e.g. 512,128: a curve each (own store), in "
                             "turns (default: farm's own)")
    parser.add_argument("--layouts", type=layout_list, default=[None],
                        help="curve: the convolutions' layout, model (its own), NHWC, or model,NHWC: a curve each, in "
                             "turns (default: farm's own, NHWC on this host's CPU)")
    parser.add_argument("--confirm", type=int, default=0, metavar="N",
                        help="curve: after the last point, each tuned model benched N more times beside onnxruntime, "
                             "in turns; P1 is judged on their median ratio (default 0: on the points' best)")
    parser.add_argument("--bench-only", action="store_true",
                        help="curve: no tuning; bench what a run's --work store holds (with --confirm N)")
    parser.add_argument("--no-shared", dest="shared", action="store_false",
                        help="curve: skip the last step, a model sharing the tuned convs compiled with no session")
    parser.add_argument("--scaling", action="store_true", help="trials/min at K = 1 and 2 servers of one key")
    parser.add_argument("--prepack", action="store_true",
                        help="weight prepacking off and on: the same sessions each, then both benched in turns")
    parser.add_argument("--sessions", type=int, default=1,
                        help="--prepack: tuning sessions per pipeline (default 1; 0: bench the records --work holds)")
    parser.add_argument("--rounds", type=int, default=3, help="--prepack: benches of each pipeline, in turns (default 3)")
    parser.add_argument("--trials", type=int, default=48, help="--scaling, --prepack: trials a session (default 48)")
    parser.add_argument("--session-minutes", type=float, default=None,
                        help="--scaling, --prepack: bound each session by minutes instead of --trials")
    parser.add_argument("--candidate-cooldown", type=float, default=2.0,
                        help="--scaling: the device's rest after each candidate, seconds (default 2)")
    parser.add_argument("--build-first", action="store_true",
                        help="--scaling: build each batch before measuring it (the default for this host's CPU)")
    parser.add_argument("--work", default=None, help="keep the stores and caches here (default: a temp dir)")
    args = parser.parse_args()
    if args.bench_only and not (args.confirm and args.work):
        parser.error("--bench-only benches the models a run tuned: give its --work DIR and --confirm N")
    args.model = args.model or ("convnet" if args.scaling or args.prepack else "onnx:squeezenet")
    if args.prepack:
        return prepack(args)
    return scaling(args) if args.scaling else curve(args)


if __name__ == "__main__":
    sys.exit(main())
