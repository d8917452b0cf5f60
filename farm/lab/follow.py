"""A sweep over several lab hosts, from the side that queues and follows it: its cells deferred as jobs on
the lab's queue (``enqueue_sweep``; ``queued_devices``: whether a sweep's devices are all on lab hosts), followed
from anywhere (``follow_sweep``, ``progress_text``), and a host that took none of its jobs given up
(``host_gone``). worker.py is the other side: the ``farm worker`` that runs them."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Callable

from farm.errors import FarmError, ModelError
from farm.models import load_model_variant
from farm.lab.jobs import (BUILD, CELL, CURVE, HOST_WAIT_S, Job, SweepJobs, build_queueing_lock,
                           cell_lock)
from farm.lab.queue import LabQueue
from farm.records import (Device, ModelSource, SweepSpec)
from farm.store import Store
from farm.store.locations import require_server
from farm.store.backends import RECONNECT_S
from farm.sweep.run import (SweepOutcome, finish, is_gpu, missing_cells, prepare, stand_in_model, store_offline)



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
    spec, _, _ = prepare(devices, spec)  # a resumed sweep's changed models: each cell's worker stores why
    require_server(db_url, "a sweep over lab hosts")
    lab = LabQueue(db_url)
    with Store(db_url, wait_s=RECONNECT_S) as store:
        if sweep_id is None:
            sweep_id = store.start_sweep(spec.to_json())
        # a resume: cells whose job waits or runs get no new build. Read before the stored attempts: a cell whose
        # job ends between the two reads is then in one or the other, never missing from both (a second build)
        queued = lab.waiting_or_running(sweep_id)
        todo = missing_cells(spec, spec.by_cell(store.sweep_attempts(sweep_id)))
    jobs = [Job(BUILD, "", device_name, {"sweep_id": sweep_id, "device": device_name, "model": model_name},
                build_queueing_lock(sweep_id, device_name, model_name), build_group(devices[device_name], model_name))
            for device_name, model_name in todo if cell_lock(sweep_id, device_name, model_name) not in queued]
    seen: set[str] = set()
    for device_name, model_name in todo:
        device = devices[device_name]
        jobs.append(Job(CELL, str(device.lab_host), device_name,
                        {"sweep_id": sweep_id, "device": device_name, "model": model_name,
                         "first": device_name not in seen},
                        cell_lock(sweep_id, device_name, model_name)))
        seen.add(device_name)
    jobs += [Job(CURVE, str(devices[name].lab_host), name, {"sweep_id": sweep_id, "device": name},
                 f"curve:{sweep_id}:{name}") for name in spec.devices if name in seen and is_gpu(devices[name])]
    lab.defer(jobs)
    return sweep_id, spec


def build_group(device: Device, model: str) -> str:
    """What a build's artifact key depends on that the inventory states (the model, the device's kind, target, host,
    export, compiler and settings), hashed: devices alike share it, so their builds take one lock and one artifact
    (the key itself needs the model's bytes and the records, which the build worker reads)."""
    fields = [model, device.kind, device.target, device.host, device.export, device.options.get("cc"), device.threads,
              device.weight_prepack, *([device.layout] if device.layout else [])]
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def progress_text(sweep_id: int, jobs: SweepJobs) -> str:
    """'sweep 7: 12 done, 3 running, 25 waiting · lab1 2/8, lab2 10/32'."""
    hosts = ", ".join(f"{host} {counts.get('succeeded', 0)}/{sum(counts.values())}"
                      for host, counts in sorted(jobs.by_host.items()))
    failed = jobs.count("failed", "cancelled", "aborted")
    builds = jobs.builds
    built = (f" · builds: {builds.get('succeeded', 0)} built, {builds.get('doing', 0)} building, "
             f"{builds.get('todo', 0)} waiting, {builds.get('cancelled', 0)} taken by cells") if builds else ""
    return (f"sweep {sweep_id}: {jobs.count('succeeded')} done, {jobs.count('doing')} running, "
            f"{jobs.count('todo')} waiting" + (f", {failed} failed" if failed else "") + f" · {hosts}{built}")


def follow_sweep(db_url: str, devices: dict[str, Device], spec: SweepSpec, sweep_id: int,
                 say: Callable[[str], None] | None = None, started: float | None = None,
                 host_wait_s: float = HOST_WAIT_S) -> SweepOutcome:
    """Follow a queued sweep until none of its jobs waits or runs (``follow_jobs``); then store its status, "done"
    when every cell is ok, else "incomplete" (``run.finish``)."""
    start = started if started is not None else time.monotonic()
    follow_jobs(db_url, devices, spec, sweep_id, say, host_wait_s)
    outcome = SweepOutcome(sweep_id, "running")
    with Store(db_url, wait_s=RECONNECT_S) as store:
        finish(store, spec, outcome)
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
        lab.prune_dead_workers()  # a killed worker's row goes now, not when the next worker starts
        for host in lab.silent_hosts(sweep_id, host_wait_s):
            cancelled = lab.cancel_waiting(sweep_id, host)
            for task, args in cancelled:  # the cell's build would wait for no cell: cancelled too, if it waits
                if task == CELL:
                    lab.settle_build(sweep_id, args["device"], args["model"])
            gone = host_gone(db_url, devices, spec, sweep_id, host, cancelled, host_wait_s)
            if say and cancelled:
                say(f"lab host {host}: no farm worker took its jobs for {host_wait_s / 60:g} min; {gone} cell(s) "
                    f"stored offline" + (f", {len(cancelled) - gone} other job(s) cancelled" if len(cancelled) > gone else ""))
        jobs = lab.sweep_jobs(sweep_id)
        if say and (text := progress_text(sweep_id, jobs)) != last:
            say(text)
            last = text
        if not jobs.active:
            lab.cancel_waiting_builds(sweep_id)
            return
        time.sleep(FOLLOW_S)


def host_gone(db_url: str, devices: dict[str, Device], spec: SweepSpec, sweep_id: int, lab_host: str,
              cancelled: list[tuple[str, dict]], waited_s: float) -> int:
    """Store each cancelled cell job of a silent lab host ``offline`` (attempt 0: a resume measures it), with why
    and what to do, unless the cell is done (its job was put back after its result was stored); a copy curve's or a
    tuning job is dropped. Returns the cells stored offline."""
    cells = [args for task, args in cancelled if task == CELL]
    models: dict[str, ModelSource] = {}
    with Store(db_url, wait_s=RECONNECT_S) as store:
        attempts = spec.by_cell(store.sweep_attempts(sweep_id))
        cells = [args for args in cells if not spec.cell_done(attempts.get((args["device"], args["model"]), []))]
        for args in cells:
            name = args["model"]
            if name not in models:
                try:
                    models[name] = load_model_variant(name, spec.shapes_of(name))
                except ModelError:  # what is stored of it needs its name only
                    models[name] = stand_in_model(spec, name)
            store_offline(store, devices[args["device"]], models[name], spec.config, sweep_id,
                          f"lab host {lab_host} did not take its jobs for {waited_s / 60:g} min: no farm worker runs "
                          "there, or every one stopped",
                          f"start one there (farm worker --lab-host {lab_host} --serve), then farm sweep --resume "
                          f"{sweep_id}")
    return len(cells)
