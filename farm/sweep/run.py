"""Many cells: a sweep (``run_sweep``; with a ``sweep_id``, its resume) and ``farm demo``'s matrix (``run_matrix``),
each GPU device's copy curve after its cells.

A sweep compiles in the calling thread (each artifact once, cached) and hands the artifacts to one worker thread per
device, so compilation overlaps measurement and devices measure in parallel. Each worker has its own database
connection; every result is one transaction, so a killed sweep loses at most the cells in flight and ``farm sweep
--resume`` finishes exactly the missing ones. A device with no server on the tracker when the sweep starts has its
cells stored "offline" at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from farm.compile import effective_target
from farm.errors import FarmError, ModelError, StoreError, TrackerError, message_line
from farm.measure import measure_copy_curve
from farm.models import load_model_variant
from farm.records import (CPU_TARGETS, OFFLINE_ATTEMPT, BenchConfig, BenchResult, CellStanding, Device, Lease, ModelSource,
                          RunToStore, StoredAttempt, SweepSpec, TrackerAddress, target_kind)
from farm.rpc.tracker import query_summary
from farm.store import Store
from farm.store.locations import is_url
from farm.sweep.cell import CellContext, CellResult, Progress, bench_cell, compile_or_error, run_cell
from farm.sweep.failures import unmeasured_result

log = logging.getLogger(__name__)
SWEEP_LOCK = ".sweep-lock"  # beside a SQLite database: one_sweep_at_a_time
_HELD: set[str] = set()  # the databases whose sweep lock this process holds (the lock is re-entrant within it)


def is_gpu(device: Device) -> bool:
    return target_kind(effective_target(device)) not in CPU_TARGETS


def cell_eta(count: int, total: int, elapsed_s: float) -> str:
    """'cell 3/8, ETA 2m10s' from the mean time of this device's cells so far."""
    text = f"cell {count}/{total}"
    if count > 1 and total >= count:
        left = elapsed_s / (count - 1) * (total - count + 1)
        text += f", ETA {int(left // 60)}m{int(left % 60):02d}s"
    return text


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
                      sweep_id: int | None, progress: Progress | None, attempt: int = 1,
                      lease: Lease | None = None) -> None:
    """Measure and store the device's copy curve, as the sweep's ``attempt`` of it (under ``lease``: a lab's); a
    failure is stored as a failed curve, never raised (``LeaseLost`` is: the device passed to another holder)."""
    if progress:
        progress(device.name, "-", "copy curve", "device<->host copies, 4 KiB ... 64 MiB")
    curve = measure_copy_curve(tracker, device, target_kind(effective_target(device)), config)
    try:
        store.record_copy_curve(curve, sweep_id, attempt, lease)
    except StoreError as exc:
        log.error("%s", exc.message)


@dataclass
class SweepOutcome:
    sweep_id: int
    status: str
    cells: list[CellResult] = field(default_factory=list)
    skipped: int = 0  # cells already done (resume)
    seconds: float = 0.0
    # the cells that are not ok, by where they stand (``CellStanding``): what the sweep's exit says, and --resume redoes
    not_ok: dict[CellStanding, list[tuple[str, str]]] = field(default_factory=dict)

    @property
    def missing(self) -> list[tuple[str, str]]:
        """The cells --resume measures again: never measured, only offline, or failed with retries left."""
        return [cell for standing, cells in self.not_ok.items() if standing.redone for cell in cells]


def missing_cells(spec: SweepSpec, done: dict[tuple[str, str], list[StoredAttempt]]) -> list[tuple[str, str]]:
    """Cells without a final attempt (ok, or failed for good) and with retries left, in sweep order."""
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
    (``OFFLINE_ATTEMPT``: it spends none of the cell's retries, and ``farm sweep --resume`` measures it); under
    ``ctx.lease`` where a lab's cell holds one (#61: it was stored without)."""
    return store_offline(store, device, model, ctx.config, ctx.sweep_id,
                         f"no server with key {device.key!r} is registered with the tracker at {ctx.tracker}",
                         f"bring it up (farm serve --device {device.name}), then farm sweep --resume {ctx.sweep_id}",
                         ctx.lease)


def store_offline(store: Store, device: Device, model: ModelSource, config: BenchConfig, sweep_id: int | None,
                  reason: str, hint: str, lease: Lease | None = None) -> CellResult:
    """A cell that could not be reached, stored failed at step "offline" with ``reason`` and ``hint``, as attempt 0
    (``OFFLINE_ATTEMPT``): a device with no server, or a lab host with no worker (``lab.worker``)."""
    result = unmeasured_result(device, model, config, "offline", reason, hint, "not reached: device offline")
    return store_unmeasured(store, result, device, model, sweep_id, OFFLINE_ATTEMPT, lease)


def store_unmeasured(store: Store, result: BenchResult, device: Device, model: ModelSource, sweep_id: int | None,
                     attempt: int, lease: Lease | None = None) -> CellResult:
    """A cell's result that measured nothing (``failures.unmeasured_result``), stored as its ``attempt`` (under
    ``lease``, a lab cell's)."""
    run_id = store.record_cell(RunToStore(result, device, model, None, attempt), sweep_id=sweep_id, lease=lease)[0]
    return CellResult(run_id, result, None)


def prepare(devices: dict[str, Device], spec: SweepSpec) -> tuple[SweepSpec, dict[str, ModelSource], dict[str, str]]:
    """The spec with each cell model's stored name (``SweepSpec.stored_names``) and, for a new sweep, its identity
    (``SweepSpec.model_digests``); the models by cell name; and why a resumed sweep's models cannot be measured
    (``changed_models``, or one that no longer loads: a stand-in then carries its stored name). An unknown device, a
    new sweep's model that does not load, or two models that would be stored under one name fail here, before any
    work (a sweep on one host or over lab hosts alike)."""
    unknown = [d for d in spec.devices if d not in devices]
    if unknown:
        raise FarmError(f"sweep names unknown device(s): {', '.join(unknown)}", "see farm devices")
    models, unloadable = {}, {}
    for name in spec.cell_models():
        try:
            models[name] = load_model_variant(name, spec.shapes_of(name))
        except ModelError as exc:
            if not spec.model_digests:  # a new sweep: bad input, said before anything is stored
                raise
            models[name], unloadable[name] = stand_in_model(spec, name), f"the model does not load: {exc.message}"
    refuse_shared_names(models)
    digests = spec.model_digests or {name: model.identity_digest for name, model in models.items()}
    spec = dataclasses.replace(spec, stored_names={name: model.name for name, model in models.items()},
                               model_digests=digests)
    return spec, models, {**changed_models(spec, {n: m for n, m in models.items() if n not in unloadable}), **unloadable}


def stand_in_model(spec: SweepSpec, name: str) -> ModelSource:
    """What stands for a cell's model that cannot be loaded, in what is stored of it: its stored name and the
    identity its sweep recorded (no bytes)."""
    return ModelSource(spec.stored_names.get(name, name), name, spec.model_digests.get(name, ""), b"", ())


def refuse_shared_names(models: dict[str, ModelSource]) -> None:
    """Two different models the store would keep under one name (``a/model.onnx`` and ``b/model.onnx``; ``x:build``
    and ``y:build``) share a cell: one would never be measured, and the sweep would say done (#61)."""
    named: dict[str, list[str]] = {}
    for cell_name, model in models.items():
        named.setdefault(model.name, []).append(cell_name)
    for stored, cell_names in named.items():
        if len({models[n].identity_digest for n in cell_names}) > 1:
            raise FarmError(f"models {' and '.join(repr(n) for n in cell_names)} are different models, both stored as "
                            f"{stored!r}: one of them would never be measured",
                            "give the files (or factories) distinct names, or sweep them apart")


def changed_models(spec: SweepSpec, models: dict[str, ModelSource]) -> dict[str, str]:
    """The cell models whose identity is not the one the sweep started with, and why, in words ({} for a sweep
    stored before identities were: nothing to compare)."""
    return {name: f"model changed since the sweep started: {model.origin} is {model.identity_digest[:12]} now, "
                  f"{spec.model_digests[name][:12]} when the sweep started"
            for name, model in models.items()
            if name in spec.model_digests and spec.model_digests[name] != model.identity_digest}


def store_changed(store: Store, device: Device, model: ModelSource, config: BenchConfig, sweep_id: int,
                  reason: str, attempt: int, lease: Lease | None = None) -> CellResult:
    """A cell whose model is not the one its sweep started with, or does not load, stored at step "model" as its
    ``attempt``: failed for good (measuring again cannot help: a resume leaves it, and the sweep settles), or as
    offline (``OFFLINE_ATTEMPT``) where a host's own setting refused it (``lab.worker``: a resume measures it)."""
    result = unmeasured_result(device, model, config, "model", reason,
                               "restore the model the sweep started with and resume, or start a new sweep",
                               "not reached: the model")
    return store_unmeasured(store, result, device, model, sweep_id, attempt, lease)


def run_sweep(
    tracker: TrackerAddress, devices: dict[str, Device], spec: SweepSpec, db_path: str | Path, cache_dir: Path,
    progress: Progress | None = None, sweep_id: int | None = None,
) -> SweepOutcome:
    """Run (or, with ``sweep_id``, resume) a sweep: one worker per device, compile pipelined with measurement.
    A device with no server on the tracker when the sweep starts has its cells stored "offline" at once."""
    start = time.monotonic()
    spec, models, changed = prepare(devices, spec)
    with one_sweep_at_a_time(db_path), Store(db_path) as store:
        if sweep_id is None:
            sweep_id = store.start_sweep(spec.to_json())
            done: dict = {}
        else:
            done = store.sweep_attempts(sweep_id)
        ctx = CellContext(tracker, cache_dir, spec.config, spec.tuned, retries=spec.retries, sweep_id=sweep_id,
                          profile_cells=spec.profile_cells,
                          progress=progress, reference_runtime=spec.reference_runtime)
        by_cell = spec.by_cell(done)
        todo = missing_cells(spec, by_cell)
        outcome = SweepOutcome(sweep_id, "running",
                               skipped=len(spec.devices) * len(spec.cell_models()) - len(todo))
        for device_name, model_name in [cell for cell in todo if cell[1] in changed]:
            attempt = spec.attempts_spent(by_cell[(device_name, model_name)]) + 1
            outcome.cells.append(store_changed(store, devices[device_name], models[model_name], spec.config, sweep_id,
                                               changed[model_name], attempt))
        todo = [cell for cell in todo if cell[1] not in changed]
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
        finish(store, spec, outcome)
    outcome.seconds = time.monotonic() - start
    return outcome


# A sweep's stored status once it ends (``sweep_status``): every cell ok; every cell ok or failed for good (nothing
# left that a resume would measure: it has settled); or cells a resume measures again. The CLI exits 0 for DONE only.
DONE, FINISHED_WITH_FAILURES, INCOMPLETE = "done", "finished with failures", "incomplete"


def sweep_status(not_ok: dict[CellStanding, list[tuple[str, str]]]) -> str:
    """The status of a sweep whose cells that are not ok stand as ``not_ok`` (#61: a sweep whose only failures were
    for good stayed "incomplete", and cron's --resume --if-incomplete resumed it every night, measuring nothing)."""
    if not not_ok:
        return DONE
    return INCOMPLETE if any(standing.redone for standing in not_ok) else FINISHED_WITH_FAILURES


@contextlib.contextmanager
def one_sweep_at_a_time(db_path: str | Path) -> Iterator[None]:
    """Hold the sweep lock of a SQLite database (a file beside it, ``SWEEP_LOCK``) while a sweep on one host runs:
    a night that overran and the next one would measure the same devices at once, each timing the other's load
    (#61). The kernel drops the lock with its process, so a killed sweep leaves none behind. A lab's sweeps
    (PostgreSQL) hold each device's lease instead."""
    if is_url(str(db_path)) or str(db_path) in _HELD:  # held already by this process: the sweep's review holds it too
        yield
        return
    path = Path(f"{db_path}{SWEEP_LOCK}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            held.seek(0)
            raise FarmError(f"another farm sweep is running on {db_path} ({held.read().strip() or 'its process'}): "
                            "two sweeps at once would time each other's load",
                            "wait for it to end (cron: run the next night after it), or give this one its own "
                            "--db") from exc
        held.truncate(0)
        held.write(f"pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        held.flush()
        _HELD.add(str(db_path))
        try:
            yield
        finally:
            _HELD.discard(str(db_path))
            fcntl.flock(held, fcntl.LOCK_UN)


def finish(store: Store, spec: SweepSpec, outcome: SweepOutcome) -> None:
    """Store the sweep's status (``sweep_status``; #50: a sweep with a cell stored offline or failed said "done" and
    exited 0), with each cell that is not ok in ``outcome.not_ok`` by where it stands (never measured, offline,
    failed with retries left: --resume measures them; failed for good)."""
    outcome.not_ok = cells_not_ok(store, spec, outcome.sweep_id)
    outcome.status = sweep_status(outcome.not_ok)
    store.finish_sweep(outcome.sweep_id, outcome.status)


def cells_not_ok(store: Store, spec: SweepSpec, sweep_id: int) -> dict[CellStanding, list[tuple[str, str]]]:
    """The sweep's cells that are not ok, by where they stand (in ``CellStanding``'s order, each in sweep order)."""
    attempts = spec.by_cell(store.sweep_attempts(sweep_id))
    found: dict[CellStanding, list[tuple[str, str]]] = {}
    for cell in spec.cells():
        standing = spec.standing(attempts.get(cell, []))
        if standing != CellStanding.OK:
            found.setdefault(standing, []).append(cell)
    return {standing: found[standing] for standing in CellStanding if standing in found}


def standing_text(not_ok: dict[CellStanding, list[tuple[str, str]]], shown: int = 5) -> str:
    """'never measured: a × mlp; failed, retries left: b × convnet, c × convnet' (the first ``shown`` of each)."""
    return "; ".join(f"{standing.value}: " + ", ".join(f"{d} × {m}" for d, m in cells[:shown])
                     + (f" and {len(cells) - shown} more" if len(cells) > shown else "")
                     for standing, cells in not_ok.items())


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
        curves = store.sweep_curves(ctx.sweep_id, device.name) if ctx.sweep_id is not None else []
        if is_gpu(device) and "ok" not in curves:  # a resume measures a curve only where none was stored ok
            record_copy_curve(ctx.tracker, device, ctx.config, store, ctx.sweep_id, ctx.progress, len(curves) + 1)
