"""Orchestration: compile, measure, check and store model × device cells; parallel sweeps.

Every cell ends as a stored result, ok or failed; only bad input (unknown model,
bad inventory) stops before the first cell.

A sweep compiles in the calling thread (each artifact once, cached) and hands the
artifacts to one worker thread per device, so compilation overlaps measurement and
devices measure in parallel. Each worker has its own database connection; every
result is one transaction, so a killed sweep loses at most the cells in flight and
``resume_sweep`` finishes exactly the missing ones.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from farm.compile import compile_model, effective_target, fallback_device, tuning_key
from farm.devices.health import cool_down, health_after
from farm.errors import FarmError, StoreError, first_line
from farm.measure import bench_artifact, measure_copy_curve
from farm.models import (VARIANT_TOLERANCE, load_model_variant, load_reference_file, load_test_data, make_inputs,
                         reference_outputs, shipped_test_data)
from farm.records import (CPU_TARGETS, Artifact, BenchConfig, BenchResult, CheckResult, Device, ModelSource,
                           SweepSpec, TrackerAddress, TuningSet)
from farm.store import Store

log = logging.getLogger(__name__)

Progress = Callable[[str, str, str, str], None]  # device, model, step, detail
RETRYABLE_STEPS = ("session", "upload", "load", "first", "steady", "copy")  # a dropped session, not a wrong output
UNREACHABLE_STEPS = ("session", "upload")  # the device itself is gone: its CPU is no fallback
# TVM's compiler runs in one thread at a time: the sweep's compile loop, or a worker's fallback compile
COMPILE_LOCK = threading.Lock()


@dataclass(frozen=True)
class CellResult:
    run_id: int
    result: BenchResult
    artifact: Artifact | None
    fallback: "CellResult | None" = None  # the same model on the device's CPU, when its GPU failed it


def needs_fallback(device: Device, result: BenchResult) -> bool:
    """A GPU that failed a model (compile, load, run or wrong output) on a device with ``fallback = "cpu"``."""
    return (device.options.get("fallback") == "cpu" and result.status != "ok"
            and result.failed_step not in UNREACHABLE_STEPS)


def is_gpu(device: Device) -> bool:
    return effective_target(device)["kind"] not in CPU_TARGETS


def tuning_set(store: Store, device: Device) -> TuningSet:
    """The store's tuning records for ``device``'s effective target (what its artifacts compile in)."""
    key = tuning_key(effective_target(device))
    workloads, records = store.tuning_lines(key)
    return TuningSet(key, tuple(workloads), tuple(records))


def compile_cell(device: Device, model: ModelSource, store: Store, cache_dir: Path, tuned: bool = True) -> Artifact:
    """The cell's artifact, with the store's tuning records for the device unless ``tuned`` is False."""
    tuning = tuning_set(store, device) if tuned else None
    return compile_model(model, device, cache_dir, tuning)


def _unmeasured(device: Device, model: ModelSource, config: BenchConfig, step: str, reason: str, hint: str,
                check_detail: str) -> BenchResult:
    """The stored result of a cell that failed before anything was measured."""
    return BenchResult(
        device=device.name, key=device.key, model=model.name, model_digest=model.digest, status="failed",
        reason=reason, failed_step=step, hint=hint, config=config, check=CheckResult("skipped", detail=check_detail),
        context={"device_kind": device.kind, "emulated": device.emulated, "target": device.target},
        started_at=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
    )


def compile_failure(device: Device, model: ModelSource, config: BenchConfig, exc: FarmError) -> BenchResult:
    return _unmeasured(device, model, config, "compile", exc.message, exc.hint, "not reached: failed at compile")


def crashed_cell(device: Device, model: ModelSource, config: BenchConfig, exc: Exception) -> BenchResult:
    """The stored result of a cell whose measurement raised what farm does not expect (a farm bug, or a library
    error farm does not translate): failed at step "farm", with the exception; its traceback is in the log."""
    return _unmeasured(device, model, config, "farm", f"unexpected {type(exc).__name__}: {first_line(exc)}",
                       "a farm bug or an untranslated library error: rerun with -v for the traceback and report it",
                       "not reached: farm failed")


def measure_cell(
    tracker: TrackerAddress, device: Device, model: ModelSource, artifact: Artifact, config: BenchConfig,
    reference_file: str | None = None, progress: Progress | None = None,
) -> BenchResult:
    say = (lambda step, detail: progress(device.name, model.name, step, detail)) if progress else None
    inputs = make_inputs(model, config.seed)
    reference_name = {"torch": "torch", "tflite": "litert"}.get(model.frontend, "onnxruntime")
    shipped = shipped_test_data(model)
    try:
        if reference_file and Path(reference_file).is_dir():  # a test_data_set folder: its inputs and outputs
            inputs, reference = load_test_data(reference_file, model)
            reference_name = f"file:{reference_file}"
        elif reference_file:
            reference, reference_name = load_reference_file(reference_file), f"file:{reference_file}"
        elif shipped is not None:  # the model's own test data beats any runtime's opinion (old opsets included)
            inputs, reference = load_test_data(shipped, model)
            reference_name = f"shipped test data ({shipped.name})"
        else:
            reference = reference_outputs(model, inputs)
    except FarmError as exc:
        log.warning("%s; output check skipped", exc.message)
        reference = None
    if model.variant != "fp32" and reference is not None and not reference_file:
        # a variant is checked against fp32 with a tolerance relative to the output's range: its drift
        spread = max(float(np.ptp(r)) for r in reference) or 1.0
        config = dataclasses.replace(config, rtol=0.0, atol=VARIANT_TOLERANCE[model.variant] * spread)
        reference_name = f"onnxruntime fp32 (drift tolerance {VARIANT_TOLERANCE[model.variant]:.0%} of range {spread:.3g})"
    return bench_artifact(tracker, device, artifact, inputs, reference, config, reference_name, say)


def bench_cell(
    tracker: TrackerAddress, device: Device, model: ModelSource, store: Store, cache_dir: Path,
    config: BenchConfig, reference_file: str | None = None, progress: Progress | None = None, tuned: bool = True,
    first: bool = True,
) -> CellResult:
    """Compile (cached; with the store's tuning records unless ``tuned`` is False), cool down (not before a
    device's ``first`` cell, though temperature/battery gates apply always), measure and store one cell.
    When a GPU fails it and the device names a fallback, the model is measured on the device's CPU too."""
    if progress:
        progress(device.name, model.name, "compile", model.name)
    try:
        artifact = compile_cell(device, model, store, cache_dir, tuned)
    except FarmError as exc:
        result = compile_failure(device, model, config, exc)
        cell = CellResult(store.record_result(result, device, model, None), result, None)
    else:
        waited = cool_down(device, first, _say(progress, device, model))
        result = with_health(measure_cell(tracker, device, model, artifact, config, reference_file, progress), waited, device)
        cell = CellResult(store.record_result(result, device, model, artifact), result, artifact)
    if not needs_fallback(device, result):
        return cell
    return dataclasses.replace(cell, fallback=fallback_cell(tracker, device, model, store, cache_dir, config, cell.run_id,
                                                            reference_file, progress, tuned))


def fallback_cell(
    tracker: TrackerAddress, device: Device, model: ModelSource, store: Store, cache_dir: Path, config: BenchConfig,
    gpu_run_id: int, reference_file: str | None = None, progress: Progress | None = None, tuned: bool = True,
    sweep_id: int | None = None,
) -> CellResult:
    """The model on the device's CPU (``NAME@cpu``) after its GPU failed run ``gpu_run_id``: compiled (one compile
    at a time: sweep workers call this too), cooled down like any next cell, measured, stored as that run's fallback."""
    cpu = fallback_device(device)
    if progress:
        progress(device.name, model.name, "fallback", f"GPU run {gpu_run_id} failed: measuring on the CPU")
    try:
        with COMPILE_LOCK:
            artifact: Artifact | None = compile_cell(cpu, model, store, cache_dir, tuned)
    except FarmError as exc:
        artifact, result = None, compile_failure(cpu, model, config, exc)
    else:
        waited = cool_down(cpu, False, _say(progress, cpu, model))
        result = with_health(measure_cell(tracker, cpu, model, artifact, config, reference_file, progress), waited, cpu)
    result = dataclasses.replace(result, fallback_of=gpu_run_id)
    return CellResult(store.record_result(result, cpu, model, artifact, sweep_id), result, artifact)


def cell_eta(count: int, total: int, elapsed_s: float) -> str:
    """'cell 3/8, ETA 2m10s' from the mean time of this device's cells so far."""
    text = f"cell {count}/{total}"
    if count > 1 and total >= count:
        left = elapsed_s / (count - 1) * (total - count + 1)
        text += f", ETA {int(left // 60)}m{int(left % 60):02d}s"
    return text


def _say(progress: Progress | None, device: Device, model: ModelSource):
    return (lambda step, detail: progress(device.name, model.name, step, detail)) if progress else None


def with_health(result: BenchResult, waited: dict, device: Device) -> BenchResult:
    """The result with the device's health before and after it, and the cooldown before it, in its context."""
    context = {**result.context, "device_health": waited.pop("health", {}), "device_health_after": health_after(device),
               "cooldown": waited}
    return dataclasses.replace(result, context=context)


def run_matrix(
    tracker: TrackerAddress, devices: list[Device], models: list[ModelSource], store: Store, cache_dir: Path,
    config: BenchConfig, progress: Progress | None = None,
) -> list[CellResult]:
    """Every device × model, one device at a time, cooling down between a device's cells; a GPU device's
    copy curve after its cells."""
    cells = []
    for device in devices:
        for index, model in enumerate(models):
            cells.append(bench_cell(tracker, device, model, store, cache_dir, config, progress=progress, first=index == 0))
        if is_gpu(device):
            record_copy_curve(tracker, device, config, store, None, progress)
    return cells


def record_copy_curve(tracker: TrackerAddress, device: Device, config: BenchConfig, store: Store,
                      sweep_id: int | None, progress: Progress | None) -> None:
    """Measure and store the device's copy curve; a failure is stored as a failed curve, never raised."""
    if progress:
        progress(device.name, "-", "copy curve", "device<->host copies, 4 KiB ... 64 MiB")
    curve = measure_copy_curve(tracker, device, effective_target(device)["kind"], config)
    try:
        store.record_copy_curve(curve, sweep_id)
    except StoreError as exc:
        log.error("%s", exc.message)


# -- sweeps ---------------------------------------------------------------------------------

@dataclass
class SweepOutcome:
    sweep_id: int
    status: str
    cells: list[CellResult] = field(default_factory=list)
    skipped: int = 0  # cells already done (resume)
    seconds: float = 0.0
    missing: list[tuple[str, str]] = field(default_factory=list)  # cells with no stored attempt: resume them


def missing_cells(spec: SweepSpec, done: dict[tuple[str, str], list[tuple[int, str]]]) -> list[tuple[str, str]]:
    """Cells without an ok run and with retries left, in sweep order."""
    return [cell for cell in spec.cells() if not spec.cell_done(done.get(cell, []))]


def run_sweep(
    tracker: TrackerAddress, devices: dict[str, Device], spec: SweepSpec, db_path: str | Path, cache_dir: Path,
    progress: Progress | None = None, sweep_id: int | None = None,
) -> SweepOutcome:
    """Run (or, with ``sweep_id``, resume) a sweep: one worker per device, compile pipelined with measurement."""
    start = time.monotonic()
    unknown = [d for d in spec.devices if d not in devices]
    if unknown:
        raise FarmError(f"sweep names unknown device(s): {', '.join(unknown)}", "see farm devices")
    models = {name: load_model_variant(name, spec.shapes.get(name.rpartition("@")[0] if "@" in name else name))
              for name in spec.cell_models()}  # bad names fail before any work
    spec = dataclasses.replace(spec, stored_names={name: model.name for name, model in models.items()})
    with Store(db_path) as store:
        if sweep_id is None:
            sweep_id = store.start_sweep(spec.to_json())
            done: dict = {}
        else:
            done = store.sweep_attempts(sweep_id)
        todo = missing_cells(spec, spec.by_cell(done))
        outcome = SweepOutcome(sweep_id, "running",
                               skipped=len(spec.devices) * len(spec.cell_models()) - len(todo))
        queues: dict[str, queue.Queue] = {name: queue.Queue() for name in spec.devices}
        lock = threading.Lock()
        totals = {name: sum(1 for d, _ in todo if d == name) for name in spec.devices}
        workers = [threading.Thread(target=_device_worker, name=f"sweep-{name}", daemon=True,
                                    args=(tracker, devices[name], queues[name], spec, db_path, sweep_id, done,
                                          outcome, lock, progress, totals[name], cache_dir))
                   for name in spec.devices]
        for worker in workers:
            worker.start()
        try:
            # compile in sweep order; each device's queue gets its cells as soon as they are built
            for device_name, model_name in todo:
                device, model = devices[device_name], models[model_name]
                if progress:
                    progress(device_name, model_name, "compile", "")
                try:
                    with COMPILE_LOCK:
                        artifact: Artifact | FarmError = compile_cell(device, model, store, cache_dir, spec.tuned)
                except FarmError as exc:
                    artifact = exc
                queues[device_name].put((model, artifact))
        finally:
            for q in queues.values():
                q.put(None)
            for worker in workers:
                worker.join()
        # a worker that ended early (its store unwritable, or a farm bug outside a cell) left cells without any
        # attempt: the sweep is then "incomplete", resumable, never "done"
        attempts = spec.by_cell(store.sweep_attempts(sweep_id))
        outcome.missing = [cell for cell in todo if not attempts.get(cell)]
        outcome.status = "incomplete" if outcome.missing else "done"
        store.finish_sweep(sweep_id, outcome.status)
    outcome.seconds = time.monotonic() - start
    return outcome


def _device_worker(tracker, device: Device, cells: queue.Queue, *args) -> None:
    """A sweep's thread for one device (``_measure_cells``); if it ends early, what it did not store is left for
    ``farm sweep --resume`` and the sweep is recorded "incomplete", not "done"."""
    try:
        _measure_cells(tracker, device, cells, *args)
    except Exception as exc:
        log.exception("the sweep's worker for %s stopped: %s; its remaining cells are left for --resume",
                      device.name, first_line(exc))


def _measure_cells(tracker, device: Device, cells: queue.Queue, spec: SweepSpec, db_path: str | Path, sweep_id: int,
                   done: dict, outcome: SweepOutcome, lock: threading.Lock, progress: Progress | None,
                   total: int, cache_dir: Path) -> None:
    """Measure one device's cells in order: cooldown, measure, retry a dropped session once, store."""
    with Store(db_path) as store:
        first = True
        started, count = time.monotonic(), 0
        while (item := cells.get()) is not None:
            model, artifact = item
            count += 1
            if progress:
                progress(device.name, model.name, "cell", cell_eta(count, total, time.monotonic() - started))
            previous = len(done.get((device.name, model.name), []))
            for attempt in range(previous + 1, spec.retries + 2):
                stored_artifact = None if isinstance(artifact, FarmError) else artifact
                try:
                    waited = cool_down(device, first, _say(progress, device, model))
                    first = False
                    if isinstance(artifact, FarmError):
                        result = compile_failure(device, model, spec.config, artifact)
                    else:
                        result = with_health(measure_cell(tracker, device, model, artifact, spec.config,
                                                          progress=progress), waited, device)
                except Exception as exc:  # never a lost cell: stored as failed, the device's next cells go on
                    log.exception("%s × %s: unexpected error while measuring", device.name, model.name)
                    result = crashed_cell(device, model, spec.config, exc)
                try:
                    run_id = store.record_result(result, device, model, stored_artifact, sweep_id, attempt)
                except StoreError as exc:  # never lose the sweep over one write; the cell stays missing
                    log.error("%s", exc.message)
                    break
                with lock:
                    outcome.cells.append(CellResult(run_id, result, stored_artifact))
                retry = result.status != "ok" and result.failed_step in RETRYABLE_STEPS
                if not retry or attempt > spec.retries:
                    if needs_fallback(device, result):
                        try:
                            cell = fallback_cell(tracker, device, model, store, cache_dir, spec.config, run_id,
                                                 progress=progress, tuned=spec.tuned, sweep_id=sweep_id)
                        except StoreError as exc:
                            log.error("%s", exc.message)
                        else:
                            with lock:
                                outcome.cells.append(cell)
                    break
                if progress:
                    progress(device.name, model.name, "retry", result.reason)
        if is_gpu(device):
            record_copy_curve(tracker, device, spec.config, store, sweep_id, progress)
