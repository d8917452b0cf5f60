"""The reference runtime beside TVM: the same model, inputs, warm-up and repeat statistics, timed in the runtime
its users would otherwise ship (onnxruntime, LiteRT, torch; ``models.runtimes``), on the device when it runs there.

    1 load      create the runtime's session (timed: graph optimisation included)
    2 first     the first call (timed)
    3 steady    one warm-up call discarded, ``number`` calibrated as for TVM's run (each repeat lasts at
                least ``min_repeat_ms``), ``repeat`` repeats: the wall time of ``number`` calls / ``number``,
                by ``time.perf_counter`` (monotonic) around ``run`` (inputs in, outputs as numpy out)
    4 check     outputs against the same reference TVM's run is checked against

Threads: exactly the count TVM's run reported for the same cell (``runtime.NumThreads`` on the device's session,
``records.THREADS_RULE``), so the two figures are made on equal terms; where TVM's run never reached its session, the
device's setting, else this host's online CPUs. Stored as the run's ``threads``, and in its settings.

Where it runs: the device's kind says (``DeviceKind.reference_runs_here``: this host's CPU kinds). Anywhere
else the run is not attempted and the reason is "no reference runtime on this device": a host figure is never
passed off as a device's. Stored as a run of runtime ``onnxruntime`` / ``litert`` / ``torch`` (no artifact).
"""

from __future__ import annotations

import logging

import time
from typing import Any, Callable

import numpy as np

import farm
from farm.devices import kind_of
from farm.errors import FarmError, message_line
from farm.measure import calibrate_number, check_outputs
from farm.measure.profile import PROFILE_RUNS, profile_runs
from farm.measure.manifest import run_manifest
from farm.models.runtimes import open_runtime, profile_onnxruntime, runtime_name
from farm.records import (BenchConfig, BenchResult, CheckResult, Device, KernelProfile, ModelSource, Threads, online_cpus,
                          threads_setting, utc_now)

log = logging.getLogger("farm.reference")  # the name its warnings have always carried

NO_REFERENCE = "no reference runtime on this device"
HOW_TIMED = ("wall time per call: time.perf_counter around number calls of the runtime's run, / number; one warm-up "
             "call discarded; number calibrated so a repeat lasts >= min_repeat_ms, as for TVM")


def reference_threads(tvm_threads: int | None, device: Device) -> Threads:
    """The intra-op threads the reference runtime gets, and why: the count TVM's run of the same cell reported;
    without one, the device's setting (``threads_setting``), else this host's online CPUs (the reference runs on this
    host's CPU: ``reference_runs_here``)."""
    if tvm_threads:
        return Threads(tvm_threads, "as TVM's run of this cell reported (runtime.NumThreads)")
    if (setting := threads_setting(device)) is not None:
        return Threads(setting, "the device's threads setting (TVM's run reported none)")
    return Threads(online_cpus(), "this host's online CPUs (TVM's run reported none)")


def reference_unavailable(device: Device) -> str:
    """Why no reference runtime can run on ``device`` ('' when one can)."""
    return "" if kind_of(device).reference_runs_here else f"{NO_REFERENCE} ({device.kind} device {device.name!r})"


def bench_reference(device: Device, model: ModelSource, inputs: dict[str, np.ndarray],
                    reference: list[np.ndarray] | None, config: BenchConfig, reference_name: str,
                    threads: Threads, say: Callable[[str, str], None] | None = None) -> BenchResult:
    """Time ``model`` in its reference runtime here with ``threads`` (``reference_threads``: the count and why);
    always a BenchResult (ok or failed at its step)."""
    say = say or (lambda step, detail: None)
    runtime = runtime_name(model)
    fields: dict[str, Any] = {"steady_clock": "wall", "threads": threads.count}
    context: dict[str, Any] = {"farm_version": farm.__version__, "device_kind": device.kind,
                               "emulated": device.emulated, "runtime": runtime, "how_timed": HOW_TIMED,
                               "threads_by": threads.set_by,
                               "manifest": run_manifest(device, None, model.digest),
                               **kind_of(device).measurement_context(device)}
    started_at = utc_now()
    started = time.perf_counter()
    version, step = "", "load"
    try:
        say(f"{runtime} load", model.name)
        t0 = time.perf_counter()
        session = open_runtime(model, threads.count)
        fields["load_s"] = time.perf_counter() - t0
        version = session.version
        context["manifest"]["reference.version"] = f"{runtime} {version}"
        context["runtime_settings"] = session.settings

        step = "first"
        t0 = time.perf_counter()
        outputs = session.run(inputs)
        fields["first_run_s"] = time.perf_counter() - t0

        step = "steady"
        session.run(inputs)  # the warm-up call, discarded (as TVM's time_evaluator does)

        def timed(number: int, repeat: int) -> tuple[float, ...]:
            samples = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                for _ in range(number):
                    session.run(inputs)
                samples.append((time.perf_counter() - t0) / number)
            return tuple(samples)

        number = config.number or calibrate_number(timed, config.min_repeat_ms)
        say(f"{runtime} steady", f"{config.repeat} repeats × {number} calls (wall time)")
        fields["steady_number"] = number
        fields["steady_samples_s"] = timed(number, config.repeat)

        step = "check"
        fields["check"] = check_outputs(outputs, reference, config, reference_name)
        if fields["check"].status == "failed":
            raise FarmError(f"{runtime}'s outputs differ from {reference_name}: {fields['check'].detail}",
                            "the reference runtime computes something else than the reference outputs")
        if config.profile:
            runs = max(1, profile_runs(fields["steady_samples_s"], time.perf_counter() - started))
            say(f"{runtime} profile", f"{runs} runs, each node timed by {runtime}'s profiler")
            fields["profile"] = reference_profile(model, threads.count, inputs, runs)
    except FarmError as exc:
        return _result(device, model, config, context, started_at, fields, runtime, version, step, exc.message, exc.hint)
    except Exception as exc:  # the runtime's own errors while running
        log.info("%s × %s in %s failed at %s", device.name, model.name, runtime, step, exc_info=True)
        return _result(device, model, config, context, started_at, fields, runtime, version, step,
                       f"{runtime} failed: {message_line(exc)}", "the TVM figure stands alone for this model")
    return _result(device, model, config, context, started_at, fields, runtime, version, "", "", "")


def reference_profile(model: ModelSource, threads: int | None, inputs: dict[str, np.ndarray],
                      runs: int = PROFILE_RUNS) -> KernelProfile:
    """The reference runtime's own per-node profile on the same threads and inputs (onnxruntime's profiler), after
    its timed runs; a runtime farm cannot profile, or a failure, is "not available" and the run stands."""
    runtime = runtime_name(model)
    if runtime != "onnxruntime":
        return KernelProfile("not available", f"farm reads no per-op profile from {runtime} (onnxruntime's only)")
    try:
        return profile_onnxruntime(model, threads, inputs, runs)
    except Exception as exc:  # onnxruntime's own errors: a side figure, never the run's fate
        log.info("onnxruntime's profile of %s failed", model.name, exc_info=True)
        return KernelProfile("not available", f"onnxruntime's profiler failed: {message_line(exc)}")


def _result(device: Device, model: ModelSource, config: BenchConfig, context: dict, started_at: str, fields: dict,
            runtime: str, version: str, step: str, reason: str, hint: str) -> BenchResult:
    if "check" not in fields:
        fields["check"] = CheckResult("skipped", detail=f"not reached: failed at {step}")
    return BenchResult(device=device.name, key=device.key, model=model.name, model_digest=model.digest,
                       status="failed" if step else "ok", reason=reason, failed_step=step, hint=hint, config=config,
                       context=context, started_at=started_at, runtime=runtime, runtime_version=version, **fields)
