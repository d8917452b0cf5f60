"""farm bench: compile, push, measure, check and store one model on one device, beside its reference runtime."""

from __future__ import annotations

import argparse

from dataclasses import asdict

from farm.errors import FarmError
from farm.stats import format_duration, median, memory_text, versus_text

from farm.cli.common import (MODEL_HELP, add_bench_options, add_progress, add_shape_option, add_variant_options, add_verb,
                             bench_config, duration, emit_json, home_dir, inventory_and_device, load_with_variant,
                             progress_printer, reference_text, threads_label)


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "bench", run, "compile, push, measure, check and store one model on one device",
                 "Steps: session, upload, load, first run, steady state (time_evaluator, raw repeats),\n"
                 "device→host copy per output, output check. A failed step is stored with its reason;\n"
                 "the command then prints `error:` and exits 1.\n\n"
                 "Then the same model in the runtime users would otherwise ship, with the same inputs, warm-up\n"
                 "and repeat statistics (onnxruntime for ONNX, LiteRT for TFLite, torch for torch.export; wall\n"
                 "time per call, intra-op threads = the count TVM's session reported), stored as that runtime's run:\n"
                 "  TVM 8.1 ms · onnxruntime 2.6 ms (TVM 3.1× slower, 2 threads each)\n"
                 "It runs only where the device's code runs on this host (local, opencl's host CPU); elsewhere\n"
                 "farm says 'no reference runtime on this device', never a host figure as the device's.")
    p.add_argument("--device", required=True, help="inventory device name")
    p.add_argument("--model", required=True, help=MODEL_HELP)
    add_shape_option(p)
    p.add_argument("--reference", help="expected outputs instead of onnxruntime's: a .npz (np.savez order), or a "
                   "test_data_set folder (input_N.pb + output_N.pb: its inputs are used too). Default for an ONNX file "
                   "with a test_data_set_0 folder beside it: that folder")
    p.add_argument("--untuned", action="store_true", help="ignore the store's tuning records for this device")
    p.add_argument("--tvm-only", action="store_true", help="do not time the reference runtime beside TVM")
    add_variant_options(p)
    add_progress(p)
    add_bench_options(p, profile=True)


def run(args: argparse.Namespace) -> int:
    from farm.store import Store
    from farm.sweep import bench_cell

    inventory, device = inventory_and_device(args)
    model = load_with_variant(args)
    with Store(args.db) as store:
        cell = bench_cell(inventory.tracker, device, model, store, home_dir() / "cache", bench_config(args),
                          reference_file=args.reference, progress=progress_printer(args.progress), tuned=not args.untuned,
                          reference_runtime=not args.tvm_only)
    if args.json:
        emit_json(bench_json(cell, device))
    else:
        print_bench(cell)
        if cell.fallback is not None:
            print_bench(cell.fallback)
        print(versus_line(cell.fallback if cell.fallback is not None and cell.result.status != "ok" else cell,
                          cell.reference))
        if cell.result.profile is not None:
            print_profile(cell.result.profile,
                          median(cell.result.steady_samples_s) if cell.result.steady_samples_s else None)
            reference = cell.reference.result if cell.reference is not None else None
            ref = reference.profile if reference is not None else None
            if reference is not None and ref is not None and ref.status == "ok" and cell.result.profile.status == "ok":
                from farm.analysis.kernel_diff import class_versus_text

                print(f"  beside {reference.runtime}'s own profile (same threads and inputs; by op class): "
                      + class_versus_text(cell.result.profile, ref, reference.runtime))
            elif reference is not None and ref is not None:
                print(f"  {reference.runtime}'s profile: not available: {ref.reason}")
    r = cell.result
    if r.status != "ok":
        fallback = "" if cell.fallback is None else \
            f"; measured on its CPU instead as run {cell.fallback.run_id} ({cell.fallback.result.status})"
        raise FarmError(r.reason, f"{r.hint or 'the failed run is stored; see farm results'} (stored as run {cell.run_id}"
                                  f"{fallback})")
    return 0


def print_profile(profile, steady_s: float | None, top: int = 10) -> None:
    """Where the time goes: by op class, then the top kernels, the kernels' sum against ``main`` and the steady
    median."""
    if profile.status != "ok":
        print(f"profile: not available: {profile.reason}")
        return
    steady = f", steady median {format_duration(steady_s)}" if steady_s else ""
    print(f"where the time goes ({profile.runs} runs of their own, {profile.clock}): kernels "
          f"{format_duration(profile.kernel_sum_s)} of main's {format_duration(profile.main_s)}{steady}; the rest (VM calls, "
          f"what lies between calls) {format_duration(profile.main_s - profile.kernel_sum_s)}")
    print("  by op class: " + " · ".join(f"{label} {format_duration(s)} ({s / profile.main_s:.0%})"
                                         for label, s in profile.by_class().items()))
    for kernel in profile.top(top):
        rate = f"{kernel.gflops:7.2f} GFLOP/s" if kernel.gflops is not None else " " * 15
        print(f"  {kernel.name:44s} {kernel.op_class:18s} {kernel.calls:5.3g}×  {format_duration(kernel.time_s):>9s}  "
              f"{kernel.time_s / profile.main_s:5.1%}  {rate}  {kernel.schedule}")


def versus_line(cell, reference) -> str:
    """'TVM 8.1 ms · onnxruntime 2.6 ms (TVM 3.1× slower, 2 threads each)   [onnxruntime 1.20, run 4]', or why there
    is no reference figure (then TVM's threads alone): ``common.reference_text``."""
    tvm_s = median(cell.result.steady_samples_s) if cell.result.status == "ok" else None
    tvm = f"TVM {duration(tvm_s)}" if tvm_s else f"TVM {cell.result.status}"
    ref = reference
    ok = ref is not None and ref.result.status == "ok"
    where = f"   [{ref.result.runtime} {ref.result.runtime_version}, run {ref.run_id}]" if ok else ""
    return f"{tvm}{' ' if ref is None else ' · '}{reference_text(cell.result, ref)}{where}"


def reference_json(reference) -> dict | None:
    """The reference runtime's run as `farm bench --json` prints it (None where no reference runtime runs)."""
    if reference is None:
        return None
    r = reference.result
    return {"run_id": reference.run_id, "runtime": r.runtime, "runtime_version": r.runtime_version, "status": r.status,
            "reason": r.reason, "failed_step": r.failed_step, "load_s": r.load_s, "first_run_s": r.first_run_s,
            "steady_median_s": median(r.steady_samples_s), "steady_number": r.steady_number,
            "steady_samples_s": list(r.steady_samples_s), "steady_clock": r.steady_clock, "threads": r.threads,
            "threads_by": r.context.get("threads_by"), "how_timed": r.context.get("how_timed"),
            "settings": r.context.get("runtime_settings"),
            "check": asdict(r.check), "profile": r.profile.to_json() if r.profile is not None else None}


def bench_json(cell, device) -> dict:
    """One cell as `farm bench --json` prints it. The steady figure says its clock (wall, or kernel on OpenCL)."""
    r = cell.result
    data = {
        "run_id": cell.run_id, "status": r.status, "reason": r.reason, "failed_step": r.failed_step,
        "device": r.device, "key": r.key, "model": r.model, "upload_s": r.upload_s, "load_s": r.load_s,
        "first_run_s": r.first_run_s, "first_run_cold_s": r.first_run_s, "load_warm_s": r.load_warm_s,
        "first_run_warm_s": r.first_run_warm_s, "kernel_cache": r.context.get("kernel_cache"),
        "steady_median_s": median(r.steady_samples_s), "steady_number": r.steady_number,
        "steady_samples_s": list(r.steady_samples_s), "steady_clock": r.steady_clock,
        "steady_wall_median_s": median(r.steady_wall_samples_s), "steady_wall_number": r.steady_wall_number,
        "steady_wall_samples_s": list(r.steady_wall_samples_s),
        "threads": r.threads, "threads_by": r.context.get("threads_by"),
        "copy_s": [{"output": c.output_index, "bytes": c.nbytes, "shape": list(c.shape), "dtype": c.dtype,
                    "number": c.number, "median_s": median(c.samples_s),
                    "samples_s": list(c.samples_s)} for c in r.copies],
        "check": asdict(r.check),
        "profile": r.profile.to_json() if r.profile is not None else None, "profile_s": r.context.get("profile_s"),
        "artifact": cell.artifact.path if cell.artifact else None, "emulated": device.emulated,
        "tuned_tasks": cell.artifact.tuned_tasks if cell.artifact else 0,
        "fallback_of": r.fallback_of,
        "memory": {"params_bytes": r.params_bytes, "planned_host_bytes": r.planned_host_bytes,
                   "planned_device_bytes": r.planned_device_bytes, "rss_before_load_bytes": r.rss_before_load_bytes,
                   "rss_after_load_bytes": r.rss_after_load_bytes, "rss_peak_bytes": r.rss_peak_bytes,
                   "total_bytes": r.context.get("memory_total_bytes"), "measured": r.context.get("memory"),
                   "text": bench_memory_text(r, device.emulated)},
    }
    if r.steady_clock == "kernel":
        data["steady_kernel_samples_s"] = data["steady_samples_s"]
        data["steady_kernel_median_s"] = data["steady_median_s"]
    if cell.fallback is not None:
        data["fallback"] = bench_json(cell.fallback, device)
    if cell.reference is not None or cell.fallback is None and r.fallback_of is None:
        data["reference"] = reference_json(cell.reference)
        ok = cell.reference is not None and cell.reference.result.status == "ok"
        data["versus_reference"] = versus_text(data["steady_median_s"], data["reference"]["steady_median_s"] if ok else None,
                                               cell.reference.result.runtime if ok else "", r.threads,
                                               cell.reference.result.threads if ok else None)
    return data


def print_bench(cell) -> None:
    r = cell.result
    label = "on the CPU, fallback for run %d: " % r.fallback_of if r.fallback_of else ""
    print(f"run {cell.run_id}: {label}{r.device} · {r.model}: {r.status}" + (f" at {r.failed_step}" if r.failed_step else ""))
    print(f"  load {duration(r.load_s)}   first run cold {duration(r.first_run_s)}   "
          f"warm {duration(r.first_run_warm_s)} (load {duration(r.load_warm_s)})")
    print(f"  steady median {duration(median(r.steady_samples_s))} {r.steady_clock} time ({len(r.steady_samples_s)} repeats × "
          f"{r.steady_number or 0} calls) on {threads_label(r.threads)}"
          + (f" ({r.context['threads_by']})" if r.context.get("threads_by") else ""))
    if r.steady_wall_samples_s:
        print(f"  steady median {duration(median(r.steady_wall_samples_s))} wall time per call + sync "
              f"({len(r.steady_wall_samples_s)} repeats × {r.steady_wall_number} calls)")
    for c in r.copies:
        print(f"  copy output {c.output_index} ({c.nbytes} B): {duration(median(c.samples_s))}")
    if r.params_bytes is not None or r.rss_before_load_bytes is not None:
        print(f"  memory: {bench_memory_text(r, r.context.get('emulated', False))}")
    err = r.check.max_abs_err
    print(f"  check: {r.check.status}" + (f" (max abs error {err:.3g})" if err is not None else ""))


def bench_memory_text(r, emulated: bool) -> str:
    """'params 4.8 MB · planned activations 1.2 MB · process peak RSS +9.6 MB' (stats.memory_text) of a result."""
    peak = None if r.rss_peak_bytes is None or r.rss_before_load_bytes is None else \
        r.rss_peak_bytes - r.rss_before_load_bytes
    return memory_text(r.params_bytes, r.planned_host_bytes, r.planned_device_bytes, peak, emulated)
