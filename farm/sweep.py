"""Orchestration: compile, measure, check and store model × device cells.

Every cell ends as a stored result, ok or failed; only bad input (unknown model,
bad inventory) stops before the first cell.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from farm.compile import compile_model, effective_target, tuning_key
from farm.errors import FarmError
from farm.measure import bench_artifact
from farm.models import load_reference_file, make_inputs, reference_outputs
from farm.records import Artifact, BenchConfig, BenchResult, CheckResult, Device, ModelSource, TrackerAddress, TuningSet
from farm.store import Store

log = logging.getLogger(__name__)

Progress = Callable[[str, str, str, str], None]  # device, model, step, detail


@dataclass(frozen=True)
class CellResult:
    run_id: int
    result: BenchResult
    artifact: Artifact | None


def tuning_set(store: Store, device: Device) -> TuningSet:
    """The store's tuning records for ``device``'s effective target (what its artifacts compile in)."""
    key = tuning_key(effective_target(device))
    workloads, records = store.tuning_lines(key)
    return TuningSet(key, tuple(workloads), tuple(records))


def bench_cell(
    tracker: TrackerAddress, device: Device, model: ModelSource, store: Store, cache_dir: Path,
    config: BenchConfig, reference_file: str | None = None, progress: Progress | None = None, tuned: bool = True,
) -> CellResult:
    """Compile (cached; with the store's tuning records unless ``tuned`` is False), measure and store one cell."""
    say = (lambda step, detail: progress(device.name, model.name, step, detail)) if progress else None
    try:
        tuning = tuning_set(store, device) if tuned and device.export != "system-lib" else None
        if say:
            say("compile", f"{model.name} ({len(tuning.records)} tuning records)" if tuning and tuning.records else model.name)
        artifact = compile_model(model, device, cache_dir, tuning)
    except FarmError as exc:
        result = BenchResult(
            device=device.name, key=device.key, model=model.name, model_digest=model.digest, status="failed",
            reason=exc.message, failed_step="compile", hint=exc.hint, config=config,
            check=CheckResult("skipped", detail="not reached: failed at compile"),
            context={"device_kind": device.kind, "emulated": device.emulated, "target": device.target},
            started_at=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        )
        return CellResult(store.record_result(result, device, model, None), result, None)
    inputs = make_inputs(model, config.seed)
    reference_name = "onnxruntime"
    try:
        if reference_file:
            reference, reference_name = load_reference_file(reference_file), f"file:{reference_file}"
        else:
            reference = reference_outputs(model, inputs)
    except FarmError as exc:
        log.warning("%s; output check skipped", exc.message)
        reference = None
    result = bench_artifact(tracker, device, artifact, inputs, reference, config, reference_name, say)
    return CellResult(store.record_result(result, device, model, artifact), result, artifact)


def run_matrix(
    tracker: TrackerAddress, devices: list[Device], models: list[ModelSource], store: Store, cache_dir: Path,
    config: BenchConfig, progress: Progress | None = None,
) -> list[CellResult]:
    """Every device × model, one device at a time, cooling down between a device's cells."""
    cells = []
    for device in devices:
        for index, model in enumerate(models):
            if index and device.cooldown_s:
                if progress:
                    progress(device.name, model.name, "cooldown", f"{device.cooldown_s:g} s")
                time.sleep(device.cooldown_s)
            cells.append(bench_cell(tracker, device, model, store, cache_dir, config, progress=progress))
    return cells
