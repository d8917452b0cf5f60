#!/usr/bin/env python3
"""Where the time goes, measured: the per-kernel profile's sum against the steady figure, its cost per cell, and
whether a planted regression is put on the kernel it was planted in (#52). One run; its figures.

1. Sum against steady (``--part sum``): each (device, model) below benched as a sweep profiles it by default (a
   share of the cell: ``BenchConfig.profile_share``), on the repository's own devices.toml devices, brought up here
   on a private tracker: this host's CPU (x86-local: onnx:squeezenet and onnx:resnet50, untuned), the emulated arm64
   board (arm64-qemu: mlp, convnet) and OpenCL on POCL (pocl-gpu: mlp, convnet); then (unless --no-phone) the stand-
   in phone's CPU and arm64 OpenCL (phone-cpu, phone-gpu: mlp, convnet), as tests/test_android.py brings it up.
   Printed: the steady median (on a GPU its kernel clock, the OpenCL events' sum), main's time as the profile
   measured it, the kernels' sum (on a GPU each kernel on the device's event timer) and its ratio to the steady
   median, the profile step's cost in seconds and its share of the cell.
2. Planted regressions (``--part planted``): each model tuned on x86-local (--trials, --minutes), compiled with all
   its records and measured with its profile; then, for its --plants tasks holding the most time, compiled again
   with that task's records removed (the kernel goes back to TVM's default schedule) and measured again. Which
   kernels were planted is read from the two libraries (the kernel whose schedule went from tuned to untuned);
   `farm compare`'s rule (``kernel_diff``) must name one of them first, with >= 80 % of the change, and a night's
   confirmation (interleaved rounds, as ``farm regressions --confirm``) must confirm the plant. Last, the tuned
   library against itself: a night with no plant, which confirmation must not confirm (then no kernel is named);
   two sessions' samples, the test `farm compare` applies to two stored runs, are printed beside it.

    .venv/bin/python tools/bench_profile.py                      # both parts
    .venv/bin/python tools/bench_profile.py --part planted --trials 200 --plants 3

Threads: TVM's CPU pool as each device's server sets it (x86-local: half this host's CPUs, as TVM does), read back
from the session and printed with every figure.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUM_CELLS = (("x86-local", "onnx:squeezenet"), ("x86-local", "onnx:resnet50"), ("arm64-qemu", "mlp"),
             ("arm64-qemu", "convnet"), ("pocl-gpu", "mlp"), ("pocl-gpu", "convnet"))
PHONE_CELLS = (("phone-cpu", "mlp"), ("phone-cpu", "convnet"), ("phone-gpu", "mlp"), ("phone-gpu", "convnet"))
PHONE_GPU = ('target = { kind = "opencl", device = "mali" }\n'
             'host = { kind = "llvm", mtriple = "aarch64-linux-gnu", mattr = ["+neon"] }\n')
SHARE = 0.80  # the planted kernel's least share of the change


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("sum", "planted", "both"), default="both")
    parser.add_argument("--models", default="onnx:squeezenet;convnet:x=1,3,128,128",
                        help="planted: the models tuned, ';'-separated, each MODEL[:INPUT=d0,d1,...] (default: "
                             "squeezenet, and the built-in conv net at 128×128 so each kernel takes long beside the "
                             "instrument's own cost)")
    parser.add_argument("--trials", type=int, default=256, help="planted: tuning trials per model (default 256)")
    parser.add_argument("--minutes", type=float, default=8.0, help="planted: tuning minutes per model (default 8)")
    parser.add_argument("--plants", type=int, default=6,
                        help="planted: tasks planted per model (default 6: some records barely beat the untuned code, "
                             "and plant nothing)")
    parser.add_argument("--threads", type=int, default=1,
                        help="--part planted: TVM's threads on x86-local (default 1: on a 2-core VM the tracker and "
                             "servers share the cores, and a second thread's stalls blur single kernels); --part both "
                             "keeps the device's own setting, for both parts")
    parser.add_argument("--least-step", type=float, default=0.05,
                        help="planted: a plant counts as a regression when its steady median is this much slower and "
                             "its samples say slower (default 5 %%); a record that barely beat its untuned code plants "
                             "nothing, and is listed apart")
    parser.add_argument("--repeat", type=int, default=10, help="steady repeats per run (default 10)")
    parser.add_argument("--drift-nice", type=int, default=None, metavar="N",
                        help="planted: measure each plant again with a busy process per CPU at nice N beside it (a "
                             "session that drifted: nice 7 slows every kernel by about a fifth), and check the plant "
                             "keeps >= 80 %% of the change beyond the shift every kernel shared (#63)")
    parser.add_argument("--no-phone", action="store_true",
                        help="sum: leave out the stand-in phone (its own network namespace and adb server, under "
                             "qemu: needs root, adb, qemu-user and arm64 POCL, as tests/test_android.py)")
    parser.add_argument("--work", default=None, help="keep the store, cache and logs here (default: a temp dir)")
    args = parser.parse_args()
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)

    from farm.devices import bring_up
    from farm.inventory import load_inventory
    from farm.records import TrackerAddress
    from farm.procs.supervise import free_port, stop_process
    from farm.rpc.launch import start_tracker
    from farm.rpc.tracker import wait_for_servers

    work = Path(args.work or tempfile.mkdtemp(prefix="farm-bench-profile-"))
    inventory = load_inventory(REPO / "devices.toml")
    port = free_port()
    tracker = TrackerAddress("127.0.0.1", port)
    wanted = [d for d, _ in SUM_CELLS] if args.part != "planted" else []
    wanted += ["x86-local"] if args.part != "sum" else []
    devices = {name: replace(inventory.devices[name], key=f"{inventory.devices[name].key}-bench-{port}")
               for name in dict.fromkeys(wanted)}
    if args.part == "planted":  # the servers take their threads at start
        devices["x86-local"] = replace(devices["x86-local"], threads=args.threads)
    started, ok = [], True
    print(f"farm {__import__('farm').__version__}, commit {_commit()}, host {os.uname().nodename}: {os.cpu_count()} CPUs; "
          f"work {work}", flush=True)
    try:
        started.append(start_tracker(tracker.host, port, work))
        for device in devices.values():
            started.extend(bring_up(device, tracker, work))
        wait_for_servers(tracker, {d.key: 1 for d in devices.values()}, timeout_s=300)
        if args.part in ("sum", "both"):
            ok &= sum_against_steady(tracker, devices, work, args.repeat)
            if not args.no_phone:
                ok &= on_the_phone(tracker, work, args.repeat)
        if args.part in ("planted", "both"):
            ok &= planted(tracker, devices["x86-local"], work, args)
    finally:
        for record in reversed(started):
            stop_process(record)
    return 0 if ok else 1


def sum_against_steady(tracker, devices, work: Path, repeat: int, cells=SUM_CELLS, title: str = "") -> bool:
    from farm.models import load_model
    from farm.records import BenchConfig
    from farm.stats import median
    from farm.store import Store
    from farm.sweep import bench_cell

    print(f"\n1{title}. the kernels' sum against the steady median (untuned; on a GPU each kernel on its event "
          "timer, against the steady figure's kernel clock)")
    print(f"{'device':12s} {'model':16s} {'threads':>7s} {'steady':>11s} {'main':>11s} {'kernels':>11s} "
          f"{'kernels/steady':>14s} {'profile s':>9s} {'cell s':>7s} {'cost':>6s} {'device s':>8s} {'of dev':>7s} "
          f"{'manif ms':>8s}")
    ok = True
    with Store(work / "results.db") as store:
        for name, model_name in cells:
            device = devices[name]
            model = load_model(model_name)
            config = BenchConfig(repeat=repeat, min_repeat_ms=50, timeout_s=120,
                                 profile=True, profile_share=True)  # as a sweep profiles by default
            begun = time.perf_counter()
            cell = bench_cell(tracker, device, model, store, work / "cache", config, tuned=False,
                              reference_runtime=False)
            cell_s = time.perf_counter() - begun
            r, p = cell.result, cell.result.profile
            if r.status == "ok" and p is not None and p.reason.startswith("not profiled"):  # over its share: said
                print(f"{name:12s} {model_name:16s} {p.reason}")
                continue
            if r.status != "ok" or p is None or p.status != "ok":
                print(f"{name:12s} {model_name:16s} failed: {r.reason or (p.reason if p else 'no profile')}")
                ok = False
                continue
            steady = median(r.steady_samples_s)  # GPUs: the kernel clock (event sums), as the profile's kernels
            profile_s = r.context.get("profile_s") or 0.0
            device_s = (r.context.get("cell_s_before_profile") or 0.0) + profile_s  # session to the profile's end
            print(f"{name:12s} {model_name:16s} {r.threads!s:>7s} {ms(steady):>11s} {ms(p.main_s):>11s} "
                  f"{ms(p.kernel_sum_s):>11s} {p.kernel_sum_s / steady:14.3f} {profile_s:9.2f} {cell_s:7.1f} "
                  f"{profile_s / cell_s:6.1%} {device_s:8.1f} {profile_s / device_s if device_s else 0:7.1%} "
                  f"{r.context.get('manifest_s', 0.0) * 1e3:8.1f}   ({r.steady_clock} steady; "
                  f"{p.runs or 'first, counted'} profiled runs, {p.clock})", flush=True)
    return ok


def on_the_phone(tracker, work: Path, repeat: int) -> bool:
    """The stand-in phone's CPU and its arm64 OpenCL (POCL), farm's native server pushed over adb and run under qemu,
    as tests/test_android.py brings it up (tests/phone_lab.py), on the bench's tracker."""
    sys.path.insert(0, str(REPO))  # the stand-in phone lives with the tests that assert it
    from farm.devices import bring_up
    from farm.devices.pocl_arm64 import ensure_sysroot
    from farm.inventory import parse_inventory
    from farm.procs.supervise import stop_process
    from farm.rpc.tracker import wait_for_servers
    from tests.phone_lab import CPU_TARGET, standin_phone, standin_phone_table

    sysroot = ensure_sysroot()
    with standin_phone(work) as phone:
        tables = "".join(standin_phone_table(name, f"{name}-bench-{tracker.port}", phone, work / "phone-data" / "farm",
                                             root, rest)
                         for name, root, rest in (("phone-cpu", "/usr/aarch64-linux-gnu", CPU_TARGET),
                                                  ("phone-gpu", str(sysroot), PHONE_GPU)))
        devices = parse_inventory(f'[tracker]\nhost = "{tracker.host}"\nport = {tracker.port}\n{tables}').devices
        started = []
        try:
            for device in devices.values():
                started.extend(bring_up(device, tracker, work))
            wait_for_servers(tracker, {d.key: 1 for d in devices.values()}, timeout_s=300)
            return sum_against_steady(tracker, devices, work, repeat, PHONE_CELLS, "b (the stand-in phone)")
        finally:
            for record in reversed(started):
                stop_process(record)


def planted(tracker, device, work: Path, args) -> bool:
    from farm.compile import compile_model
    from farm.analysis.kernel_diff import kernel_diff, kernel_key
    from farm.measure import bench_artifact
    from farm.models import load_model, make_inputs
    from farm.records import BenchConfig, TuningSet
    from farm.analysis.regress import compare_samples
    from farm.store import Store
    from farm.sweep import tuning_set
    from farm.tune import TuneConfig, tune_model

    config = BenchConfig(repeat=args.repeat, min_repeat_ms=100, timeout_s=120, profile=True)
    print(f"\n2. planted regressions on {device.name}, {device.threads} thread(s) (tuned: --trials {args.trials} "
          f"--minutes {args.minutes:g} per model)")
    results, quiet, drift_results = [], [], []
    for spec in args.models.split(";"):
        # a store of its own per model: the device's tuning key would otherwise hold the other models' records too,
        # and each of their workloads would be compiled out for nothing
        with Store(work / f"planted-{spec.replace(':', '_').replace('/', '_')}.db") as store:
            model_name, _, shape = spec.rpartition(":") if "=" in spec else (spec, "", "")
            shapes = {shape.split("=")[0]: tuple(int(d) for d in shape.split("=")[1].split(","))} if shape else None
            model = load_model(model_name, shapes)
            inputs = make_inputs(model)
            begun = time.monotonic()
            outcome = tune_model(tracker, device, model, store, work / "tune" / model_name,
                                 TuneConfig(trials=args.trials, minutes=args.minutes))
            print(f"{model_name} {[i.shape for i in model.inputs]}: tuned {outcome.trials_done} trials in "
                  f"{(time.monotonic() - begun) / 60:.1f} min "
                  f"({outcome.status})", flush=True)
            full = tuning_set(store, device)
            base_artifact = compile_model(model, device, work / "cache", full)
            base = bench_artifact(tracker, device, base_artifact, inputs, None, config)
            if base.status != "ok" or base.profile is None or base.profile.status != "ok":
                print(f"{model_name}: the tuned run failed: {base.reason}")
                return False
            tuned_kernels = {n for n, f in base_artifact.kernels.items() if f["schedule"] == "tuned"}
            print(f"{model_name}: {len(tuned_kernels)}/{len(base_artifact.kernels)} kernels tuned; steady "
                  f"{ms(_median(base))} on {base.threads} thread(s)")
            plants = []
            # the workloads whose best record took longest first (a compile each: squeezenet has 26): the first
            # --plants of them that change a kernel's schedule are planted
            for index in sorted(range(len(full.workloads)), key=lambda i: -_record_s(full.records, i)):
                if len(plants) >= args.plants:
                    break
                records = tuple(line for line in full.records if not line.startswith(f"[{index},"))
                if len(records) == len(full.records):
                    continue
                trial = TuningSet(full.key, full.workloads, records)
                artifact = compile_model(model, device, work / "cache", trial)
                planted_kernels = {n for n in tuned_kernels if artifact.kernels.get(n, {}).get("schedule") != "tuned"}
                if planted_kernels:
                    plants.append((planted_kernels, artifact))
            for planted_kernels, artifact in plants:
                slow = bench_artifact(tracker, device, artifact, inputs, None, config)
                if slow.status != "ok" or slow.profile is None or slow.profile.status != "ok":
                    print(f"  {sorted(planted_kernels)}: the planted run failed: {slow.reason}")
                    results.append(False)
                    continue
                diff = kernel_diff(base.profile, slow.profile)
                verdict = compare_samples(base.steady_samples_s, slow.steady_samples_s).verdict
                first = diff.moves[0]
                planted_keys = {kernel_key(n) for n in planted_kernels}
                hit = any(kernel_key(n) in planted_keys for n in first.name.split(" → ")) and first.share >= SHARE
                if verdict != "slower" or _median(slow) < _median(base) * (1 + args.least_step):
                    print(f"  planted {', '.join(sorted(planted_kernels))}: steady {ms(_median(base))} → "
                          f"{ms(_median(slow))} ({verdict}): no regression planted (the untuned code is about as "
                          f"fast); not counted. {diff.headline()}", flush=True)
                    continue
                status, _ = _night(tracker, device, base_artifact, artifact, inputs, config)
                results.append(hit and status == "confirmed")
                if args.drift_nice is not None:  # the plant again, its session under a neighbour's load
                    with neighbours(args.drift_nice):
                        loaded = bench_artifact(tracker, device, artifact, inputs, None, config)
                    if loaded.status == "ok" and loaded.profile is not None and loaded.profile.status == "ok":
                        drifted = kernel_diff(base.profile, loaded.profile)
                        top = drifted.moves[0]
                        kept = any(kernel_key(n) in planted_keys for n in top.name.split(" → ")) and top.share >= SHARE
                        raw = next((m for m in drifted.moves if any(kernel_key(n) in planted_keys
                                                                   for n in m.name.split(" → "))), top)
                        plain = raw.delta_s / drifted.change_s if drifted.change_s else 0.0
                        drift_results.append(kept)
                        print(f"    under a neighbour's load (nice {args.drift_nice}): steady {ms(_median(base))} → "
                              f"{ms(_median(loaded))}, every kernel {drifted.common - 1:+.1%}; named first: {top.name} "
                              f"with {top.share:.0%} of the change beyond it ({'yes' if kept else 'NO'}); its plain "
                              f"share of the whole change {plain:.0%}", flush=True)
                print(f"  planted {', '.join(sorted(planted_kernels))}: steady {ms(_median(base))} → {ms(_median(slow))} "
                      f"({verdict}; a night's confirmation: {status}); named first: {first.name} with {first.share:.0%} "
                      f"of the change ({'yes' if hit else 'NO'}); {diff.headline()}", flush=True)
            again = bench_artifact(tracker, device, base_artifact, inputs, None, config)
            verdict = compare_samples(base.steady_samples_s, again.steady_samples_s).verdict
            status, rounds = _night(tracker, device, base_artifact, base_artifact, inputs, config)
            named = status in ("confirmed", "improved")  # a finding (or an improvement) would name its kernels
            quiet.append(not named)
            said = f"kernels named ({kernel_diff(base.profile, again.profile).headline()})" if named else "nothing named"
            print(f"  no plant (the tuned library against itself): a night's confirmation: {status} "
                  f"({rounds.rounds} rounds, {rounds.change:+.1%}): {said}; two sessions' samples (farm compare's "
                  f"test): steady {ms(_median(base))} → {ms(_median(again))}, {verdict}", flush=True)
    hits = sum(results)
    print(f"planted: {hits}/{len(results)} named first with >= {SHARE:.0%} of the change; "
          f"no plant: {sum(quiet)}/{len(quiet)} named nothing"
          + (f"; under a neighbour's load: {sum(drift_results)}/{len(drift_results)} named first with >= {SHARE:.0%} "
             "of the change beyond the common shift" if args.drift_nice is not None else ""))
    return len(results) >= 5 and hits == len(results) and all(drift_results)


@contextmanager
def neighbours(nice: int):
    """A neighbour's load: one busy process per CPU at ``nice`` (CFS shares the CPU by weight, so the device's
    threads lose about the same share in every kernel: nice 7 takes ~17 % of a CPU from a nice-0 thread)."""
    import subprocess

    busy = [subprocess.Popen(["nice", "-n", str(nice), sys.executable, "-c", "while True: pass"],
                             start_new_session=True) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(1.0)
        yield
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


def _night(tracker, device, old, new, inputs, config):
    """What a night's confirmation says of ``new`` against ``old`` (status, the rounds' comparison): both loaded afresh
    each round, interleaved (``regress.confirm``: 8 rounds, 16 when inconclusive), as ``farm regressions --confirm``
    reruns a candidate; a finding names its kernels only when confirmed."""
    from farm.measure.interleaved import interleaved_rounds
    from farm.analysis.regress import confirm

    return confirm(lambda n: interleaved_rounds(tracker, device, old, new, inputs, n, config))


def _record_s(records, index: int) -> float:
    """The best measured time among a workload's records (MetaSchedule's run_secs, their mean), 0 when none."""
    import json

    best = 0.0
    for line in records:
        if line.startswith(f"[{index},"):
            secs = [float(v) for v in json.loads(line)[1][1] or []]
            if secs:
                best = max(best, sum(secs) / len(secs)) if not best else min(best, sum(secs) / len(secs))
    return best


def _median(result) -> float:
    from farm.stats import median

    return median(result.steady_samples_s)


def _commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
