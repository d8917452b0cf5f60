"""A sweep over several lab hosts: its cells as jobs on the lab's queue (``farm.queue``), measured by the
``farm worker`` of each device's host (``serve_lab_host``), followed from anywhere (``follow_sweep``).

A queued sweep is today's sweep cut at the cell: the enqueueing side stores the sweep's spec and defers one job per
missing cell (sweep order; ``first`` on each device's first) and one copy-curve job per GPU device after its cells;
a worker's job reads the spec back, and measures and stores the cell through the same ``run_cell`` as a sweep on one
host. What a job does is safe to do twice: it measures only a cell that is not done (``SweepSpec.cell_done``), and
the store keeps one row per attempt (``cell_key``), so a job delivered again stores nothing new.

The offline rule is the worker's: a device whose key has no server on its host's tracker has its cell stored
"offline" at once. Compiles run in the measuring worker (its host's artifact cache, one build at a time per process).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from farm.errors import FarmError, StoreError
from farm.models import load_model_variant
from farm.queue import CELL, CURVE, HOST_WAIT_S, TUNE, Job, LabQueue, SweepJobs, cell_lock
from farm.records import Device, ModelSource, SweepSpec, TrackerAddress, split_variant
from farm.store import Store
from farm.store.backends import is_url
from farm.sweep.cell import CellContext, Progress, compile_or_error, run_cell
from farm.sweep.run import (SweepOutcome, finish, is_gpu, missing_cells, offline_cell, offline_keys, prepare,
                            record_copy_curve, store_offline)

log = logging.getLogger(__name__)

FOLLOW_S = 2.0  # how often a following sweep reads its jobs' progress


def queued_devices(devices: dict[str, Device], names: tuple[str, ...]) -> bool:
    """Whether a sweep over ``names`` goes through the lab's queue: some device names its lab host. Then each must
    (a device with no host would wait for no worker)."""
    hosted = [name for name in names if name in devices and devices[name].lab_host]
    if not hosted:
        return False
    if unhosted := [name for name in names if name in devices and not devices[name].lab_host]:
        raise FarmError(f"device(s) {', '.join(unhosted)} name no lab_host, but {hosted[0]} does: a sweep over "
                        "lab hosts needs every device's host",
                        'add lab_host = "NAME" to each (the host its phone or server is attached to), or sweep them apart')
    return True


def enqueue_sweep(db_url: str, devices: dict[str, Device], spec: SweepSpec,
                  sweep_id: int | None = None) -> tuple[int, SweepSpec]:
    """Store the sweep (or take ``sweep_id``'s: a resume) and defer its missing cells, then its GPU devices' copy
    curves. Returns the sweep's id and its spec as stored (``run.prepare``: the models' stored names)."""
    spec, _ = prepare(devices, spec)
    if not is_url(db_url):
        raise FarmError("a sweep over lab hosts needs the lab's PostgreSQL database, not a file",
                        "pass --db postgresql://USER@HOST:PORT/DBNAME (or set [store] db in devices.toml)")
    with Store(db_url) as store:
        if sweep_id is None:
            sweep_id = store.start_sweep(spec.to_json())
        todo = missing_cells(spec, spec.by_cell(store.sweep_attempts(sweep_id)))
    jobs, seen = [], set()
    for device_name, model_name in todo:
        device = devices[device_name]
        jobs.append(Job(CELL, str(device.lab_host), device_name,
                        {"sweep_id": sweep_id, "device": device_name, "model": model_name,
                         "first": device_name not in seen},
                        cell_lock(sweep_id, device_name, model_name)))
        seen.add(device_name)
    jobs += [Job(CURVE, str(devices[name].lab_host), name, {"sweep_id": sweep_id, "device": name},
                 f"curve:{sweep_id}:{name}") for name in spec.devices if name in seen and is_gpu(devices[name])]
    LabQueue(db_url).defer(jobs)
    return sweep_id, spec


def progress_text(sweep_id: int, jobs: SweepJobs) -> str:
    """'sweep 7: 12 done, 3 running, 25 waiting · lab1 2/8, lab2 10/32'."""
    hosts = ", ".join(f"{host} {counts.get('succeeded', 0)}/{sum(counts.values())}"
                      for host, counts in sorted(jobs.by_host.items()))
    failed = jobs.count("failed", "cancelled", "aborted")
    return (f"sweep {sweep_id}: {jobs.count('succeeded')} done, {jobs.count('doing')} running, "
            f"{jobs.count('todo')} waiting" + (f", {failed} failed" if failed else "") + f" · {hosts}")


def follow_sweep(db_url: str, devices: dict[str, Device], spec: SweepSpec, sweep_id: int,
                 say: Callable[[str], None] | None = None, started: float | None = None,
                 host_wait_s: float = HOST_WAIT_S) -> SweepOutcome:
    """Follow a queued sweep until none of its jobs waits or runs (``follow_jobs``); then store its status, "done"
    when every cell has a stored attempt, else "incomplete" (resumable)."""
    start = started if started is not None else time.monotonic()
    follow_jobs(db_url, devices, spec, sweep_id, say, host_wait_s)
    outcome = SweepOutcome(sweep_id, "running")
    with Store(db_url) as store:
        finish(store, spec, outcome, spec.cells())
    outcome.seconds = time.monotonic() - start
    return outcome


def follow_jobs(db_url: str, devices: dict[str, Device], spec: SweepSpec, sweep_id: int,
                say: Callable[[str], None] | None = None, host_wait_s: float = HOST_WAIT_S) -> None:
    """Wait until none of the sweep's jobs (cells, curves, tuning) waits or runs; progress goes to ``say`` when it
    changes. A lab host silent for ``host_wait_s`` (``LabQueue.silent_hosts``: no worker took or ran a job of it)
    has its waiting jobs cancelled, and its cells stored "offline" with the reason (``host_gone``): they never
    move to another host's devices."""
    lab, last = LabQueue(db_url), ""
    while True:
        for host in lab.silent_hosts(sweep_id, host_wait_s):
            cancelled = lab.cancel_waiting(sweep_id, host)
            gone = host_gone(db_url, devices, spec, sweep_id, host, cancelled, host_wait_s)
            if say and cancelled:
                say(f"lab host {host}: no farm worker took its jobs for {host_wait_s / 60:g} min; {gone} cell(s) "
                    f"stored offline" + (f", {len(cancelled) - gone} other job(s) cancelled" if len(cancelled) > gone else ""))
        jobs = lab.sweep_jobs(sweep_id)
        if say and (text := progress_text(sweep_id, jobs)) != last:
            say(text)
            last = text
        if not jobs.active:
            return
        time.sleep(FOLLOW_S)


def host_gone(db_url: str, devices: dict[str, Device], spec: SweepSpec, sweep_id: int, lab_host: str,
              cancelled: list[tuple[str, dict]], waited_s: float) -> int:
    """Store each cancelled cell job of a silent lab host ``offline`` (attempt 0: a resume measures it), with why
    and what to do, unless the cell is done (its job was put back after its result was stored); a copy curve's or a
    tuning job is dropped. Returns the cells stored offline."""
    cells = [args for task, args in cancelled if task == CELL]
    models: dict[str, ModelSource] = {}
    with Store(db_url) as store:
        attempts = spec.by_cell(store.sweep_attempts(sweep_id))
        cells = [args for args in cells if not spec.cell_done(attempts.get((args["device"], args["model"]), []))]
        for args in cells:
            name = args["model"]
            if name not in models:
                models[name] = load_model_variant(name, spec.shapes.get(split_variant(name)[0]))
            store_offline(store, devices[args["device"]], models[name], spec.config, sweep_id,
                          f"lab host {lab_host} did not take its jobs for {waited_s / 60:g} min: no farm worker runs "
                          "there, or every one stopped",
                          f"start one there (farm worker --lab-host {lab_host} --serve), then farm sweep --resume "
                          f"{sweep_id}")
    return len(cells)


@dataclass
class LabWorker:
    """What one ``farm worker`` process's jobs share: its host's devices and tracker, the database, the artifact
    cache, and the models loaded so far (each once per process)."""

    db_url: str
    devices: dict[str, Device]
    tracker: TrackerAddress
    cache_dir: Path
    progress: Progress | None = None

    def __post_init__(self) -> None:
        self._models: dict[tuple[str, str], ModelSource] = {}
        self._lock = threading.Lock()

    def model(self, spec: SweepSpec, name: str) -> ModelSource:
        shapes = spec.shapes.get(split_variant(name)[0])
        with self._lock:
            key = (name, repr(shapes))
            if key not in self._models:
                self._models[key] = load_model_variant(name, shapes)
            return self._models[key]

    def device(self, name: str) -> Device:
        if name not in self.devices:
            raise FarmError(f"a job names device {name!r}, which this worker's inventory has not on this host",
                            "run farm worker with the inventory the sweep used, on the device's lab_host")
        return self.devices[name]

    def context(self, store: Store, sweep_id: int) -> tuple[SweepSpec, CellContext]:
        sweep = store.sweep(sweep_id)
        if sweep is None:
            raise StoreError(f"a job names sweep {sweep_id}, which {self.db_url} does not hold",
                             "the worker and the sweep must use the same --db")
        spec = SweepSpec.from_json(sweep["spec"])
        return spec, CellContext(self.tracker, self.cache_dir, spec.config, spec.tuned, retries=spec.retries,
                                 sweep_id=sweep_id, progress=self.progress, reference_runtime=spec.reference_runtime)

    def cell(self, sweep_id: int, device: str, model: str, first: bool) -> str:
        """One cell's job: measured and stored unless it is done already (the job delivered again)."""
        with Store(self.db_url) as store:
            spec, ctx = self.context(store, sweep_id)
            attempts = spec.by_cell(store.sweep_attempts(sweep_id)).get((device, model), [])
            if spec.cell_done(attempts):
                if self.progress:
                    self.progress(device, model, "done before", "stored already, nothing measured")
                return "done before"
            target, source = self.device(device), self.model(spec, model)
            if offline_keys(self.tracker, {target.key}):
                if self.progress:
                    self.progress(device, model, "offline", f"no server for key {target.key!r}")
                offline_cell(ctx, store, target, source)
                return "offline"
            artifact = compile_or_error(ctx, store, target, source)
            cell = run_cell(ctx, store, target, source, artifact, first, spec.attempts_spent(attempts) + 1)
            return cell.result.status

    def curve(self, sweep_id: int, device: str) -> str:
        """A GPU device's copy curve, after its cells (the same device lock: they ran first)."""
        with Store(self.db_url) as store:
            spec, _ = self.context(store, sweep_id)
            target = self.device(device)
            if offline_keys(self.tracker, {target.key}):
                return "offline"
            record_copy_curve(self.tracker, target, spec.config, store, sweep_id, self.progress)
            return "stored"


def serve_lab_host(db_url: str, lab_host: str, worker: LabWorker, slots: int, name: str, wait: bool = True,
                   tuning: Callable[..., str] | None = None) -> None:
    """Run ``farm worker``'s queue worker for ``lab_host``: ``slots`` jobs at once, over its devices: cells, copy
    curves, and with ``tuning`` (``nightly.LabTuning``) its keys' nightly tuning."""
    handlers: dict[str, Callable[..., str]] = {CELL: worker.cell, CURVE: worker.curve}
    if tuning is not None:
        handlers[TUNE] = tuning
    LabQueue(db_url).serve(lab_host, handlers, slots, name, wait)
