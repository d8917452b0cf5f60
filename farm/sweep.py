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

from farm.compile import compile_model, effective_target, fallback_device, toolchain_for, tuning_key
from farm.devices.health import cool_down, health_after
from farm.errors import FarmError, StoreError, TrackerError, message_line
from farm.measure import bench_artifact, measure_copy_curve
from farm.models.runtimes import runtime_name
from farm.models import (VARIANT_TOLERANCE, load_model_variant, load_reference_file, load_test_data, make_inputs,
                         reference_outputs, shipped_test_data)
from farm.reference import bench_reference, reference_threads, reference_unavailable
from farm.records import (CPU_TARGETS, OFFLINE_ATTEMPT, Artifact, BenchConfig, BenchResult, CheckResult, Device, ModelSource,
                           SweepSpec, TrackerAddress, TuningSet, split_variant, target_kind, utc_now)
from farm.rpc.tracker import query_summary
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
    reference: "CellResult | None" = None  # the same model in its reference runtime (onnxruntime …), where one runs


def needs_fallback(device: Device, result: BenchResult) -> bool:
    """A GPU that failed a model (compile, load, run or wrong output) on a device with ``fallback = "cpu"``."""
    return (device.options.get("fallback") == "cpu" and result.status != "ok"
            and result.failed_step not in UNREACHABLE_STEPS)


def is_gpu(device: Device) -> bool:
    return target_kind(effective_target(device)) not in CPU_TARGETS


def tuning_set(store: Store, device: Device, without_session: int | None = None) -> TuningSet:
    """The store's tuning records for ``device``'s effective target (what its artifacts compile in); with
    ``without_session``, as they were before that session (``Store.tuning_lines``)."""
    key = tuning_key(effective_target(device))
    workloads, records = store.tuning_lines(key, without_session)
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
        started_at=utc_now(),
    )


def compile_failure(device: Device, model: ModelSource, config: BenchConfig, exc: FarmError) -> BenchResult:
    return _unmeasured(device, model, config, "compile", exc.message, exc.hint, "not reached: failed at compile")


def crashed_cell(device: Device, model: ModelSource, config: BenchConfig, exc: Exception) -> BenchResult:
    """The stored result of a cell whose measurement raised what farm does not expect (a farm bug, or a library
    error farm does not translate): failed at step "farm", with the exception; its traceback is in the log."""
    return _unmeasured(device, model, config, "farm", f"unexpected {type(exc).__name__}: {message_line(exc)}",
                       "a farm bug or an untranslated library error: rerun with -v for the traceback and report it",
                       "not reached: farm failed")


def cell_inputs(model: ModelSource, config: BenchConfig, reference_file: str | None = None,
                ) -> tuple[dict[str, np.ndarray], list[np.ndarray] | None, str, BenchConfig]:
    """A cell's inputs, the outputs its runs are checked against, what those are, and the config whose tolerance
    checks them: a reference file or test_data_set folder, else the model's shipped test data, else its runtime's."""
    inputs = make_inputs(model, config.seed)
    reference_name = runtime_name(model)
    shipped = shipped_test_data(model)
    reference: list[np.ndarray] | None
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
    return inputs, reference, reference_name, config


CellInputs = tuple[dict[str, np.ndarray], list[np.ndarray] | None, str, BenchConfig]  # what cell_inputs returns


def measure_cell(
    tracker: TrackerAddress, device: Device, model: ModelSource, artifact: Artifact, config: BenchConfig,
    reference_file: str | None = None, progress: Progress | None = None, prepared: CellInputs | None = None,
) -> BenchResult:
    """``prepared``: the cell's ``cell_inputs`` when the caller has them (``run_cell`` computes them once a cell)."""
    say = (lambda step, detail: progress(device.name, model.name, step, detail)) if progress else None
    inputs, reference, reference_name, config = prepared or cell_inputs(model, config, reference_file)
    return bench_artifact(tracker, device, artifact, inputs, reference, config, reference_name, say)


def reference_cell(ctx: CellContext, store: Store, device: Device, model: ModelSource,
                   prepared: CellInputs | None = None, tvm_threads: int | None = None) -> CellResult | None:
    """The cell's model in its reference runtime (onnxruntime, LiteRT, torch) where the device's kind runs one
    (this host's CPU), with the cell's inputs, reference and statistics; stored as that runtime's run. None where
    no reference runtime runs: farm never passes a host figure off as a device's. Its threads are those TVM's run
    reported (``tvm_threads``; ``reference_threads``)."""
    if reference_unavailable(device):
        return None
    inputs, reference, reference_name, config = prepared or cell_inputs(model, ctx.config, ctx.reference_file)
    result = bench_reference(device, model, inputs, reference, config, reference_name,
                             reference_threads(tvm_threads, device), ctx.say(device, model))
    return CellResult(store.record_result(result, device, model, None, ctx.sweep_id), result, None)


@dataclass(frozen=True)
class CellContext:
    """What every cell of one ``farm bench`` or one sweep shares: where it measures, how, and where it stores.
    The one input of ``run_cell`` besides the device, the model, its artifact and the store."""

    tracker: TrackerAddress
    cache_dir: Path
    config: BenchConfig
    tuned: bool = True  # compile with the store's tuning records (the fallback's compile too)
    reference_file: str | None = None
    retries: int = 0  # a dropped session (RETRYABLE_STEPS) is measured again this many times
    sweep_id: int | None = None
    progress: Progress | None = None
    reference_runtime: bool = True  # also time the model in its reference runtime where the device runs one

    def say(self, device: Device, model: ModelSource):
        return _say(self.progress, device, model)


def bench_cell(
    tracker: TrackerAddress, device: Device, model: ModelSource, store: Store, cache_dir: Path,
    config: BenchConfig, reference_file: str | None = None, progress: Progress | None = None, tuned: bool = True,
    first: bool = True, reference_runtime: bool = True,
) -> CellResult:
    """Compile (cached; with the store's tuning records unless ``tuned`` is False), then ``run_cell``: the single
    cell of ``farm bench`` goes through the same pipeline as a sweep's cells."""
    ctx = CellContext(tracker, cache_dir, config, tuned, reference_file, progress=progress,
                      reference_runtime=reference_runtime)
    return run_cell(ctx, store, device, model, compile_or_error(ctx, store, device, model), first)


def compile_or_error(ctx: CellContext, store: Store, device: Device, model: ModelSource) -> Artifact | FarmError:
    """The cell's artifact, or the error that stopped its compile (one compile at a time: ``COMPILE_LOCK``)."""
    if ctx.progress:
        ctx.progress(device.name, model.name, "compile", model.name)
    try:
        with COMPILE_LOCK:
            return compile_cell(device, model, store, ctx.cache_dir, ctx.tuned)
    except FarmError as exc:
        return exc


def run_cell(ctx: CellContext, store: Store, device: Device, model: ModelSource, artifact: Artifact | FarmError,
             first: bool, attempt: int = 1, stored: Callable[[CellResult], None] | None = None) -> CellResult:
    """One cell after its compile, for ``farm bench`` and for a sweep's workers alike.

    1. A compile failure is stored at once: nothing runs on the device, so no cooldown and no health gate.
    2. Else cool down (not before the device's ``first`` cell; the temperature/battery gates apply always),
       measure, check, store; a dropped session is measured again while ``ctx.retries`` allow. An exception farm
       does not expect is stored as a failed cell (step "farm"), never lost.
    3. On a GPU that failed it, with ``fallback = "cpu"``, the model on the device's CPU, unless that cannot help
       (the CPU build needs the toolchain whose absence failed the GPU build: the stored reason says so).
    4. The model in its reference runtime (onnxruntime, LiteRT, torch) where the device runs one (``reference``).

    Each stored TVM attempt goes to ``stored``; the last one is returned, with its fallback and reference run.
    A ``StoreError`` is raised."""
    prepared: CellInputs | None = None  # inputs and reference outputs: computed once, for TVM's run and the reference's
    while True:
        if isinstance(artifact, FarmError):
            result = compile_failure(device, model, ctx.config, artifact)
        else:
            try:
                waited = cool_down(device, first, ctx.say(device, model))
                first = False
                prepared = prepared or cell_inputs(model, ctx.config, ctx.reference_file)
                result = with_health(measure_cell(ctx.tracker, device, model, artifact, ctx.config, ctx.reference_file,
                                                  ctx.progress, prepared=prepared), waited, device)
            except Exception as exc:  # never a lost cell: stored as failed, the device's next cells go on
                log.exception("%s × %s: unexpected error while measuring", device.name, model.name)
                result = crashed_cell(device, model, ctx.config, exc)
        no_fallback = fallback_blocked(device, result)
        if no_fallback:
            result = dataclasses.replace(result, reason=f"{result.reason}; {no_fallback}")
        if ctx.reference_runtime:  # what the report says beside this run where it has no reference figure
            result = dataclasses.replace(result, context={
                **result.context, "reference_runtime": reference_unavailable(device) or runtime_name(model)})
        stored_artifact = None if isinstance(artifact, FarmError) else artifact
        cell = CellResult(store.record_result(result, device, model, stored_artifact, ctx.sweep_id, attempt), result,
                          stored_artifact)
        if stored:
            stored(cell)
        if result.status == "ok" or result.failed_step not in RETRYABLE_STEPS or attempt > ctx.retries:
            break
        attempt += 1
        if ctx.progress:
            ctx.progress(device.name, model.name, "retry", result.reason)
    if needs_fallback(device, result) and not no_fallback:
        fallback = fallback_cell(ctx, store, device, model, cell.run_id)
        cell = dataclasses.replace(cell, fallback=fallback)
        if stored:
            stored(fallback)
    if ctx.reference_runtime:
        cell = dataclasses.replace(cell, reference=reference_cell(ctx, store, device, model, prepared,
                                                                  cell.result.threads))
    return cell


def fallback_blocked(device: Device, result: BenchResult) -> str:
    """Why the device's CPU fallback cannot help this failed result ('' when it can, or none is due): its GPU build
    failed for want of a toolchain, and the CPU build needs the same one."""
    if not needs_fallback(device, result) or result.failed_step != "compile":
        return ""
    cpu = fallback_device(device)
    try:
        toolchain_for(cpu, effective_target(cpu))
    except FarmError as exc:
        return f"no CPU fallback: the CPU build needs the same toolchain ({exc.message})"
    return ""


def fallback_cell(ctx: CellContext, store: Store, device: Device, model: ModelSource, gpu_run_id: int) -> CellResult:
    """The model on the device's CPU (``NAME@cpu``) after its GPU failed run ``gpu_run_id``: compiled (one compile
    at a time: sweep workers call this too), cooled down like any next cell, measured, stored as that run's fallback."""
    cpu = fallback_device(device)
    if ctx.progress:
        ctx.progress(device.name, model.name, "fallback", f"GPU run {gpu_run_id} failed: measuring on the CPU")
    artifact = compile_or_error(ctx, store, cpu, model)
    if isinstance(artifact, FarmError):
        result = compile_failure(cpu, model, ctx.config, artifact)
        stored_artifact = None
    else:
        waited = cool_down(cpu, False, ctx.say(cpu, model))
        result = with_health(measure_cell(ctx.tracker, cpu, model, artifact, ctx.config, ctx.reference_file,
                                          ctx.progress), waited, cpu)
        stored_artifact = artifact
    result = dataclasses.replace(result, fallback_of=gpu_run_id)
    return CellResult(store.record_result(result, cpu, model, stored_artifact, ctx.sweep_id), result, stored_artifact)


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
    curve = measure_copy_curve(tracker, device, target_kind(effective_target(device)), config)
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


def offline_keys(tracker: TrackerAddress, keys: set[str]) -> set[str]:
    """Which of ``keys`` have no server registered with the tracker now (busy ones are registered). One summary;
    a tracker that does not answer one says nothing here: each cell then fails at its session, as it would."""
    try:
        summary = query_summary(tracker)
    except TrackerError as exc:
        log.warning("%s; every device's cells will ask for a session", exc.message)
        return set()
    return {key for key in keys if key not in summary.keys or summary.keys[key].servers == 0}


def offline_cell(ctx: CellContext, store: Store, device: Device, model: ModelSource) -> CellResult:
    """A cell of a device with no server on the tracker: stored failed at step "offline" at once, as attempt 0
    (``OFFLINE_ATTEMPT``: it spends none of the cell's retries, and ``farm sweep --resume`` measures it)."""
    result = _unmeasured(device, model, ctx.config, "offline",
                         f"no server with key {device.key!r} is registered with the tracker at {ctx.tracker}",
                         f"bring it up (farm serve --device {device.name}), then farm sweep --resume {ctx.sweep_id}",
                         "not reached: device offline")
    return CellResult(store.record_result(result, device, model, None, ctx.sweep_id, OFFLINE_ATTEMPT), result, None)


def run_sweep(
    tracker: TrackerAddress, devices: dict[str, Device], spec: SweepSpec, db_path: str | Path, cache_dir: Path,
    progress: Progress | None = None, sweep_id: int | None = None,
) -> SweepOutcome:
    """Run (or, with ``sweep_id``, resume) a sweep: one worker per device, compile pipelined with measurement.
    A device with no server on the tracker when the sweep starts has its cells stored "offline" at once."""
    start = time.monotonic()
    unknown = [d for d in spec.devices if d not in devices]
    if unknown:
        raise FarmError(f"sweep names unknown device(s): {', '.join(unknown)}", "see farm devices")
    models = {name: load_model_variant(name, spec.shapes.get(split_variant(name)[0]))
              for name in spec.cell_models()}  # bad names fail before any work
    spec = dataclasses.replace(spec, stored_names={name: model.name for name, model in models.items()})
    with Store(db_path) as store:
        if sweep_id is None:
            sweep_id = store.start_sweep(spec.to_json())
            done: dict = {}
        else:
            done = store.sweep_attempts(sweep_id)
        ctx = CellContext(tracker, cache_dir, spec.config, spec.tuned, retries=spec.retries, sweep_id=sweep_id,
                          progress=progress, reference_runtime=spec.reference_runtime)
        todo = missing_cells(spec, spec.by_cell(done))
        outcome = SweepOutcome(sweep_id, "running",
                               skipped=len(spec.devices) * len(spec.cell_models()) - len(todo))
        offline = offline_keys(tracker, {devices[d].key for d, _ in todo})
        for device_name, model_name in [cell for cell in todo if devices[cell[0]].key in offline]:
            if progress:
                progress(device_name, model_name, "offline", f"no server for key {devices[device_name].key!r}")
            outcome.cells.append(offline_cell(ctx, store, devices[device_name], models[model_name]))
        todo = [cell for cell in todo if devices[cell[0]].key not in offline]
        queues: dict[str, queue.Queue] = {name: queue.Queue() for name in spec.devices}
        workers = [threading.Thread(target=_device_worker, name=f"sweep-{name}", daemon=True,
                                    args=(ctx, devices[name], queues[name], SweepWorker(spec, db_path, done, outcome,
                                                                                        sum(d == name for d, _ in todo))))
                   for name in spec.devices if devices[name].key not in offline]  # offline: no session, no curve
        for worker in workers:
            worker.start()
        try:
            # compile in sweep order; each device's queue gets its cells as soon as they are built
            for device_name, model_name in todo:
                device, model = devices[device_name], models[model_name]
                queues[device_name].put((model, compile_or_error(ctx, store, device, model)))
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


@dataclass
class SweepWorker:
    """What one device's worker shares with its sweep: the spec, the database, the attempts stored before (resume),
    the outcome its cells are added to (under ``lock``), and its cell count for the ETA."""

    spec: SweepSpec
    db_path: str | Path
    done: dict
    outcome: SweepOutcome
    total: int
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, cell: CellResult) -> None:
        with self.lock:
            self.outcome.cells.append(cell)


def _device_worker(ctx: CellContext, device: Device, cells: queue.Queue, worker: SweepWorker) -> None:
    """A sweep's thread for one device (``_measure_cells``); if it ends early, what it did not store is left for
    ``farm sweep --resume`` and the sweep is recorded "incomplete", not "done"."""
    try:
        _measure_cells(ctx, device, cells, worker)
    except Exception as exc:
        log.exception("the sweep's worker for %s stopped: %s; its remaining cells are left for --resume",
                      device.name, message_line(exc))


def _measure_cells(ctx: CellContext, device: Device, cells: queue.Queue, worker: SweepWorker) -> None:
    """Run one device's cells in order through ``run_cell``; then, on a GPU, its copy curve."""
    with Store(worker.db_path) as store:
        first = True
        started, count = time.monotonic(), 0
        while (item := cells.get()) is not None:
            model, artifact = item
            count += 1
            if ctx.progress:
                ctx.progress(device.name, model.name, "cell", cell_eta(count, worker.total, time.monotonic() - started))
            previous = worker.spec.attempts_spent(worker.done.get((device.name, model.name), []))
            try:
                run_cell(ctx, store, device, model, artifact, first, previous + 1, stored=worker.add)
            except StoreError as exc:  # never lose the sweep over one write; the cell stays missing
                log.error("%s", exc.message)
            first = first and isinstance(artifact, FarmError)
        if is_gpu(device):
            record_copy_curve(ctx.tracker, device, ctx.config, store, ctx.sweep_id, ctx.progress)
