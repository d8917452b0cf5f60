"""The one cell pipeline: one model on one device after its compile, measured, checked and stored (``run_cell``),
for ``farm bench`` (``bench_cell``) and a sweep's workers alike; with its CPU fallback (``fallback_run``) and its
run in the model's reference runtime (``reference_run``). Every cell ends as a stored result, ok or failed; its
final attempt is stored whole with both, in one transaction (``Store.record_cell``), or not at all."""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from farm.compile import compile_model, effective_target, fallback_device, toolchain_for
from farm.compile.child import compile_apart
from farm.devices.health import cool_down, health_after
from farm.errors import FarmError, LeaseLost, StoreError
from farm.measure import bench_artifact
from farm.models.runtimes import runtime_name
from farm.records import (RETRYABLE_STEPS, Artifact, BenchConfig, BenchResult, Device, Lease, ModelSource, Progress,
                          RunToStore, TrackerAddress)
from farm.measure.reference import bench_reference, reference_threads, reference_unavailable
from farm.store import Store
from farm.sweep.failures import compile_failure, crashed_cell
from farm.sweep.inputs import CellInputs, cell_inputs
from farm.tune.tuning_set import tuning_set

log = logging.getLogger(__name__)

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


def measure_cell(
    tracker: TrackerAddress, device: Device, model: ModelSource, artifact: Artifact, config: BenchConfig,
    reference_file: str | None = None, progress: Progress | None = None, prepared: CellInputs | None = None,
) -> BenchResult:
    """``prepared``: the cell's ``cell_inputs`` when the caller has them (``run_cell`` computes them once a cell)."""
    say = (lambda step, detail: progress(device.name, model.name, step, detail)) if progress else None
    inputs, reference, reference_name, config = prepared or cell_inputs(model, config, reference_file)
    return bench_artifact(tracker, device, artifact, inputs, reference, config, reference_name, say)


def reference_run(ctx: CellContext, device: Device, model: ModelSource, prepared: CellInputs | None = None,
                  tvm_threads: int | None = None, attempt: int = 1) -> RunToStore | None:
    """The cell's model in its reference runtime (onnxruntime, LiteRT, torch) where the device's kind runs one
    (this host's CPU), with the cell's inputs, reference and statistics; stored as that runtime's run with TVM's
    ``attempt``. None where no reference runtime runs: farm never passes a host figure off as a device's. Its
    threads are those TVM's run reported (``tvm_threads``; ``reference_threads``)."""
    if reference_unavailable(device):
        return None
    inputs, reference, reference_name, config = prepared or cell_inputs(model, ctx.config, ctx.reference_file)
    result = bench_reference(device, model, inputs, reference, config, reference_name,
                             reference_threads(tvm_threads, device), ctx.say(device, model))
    return RunToStore(result, device, model, None, attempt)


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
    lease: Lease | None = None  # a lab cell's hold on its device: what it stores is refused once another holds it
    profile_cells: tuple[str, ...] = ()  # devices and models whose cells are profiled too (SweepSpec.profile_cells)

    def for_cell(self, device: Device, model: ModelSource) -> "CellContext":
        """This context for one cell: profiled where its device or model is one of ``profile_cells``."""
        if self.config.profile or not ({device.name, model.name} & set(self.profile_cells)):
            return self
        return replace(self, config=replace(self.config, profile=True))

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


def compile_or_error(ctx: CellContext, store: Store, device: Device, model: ModelSource,
                     apart: bool = False) -> Artifact | FarmError:
    """The cell's artifact, or the error that stopped its compile (one compile at a time: ``COMPILE_LOCK``).
    ``apart``: in a process of its own (``compile.child``), whose crash fails the compile, not this process (a lab
    worker's)."""
    if ctx.progress:
        ctx.progress(device.name, model.name, "compile", model.name + (" (in a process of its own)" if apart else ""))
    try:
        if apart:
            return compile_apart(model, device, ctx.cache_dir, tuning_set(store, device) if ctx.tuned else None)
        with COMPILE_LOCK:
            return compile_cell(device, model, store, ctx.cache_dir, ctx.tuned)
    except FarmError as exc:
        return exc


def run_cell(ctx: CellContext, store: Store, device: Device, model: ModelSource, artifact: Artifact | FarmError,
             first: bool, attempt: int = 1, stored: Callable[[CellResult], None] | None = None) -> CellResult:
    """One cell after its compile, for ``farm bench`` and for a sweep's workers alike.

    1. A compile failure is final at once: nothing runs on the device, so no cooldown and no health gate.
    2. Else cool down (not before the device's ``first`` cell; the temperature/battery gates apply always),
       measure, check; a dropped session is stored as a failed attempt and measured again while ``ctx.retries``
       allow. An exception farm does not expect is a failed cell (step "farm"), never lost.
    3. On a GPU that failed it, with ``fallback = "cpu"``, the model on the device's CPU, unless that cannot help
       (the CPU build needs the toolchain whose absence failed the GPU build: the stored reason says so).
    4. The model in its reference runtime (onnxruntime, LiteRT, torch) where the device runs one (``reference``).
    5. The final attempt, its fallback and its reference run stored in one transaction (``Store.record_cell``,
       under ``ctx.lease``): a job that dies before leaves nothing of the cell, so it is measured again whole.

    Each stored TVM attempt (and the fallback) goes to ``stored``; the last one is returned, with its fallback and
    reference run. A ``StoreError`` is raised, and ``LeaseLost`` when the device passed to another holder."""
    ctx = ctx.for_cell(device, model)
    prepared: CellInputs | None = None  # inputs and reference outputs: computed once, for TVM's run and the reference's
    stored_artifact = None if isinstance(artifact, FarmError) else artifact
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
        run = RunToStore(result, device, model, stored_artifact, attempt)
        if result.status == "ok" or result.failed_step not in RETRYABLE_STEPS or attempt > ctx.retries:
            break
        cell = CellResult(store.record_cell(run, sweep_id=ctx.sweep_id, lease=ctx.lease)[0], result, stored_artifact)
        if stored:
            stored(cell)
        attempt += 1
        if ctx.progress:
            ctx.progress(device.name, model.name, "retry", result.reason)
    fallback = guarded_fallback(ctx, store, device, model, attempt) \
        if needs_fallback(device, result) and not no_fallback else None
    reference = guarded_reference(ctx, device, model, prepared, result.threads, attempt) if ctx.reference_runtime else None
    run_id, fallback_id, reference_id = store.record_cell(run, fallback, reference, ctx.sweep_id, ctx.lease)
    cell = CellResult(run_id, result, stored_artifact)
    if stored:
        stored(cell)
    if fallback is not None and fallback_id is not None:
        cell = dataclasses.replace(cell, fallback=CellResult(
            fallback_id, dataclasses.replace(fallback.result, fallback_of=run_id), fallback.artifact))
        if stored:
            stored(cell.fallback)  # type: ignore[arg-type]
    if reference is not None and reference_id is not None:
        cell = dataclasses.replace(cell, reference=CellResult(reference_id, reference.result, None))
    return cell


def guarded_fallback(ctx: CellContext, store: Store, device: Device, model: ModelSource, attempt: int) -> RunToStore:
    """``fallback_run``, whose unexpected exception is the fallback's stored failure (step "farm"): the TVM attempt
    measured before it is stored with it, never lost (#61). A store's errors and a lost lease still end the cell."""
    try:
        return fallback_run(ctx, store, device, model, attempt)
    except (StoreError, LeaseLost):
        raise
    except Exception as exc:  # noqa: BLE001  # what the GPU's run measured must be stored all the same
        log.exception("%s × %s: unexpected error in the CPU fallback", device.name, model.name)
        cpu = fallback_device(device)
        return RunToStore(crashed_cell(cpu, model, ctx.config, exc), cpu, model, None, attempt)


def guarded_reference(ctx: CellContext, device: Device, model: ModelSource, prepared: CellInputs | None,
                      tvm_threads: int | None, attempt: int) -> RunToStore | None:
    """``reference_run``, whose unexpected exception is the reference runtime's stored failure: the TVM attempt is
    stored with it, never lost (#61)."""
    try:
        return reference_run(ctx, device, model, prepared, tvm_threads, attempt)
    except (StoreError, LeaseLost):
        raise
    except Exception as exc:  # noqa: BLE001
        log.exception("%s × %s: unexpected error in the reference runtime's run", device.name, model.name)
        crashed = crashed_cell(device, model, ctx.config, exc)
        return RunToStore(dataclasses.replace(crashed, runtime=runtime_name(model)), device, model, None, attempt)


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


def fallback_run(ctx: CellContext, store: Store, device: Device, model: ModelSource, attempt: int = 1) -> RunToStore:
    """The model on the device's CPU (``NAME@cpu``) after its GPU failed it: compiled (one compile at a time: sweep
    workers call this too), cooled down like any next cell, measured; stored with the GPU's run as its fallback."""
    cpu = fallback_device(device)
    if ctx.progress:
        ctx.progress(device.name, model.name, "fallback", "the GPU failed it: measuring on the CPU")
    artifact = compile_or_error(ctx, store, cpu, model)
    if isinstance(artifact, FarmError):
        return RunToStore(compile_failure(cpu, model, ctx.config, artifact), cpu, model, None, attempt)
    waited = cool_down(cpu, False, ctx.say(cpu, model))
    result = with_health(measure_cell(ctx.tracker, cpu, model, artifact, ctx.config, ctx.reference_file,
                                      ctx.progress), waited, cpu)
    return RunToStore(result, cpu, model, artifact, attempt)


def _say(progress: Progress | None, device: Device, model: ModelSource):
    return (lambda step, detail: progress(device.name, model.name, step, detail)) if progress else None


def with_health(result: BenchResult, waited: dict, device: Device) -> BenchResult:
    """The result with the device's health before and after it, and the cooldown before it, in its context."""
    context = {**result.context, "device_health": waited.pop("health", {}), "device_health_after": health_after(device),
               "cooldown": waited}
    return dataclasses.replace(result, context=context)


def compile_cell(device: Device, model: ModelSource, store: Store, cache_dir: Path, tuned: bool = True) -> Artifact:
    """The cell's artifact, with the store's tuning records for the device unless ``tuned`` is False."""
    tuning = tuning_set(store, device) if tuned else None
    return compile_model(model, device, cache_dir, tuning)
