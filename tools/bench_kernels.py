#!/usr/bin/env python3
"""Where a tuned model's time goes, kernel by kernel, on this host's CPU: one run, its figures.

The model is compiled with the store's records for an inventory device of this host (kind "local"), as `farm bench`
compiles it, and run here by the Relax VM on the device's threads (TVM_NUM_THREADS, read back from
runtime.NumThreads). An instrument times every call `main` makes (the first --warmup runs dropped, then the median
of --runs): each kernel's time inside the model, beside the same kernel called alone on the tensors the model
passed it, back to back and cold (every tensor but the first flushed from the CPU's caches before each call, by
TVM's cache_flush_cpu_non_first_arg, as `farm tune` times a CPU candidate: records.COLD_WEIGHTS_RULE), and beside
its task's best record in the store (what `farm tune` measured, and what its shares and bench_tuning's "top 5
tasks" go by; "-": no schedule of its own, never searched or its untuned code won). The instrument's own cost a
call is printed too (the VM's cheapest builtin, timed the same way).

--reference: then the reference runtime's side (ONNX models: onnxruntime, on the same threads and inputs, with the
options `farm bench` gives it, timed first in a process of its own), node by node by its own profiler: each op
type's time a run, and its slowest nodes. Kernels do not map one to one (each runtime fuses its own way), op types
do: squeezenet's concatenations took 2.4× onnxruntime's time this way, which no record showed.

    .venv/bin/python tools/bench_kernels.py --device x86-local --model onnx:squeezenet --db .farm/results.db
    .venv/bin/python tools/bench_kernels.py --device x86-local --model onnx:squeezenet --reference

--records N [--tasks a,b]: then each task's N best records built and timed alone, back to back (as `farm tune` timed
candidates before it flushed weights) and cold: whether the two rank schedules alike.

What it showed on squeezenet: docs/benchmarks.md, "Where a tuned squeezenet's time goes".
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default=os.environ.get("FARM_DEVICES", "devices.toml"), help="inventory file")
    parser.add_argument("--device", required=True, help="an inventory device of kind local (this host's CPU)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--db", default=os.environ.get("FARM_DB", ".farm/results.db"),
                        help="the SQLite store holding the device's tuning records")
    parser.add_argument("--runs", type=int, default=30, help="runs of main timed call by call (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="runs dropped first (default 5)")
    parser.add_argument("--reference", action="store_true",
                        help="then onnxruntime's time by op type and node, by its profiler (ONNX models)")
    parser.add_argument("--top", type=int, default=15, help="the reference's slowest nodes listed (default 15)")
    parser.add_argument("--records", type=int, default=0, metavar="N",
                        help="then each task's N best records timed alone, back to back and cold (default 0: none)")
    parser.add_argument("--tasks", default="", help="--records: only tasks whose name holds one of these (comma-separated)")
    args = parser.parse_args()

    from farm.errors import FarmError
    from farm.inventory import load_inventory
    from farm.records import online_cpus, threads_setting

    try:
        device = load_inventory(args.devices).devices.get(args.device)
    except FarmError as exc:
        return fail(exc.message, exc.hint)
    if device is None or device.kind != "local":
        return fail(f"{args.device!r} is not a device of kind local in {args.devices}",
                    "this tool runs the model in its own process, on this host's CPU: name such a device")
    threads = threads_setting(device) or online_cpus()  # what farm's servers give TVM (records.THREADS_RULE)
    os.environ["TVM_NUM_THREADS"] = str(threads)  # before TVM starts its thread pool, as farm's servers set it
    return kernels(device, args, threads)


def kernels(device, args, threads: int) -> int:

    from farm.compile import compile_model
    from farm.models import load_model, make_inputs
    from farm.store import Store
    from farm.tune.tuning_set import tuning_set

    model = load_model(args.model)
    if args.reference and model.frontend != "onnx":
        return fail(f"--reference profiles onnxruntime, and {model.name} is a {model.frontend} model",
                    "leave out --reference for this model")
    if not Path(args.db).is_file():
        return fail(f"{args.db}: no such store", "pass --db PATH: the SQLite file farm tune wrote the records to")
    with Store(Path(args.db), readonly=True) as store:
        tuning = tuning_set(store, device)
    given = make_inputs(model)
    reference = []
    if args.reference:  # first, in a fresh process: in this one, after TVM compiled or ran the model, onnxruntime's
        # run took 3.3-3.6 ms against 1.6-1.7 in a process of its own (not understood; not farm bench's order)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            reference = pool.submit(reference_kernels, model, given, threads, args.warmup, args.runs, args.top).result()
    with tempfile.TemporaryDirectory(prefix="farm-bench-kernels-") as cache:
        return timed(model, device, compile_model(model, device, Path(cache), tuning), tuning, given, reference, args,
                     threads)


def timed(model, device, artifact, tuning, given: dict, reference: list[str], args, threads: int) -> int:
    """The tables: ``artifact`` run here call by call, then ``reference``'s lines."""
    import numpy as np
    import tvm
    from tvm import relax

    reported = tvm.get_global_func("runtime.NumThreads")()
    dev = tvm.cpu()
    vm = relax.VirtualMachine(tvm.runtime.load_module(artifact.path), dev)
    inputs = [tvm.runtime.tensor(given[spec.name], dev) for spec in model.inputs]
    whole = vm.time_evaluator("main", dev, number=10, repeat=5)(*inputs).results

    runs = args.warmup + args.runs
    times: dict[str, list[float]] = {}  # each symbol's time in each run of main (its calls summed)
    counts: dict[str, list[int]] = {}  # ... and its calls in each run
    calls: dict[str, tuple] = {}  # each kernel's function and the tensors of its first call
    started: dict[str, float] = {}
    run = [0]  # the run of main being timed

    def instrument(func, symbol, before, _ret, *call_args):
        now = time.perf_counter()
        if before:
            started[symbol] = now
            calls.setdefault(symbol, (func, call_args))
        else:
            times.setdefault(symbol, [0.0] * runs)[run[0]] += now - started[symbol]
            counts.setdefault(symbol, [0] * runs)[run[0]] += 1
        return 0

    vm.set_instrument(instrument)
    flush_cache = tvm.get_global_func("cache_flush_cpu_non_first_arg")  # TVM's, as its time_evaluator's f_preproc
    for i in range(runs):
        run[0] = i
        vm["main"](*inputs)
    records = task_records(model, device, tuning)
    print(f"{model.name} on {device.name} ({len(tuning.records)} records; {artifact.tuned_tasks}/{artifact.total_tasks} "
          f"tasks tuned), {reported} TVM threads as runtime.NumThreads reports ({threads} set): main "
          f"{np.median(whole) * 1e3:.2f} ms (median of 5 × 10 runs)")
    print(f"{'kernel':44s} {'calls':>5s}  {'in model':>10s}  {'alone':>10s}  {'cold':>10s}  {'record':>10s}   "
          "(µs a run of main)")
    rows = []
    for symbol, samples in times.items():
        per_run = max(counts[symbol][args.warmup:])
        in_model = float(np.median(samples[args.warmup:]))
        alone = cold = None
        if not symbol.startswith("vm.builtin"):
            func, call_args = calls[symbol]
            alone, cold = (per_run * call_alone(func, call_args, flush) for flush in (None, flush_cache))
        record = records.get(symbol.removesuffix("_prepacked"))
        rows.append((in_model, symbol, per_run, alone, cold, per_run * record if record else None))
    for in_model, symbol, per_run, alone, cold, record in sorted(rows, key=lambda r: r[0], reverse=True):
        print(f"{symbol:44s} {per_run:5d}  {in_model * 1e6:10.1f}  {fmt(alone)}  {fmt(cold)}  {fmt(record)}")
    floor = times.get("vm.builtin.null_value")
    if floor:
        print(f"the instrument's own cost: ~{np.median(floor[args.warmup:]) / max(counts['vm.builtin.null_value']) * 1e6:.2f} "
              "µs a call (vm.builtin.null_value, timed the same way)")
    else:
        print("the instrument's own cost: not measured (main calls no vm.builtin.null_value to time it by)")
    total = sum(r[0] for r in rows)
    unsearched = sum(r[0] for r in rows if r[5] is None and r[3] is not None)
    print(f"sum of the calls {total * 1e3:.2f} ms; kernels with no schedule of their own: {unsearched * 1e3:.2f} ms "
          f"({unsearched / total:.0%}); the kernels' sum alone: {sum(r[3] or 0 for r in rows) * 1e3:.2f} ms, cold: "
          f"{sum(r[4] or 0 for r in rows) * 1e3:.2f} ms; the records' sum: {sum(r[5] or 0 for r in rows) * 1e3:.2f} ms")
    if args.records:
        top_records(model, device, tuning, args.records, [t for t in args.tasks.split(",") if t])
    for line in reference:
        print(line)
    return 0


def top_records(model, device, tuning, count: int, names: list[str]) -> None:
    """Each task's ``count`` best records (by their stored time), each built as ``farm tune`` builds a candidate and
    timed here alone as ``farm tune`` timed it before it flushed weights (3 runs back to back, repeated until 20 ms)
    and cold (10 runs, each after ``cache_flush_cpu_non_first_arg``: records.COLD_WEIGHTS_RULE), the median of 3
    timings each: whether back-to-back times rank schedules as a model's cold weights do."""
    import numpy as np
    import tvm
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    from farm.compile import device_tuning_module, effective_target, make_target
    from farm.measure.vm import device_timer
    from farm.records import COLD_TIMING, WARM_TIMING
    from farm.tune.metaschedule import build_candidate, extract_tasks
    from farm.tune.database import prior_databases, record_s

    known = prior_databases(tuning)
    if known is None:
        print("\nno records to time")
        return
    target = effective_target(device)
    tvm_target, dev = make_target(target), tvm.cpu()
    normalize = tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod")
    print(f"\neach task's {count} best records alone (µs a call; record: as stored): back to back / cold")
    for task in extract_tasks(device_tuning_module(model, device, target), tvm_target, model):
        if names and not any(name in task.task_name for name in names):
            continue
        mod = normalize(task.dispatched[0])
        print(task.task_name)
        if not known[0].has_workload(mod):  # commit_workload only looks it up then (the databases' files are gone)
            print("  no record")
            continue
        for rank, record in enumerate(known[0].get_top_k(known[0].commit_workload(mod), count)):
            schedule = Schedule(mod)
            record.trace.apply_to_schedule(schedule, remove_postproc=False)
            lib = build_candidate(schedule.mod, tvm_target, None)
            args = [tvm.runtime.tensor(np.random.default_rng(rank).uniform(-1, 1, [int(d) for d in info.shape])
                                       .astype(str(info.dtype)), dev)
                    for info in ms.arg_info.ArgInfo.from_entry_func(schedule.mod, remove_preproc=True)]
            warm, cold = (device_timer(lib, lib.entry_name, dev, t.number, t.repeat, t.min_repeat_ms, t.f_preproc)
                          for t in (WARM_TIMING, COLD_TIMING))
            warm_s = np.median([np.mean(warm(*args)) for _ in range(3)])
            cold_s = np.median([np.mean(cold(*args)) for _ in range(3)])
            print(f"  #{rank}  record {fmt(record_s(record.run_secs))}  back to back {fmt(warm_s)}  cold {fmt(cold_s)}")


def reference_kernels(model, given: dict, threads: int, warmup: int, runs: int, top: int) -> list[str]:
    """onnxruntime's side, as lines to print: the model run ``warmup`` + ``runs`` times with its profiler on, each
    node's kernel time (its profiler's ``*_kernel_time`` events, a node once a run) the median of the timed runs, by
    op type and by node."""
    import json

    import numpy as np
    import onnxruntime

    from farm.models.runtimes import onnxruntime_options

    with tempfile.TemporaryDirectory(prefix="farm-bench-kernels-") as folder:
        options = onnxruntime_options(threads)
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "onnxruntime")
        session = onnxruntime.InferenceSession(model.data, options, providers=["CPUExecutionProvider"])
        feed = {spec.name: given[spec.name] for spec in model.inputs}
        whole = []
        for _ in range(warmup + runs):
            start = time.perf_counter()
            session.run(None, feed)
            whole.append(time.perf_counter() - start)
        events = json.loads(Path(session.end_profiling()).read_text())
    nodes: dict[tuple[str, str], list[float]] = {}  # (op type, node) → its kernel time in each run, in order
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            node = (event.get("args", {}).get("op_name", "?"), event["name"].removesuffix("_kernel_time"))
            nodes.setdefault(node, []).append(event["dur"] * 1e-6)
    timed = {node: float(np.median(samples[-runs:])) for node, samples in nodes.items()}
    by_type: dict[str, list[float]] = {}
    for (op_type, _), seconds in timed.items():
        by_type.setdefault(op_type, []).append(seconds)
    lines = [f"\nonnxruntime {onnxruntime.__version__} on {threads} threads (intra_op_num_threads), the same inputs, "
             f"in a process of its own: run {np.median(whole[warmup:]) * 1e3:.2f} ms with its profiler on (median of "
             f"{runs}); nodes' kernel times sum to {sum(timed.values()) * 1e3:.2f} ms",
             f"{'op type':24s} {'nodes':>5s}  {'µs a run':>10s}"]
    for op_type, times in sorted(by_type.items(), key=lambda t: sum(t[1]), reverse=True):
        lines.append(f"{op_type:24s} {len(times):5d}  {sum(times) * 1e6:10.1f}")
    lines.append(f"its {top} slowest nodes:")
    for (op_type, node), seconds in sorted(timed.items(), key=lambda t: t[1], reverse=True)[:top]:
        lines.append(f"  {op_type + ' ' + node:42s} {seconds * 1e6:10.1f}")
    return lines


def call_alone(func, call_args, flush=None, runs: int = 50) -> float:
    """One kernel called again and again on the same tensors: the median of ``runs`` calls (5 dropped first); with
    ``flush``, called on the tensors before each call, untimed."""
    samples = []
    for i in range(runs + 5):
        if flush is not None:
            flush(*call_args)
        start = time.perf_counter()
        func(*call_args)
        if i >= 5:
            samples.append(time.perf_counter() - start)
    return sorted(samples)[len(samples) // 2]


def task_records(model, device, tuning) -> dict[str, float]:
    """Each task's best record's time (seconds a call), by task name, where that record is a schedule: what
    ``farm tune`` plans by (``best_recorded``)."""
    from farm.compile import device_tuning_module, effective_target, make_target
    from farm.tune.metaschedule import extract_tasks
    from farm.tune.database import best_recorded, prior_databases

    known = prior_databases(tuning)
    if known is None:  # no records
        return {}
    target = effective_target(device)
    tvm_target = make_target(target)
    tasks = tuple(extract_tasks(device_tuning_module(model, device, target), tvm_target, model))
    return {task.task_name: secs for task, secs in zip(tasks, best_recorded(known[0], tasks, tvm_target)) if secs}


def fail(message: str, hint: str) -> int:
    print(f"error: {message}" + (f"\nhint: {hint}" if hint else ""), file=sys.stderr)
    return 1


def fmt(seconds: float | None) -> str:
    return f"{seconds * 1e6:10.1f}" if seconds is not None else f"{'-':>10s}"


if __name__ == "__main__":
    sys.exit(main())
