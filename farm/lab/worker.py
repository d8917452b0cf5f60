"""A sweep over several lab hosts: its cells as jobs on the lab's queue (``farm.lab.queue``), measured by the
``farm worker`` of each device's host (``serve_lab_host``), followed from anywhere (follow.py).

A queued sweep is today's sweep cut at the cell: the enqueueing side stores the sweep's spec and defers one job per
missing cell (sweep order; ``first`` on each device's first) and one copy-curve job per GPU device after its cells;
a worker's job reads the spec back, and measures and stores the cell through the same ``run_cell`` as a sweep on one
host. What a job does is safe to do twice: it measures only a cell that is not done (``SweepSpec.cell_done``), and
the store keeps one row per attempt (``cell_key``), so a job delivered again stores nothing new.

The offline rule is the worker's: a device whose key has no server on its host's tracker has its cell stored
"offline" at once.

Compiles are jobs of their own (``BUILD``, deferred before the cells): a build worker (``farm worker --builds``, on
any host whose toolchain builds for the device) compiles the cell's artifact with the store's records, puts its
library in the lab's artifact store and records its key for the cell (``LabWorker.build``). The cell's worker then
reads it by that key and checks its sha256 before it reaches the device (``LabWorker.artifact``). A cell whose
build still waits when the cell starts takes it over and compiles on its own host, as it did before build jobs;
one whose build is running waits for it (``BUILD_WAIT_S``). So a lab without build workers loses nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from farm.compile import (PIPELINE_VERSION, TVM_VERSION, artifact_file, effective_target,
                          install_artifact, planned_key)
from farm.errors import BuildError, FarmError, LeaseLost, ModelError, StoreError
from farm.models import load_model_variant, torch_spec
from farm.lab.jobs import (BUILD, CELL, CURVE, TUNE, BuildState, build_queue, queue_of)
from farm.lab.queue import LabQueue
from farm.records import (OFFLINE_ATTEMPT, Artifact, Device, ModelSource, StoredAttempt, SweepBuild, SweepSpec,
                          TrackerAddress, split_variant)
from farm.store import Store, shared_store
from farm.store.locations import is_url
from farm.compile.child import compile_apart
from farm.signing import KEY_ENV, lab_key, sign, unsigned_reason
from farm.sweep.cell import CellContext, Progress, compile_or_error, run_cell
from farm.sweep.failures import unmeasured_result
from farm.lab.leases import LeaseKeeper
from farm.tune.tuning_set import tuning_set
from farm.sweep.run import (changed_models, offline_cell, offline_keys,
                            record_copy_curve, stand_in_model, store_changed, store_unmeasured)



log = logging.getLogger("farm.sweep.lab")  # the name its warnings have always carried
BUILD_WAIT_S = 1800.0  # a cell waits this long for its running build job, then compiles on its own host
BUILD_POLL_S = 1.0


@dataclass
class LabWorker:
    """What one ``farm worker`` process's jobs share: its host's devices and tracker, the database, the artifact
    cache, and the models loaded so far (each once per process)."""

    db_url: str
    devices: dict[str, Device]
    tracker: TrackerAddress
    cache_dir: Path
    progress: Progress | None = None
    name: str | None = None  # the worker's name, recorded with what it builds

    def __post_init__(self) -> None:
        self._models: dict[tuple[str, str], ModelSource] = {}
        self._lock = threading.Lock()
        self.leases = LeaseKeeper(self.db_url)
        if is_url(self.db_url):  # a worker's always is
            shared_store(self.db_url)  # before any job: the queue's own statements use its connection from the first

    def store(self) -> contextlib.AbstractContextManager[Store]:
        """The worker's one store, shared by its jobs (``store.shared_store``: one connection, whatever its slots)."""
        return contextlib.nullcontext(shared_store(self.db_url))

    def model(self, spec: SweepSpec, name: str) -> ModelSource:
        """The cell model ``name``, loaded once per process while it is the model the sweep names
        (``SweepSpec.model_digests``): one loaded for an earlier sweep is loaded again when the sweep names another
        identity (#61: a model re-exported between nights was measured as the night before's)."""
        shapes = spec.shapes_of(name)
        wanted = spec.model_digests.get(name)
        refuse_unlisted_factory(split_variant(name)[0])
        with self._lock:
            key = (name, repr(shapes))
            cached = self._models.get(key)
            if cached is None or (wanted is not None and cached.identity_digest != wanted):
                cached = self._models[key] = load_model_variant(name, shapes)
            return cached

    def model_or_problem(self, spec: SweepSpec, name: str) -> tuple[ModelSource, str]:
        """The cell model and why it cannot be measured ('' when it can): it does not load here, or it is not the
        model the sweep started with. A stand-in carries its stored name where it does not load."""
        try:
            source = self.model(spec, name)
        except ModelError as exc:
            return stand_in_model(spec, name), f"the model does not load on this host: {exc.message}"
        return source, changed_models(spec, {name: source}).get(name, "")

    @staticmethod
    def host_setting(problem: str) -> bool:
        """Whether ``problem`` is this host's setting (a factory its FARM_LAB_FACTORIES does not list), which its
        owner can change: the cell is then stored as offline (attempt 0), so a resume measures it again."""
        return FACTORIES_ENV in problem

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
                                 profile_cells=spec.profile_cells,
                                 sweep_id=sweep_id, progress=self.progress, reference_runtime=spec.reference_runtime)

    def cell(self, sweep_id: int, device: str, model: str, first: bool) -> str:
        """One cell's job: measured and stored unless it is done already (the job delivered again), while it holds
        the device's lease (``lab.leases``): a result measured after the lease passed to another holder is
        refused and logged, never stored. Its build job is settled first: taken over if it still waits
        (``LabQueue.settle_build``)."""
        build = LabQueue(self.db_url).settle_build(sweep_id, device, model)
        with self.store() as store:
            spec, ctx = self.context(store, sweep_id)
            if self._attempts_unless_done(store, spec, sweep_id, device, model) is None:
                return "done before"
            target, (source, problem) = self.device(device), self.model_or_problem(spec, model)
            try:  # a result measured or refused after the lease passed to another holder: logged, never stored
                with self.leases.hold(store, target.name, self.holder(sweep_id, device, model),
                                      self._say(device, model)) as lease:
                    attempts = self._attempts_unless_done(store, spec, sweep_id, device, model)
                    if attempts is None:  # its earlier holder stored it meanwhile
                        return "done before"
                    ctx = dataclasses.replace(ctx, lease=lease)
                    if problem:  # stored failed for good (a resume leaves it), or offline where it is this host's setting
                        if self.progress:
                            self.progress(device, model, "model", problem)
                        store_changed(store, target, source, ctx.config, sweep_id, problem,
                                      OFFLINE_ATTEMPT if self.host_setting(problem) else spec.attempts_spent(attempts) + 1,
                                      lease)
                        return "model refused"
                    if offline_keys(self.tracker, {target.key}):
                        if self.progress:
                            self.progress(device, model, "offline", f"no server for key {target.key!r}")
                        offline_cell(ctx, store, target, source)
                        return "offline"
                    if lease.taken_over:  # its earlier holder may still hold the RPC session: the server ends it by then
                        ctx = dataclasses.replace(ctx, config=dataclasses.replace(
                            ctx.config, timeout_s=ctx.config.timeout_s + target.session_timeout_s))
                    artifact = self.artifact(ctx, store, target, source, build)
                    cell = run_cell(ctx, store, target, source, artifact, first, spec.attempts_spent(attempts) + 1)
                    return cell.result.status
            except LeaseLost as exc:
                log.error("sweep %d, %s × %s: %s", sweep_id, device, model, exc.message)
                return "lease lost"

    def poisoned(self, task: str, args: dict, deliveries: int) -> bool:
        """A job whose worker died under it ``deliveries`` times (``lab.jobs.MAX_DELIVERIES``), ended failed: a cell is
        stored failed for good with why, under its device's lease (its last holder died: the lease is taken over
        once it lapsed), unless it was stored meanwhile; a copy curve, a tuning job or a build ends with its job (a
        build's cell compiles on its own host, and is bounded in turn). True where the cell was done before."""
        if task != CELL:
            log.error("%s %s: its worker died %d times under it: not run again", task, args, deliveries)
            return False
        sweep_id, device, model = args["sweep_id"], args["device"], args["model"]
        with self.store() as store:
            spec, ctx = self.context(store, sweep_id)
            target = self.device(device)
            stand_in = stand_in_model(spec, model)
            with self.leases.hold(store, target.name, self.holder(sweep_id, device, model), self._say(device, model)) \
                    as lease:
                attempts = self._attempts_unless_done(store, spec, sweep_id, device, model)
                if attempts is None:
                    return True
                result = unmeasured_result(target, stand_in, ctx.config, "worker died",
                                           f"the worker died {deliveries} times measuring it: its process ended (a "
                                           "crash, or the host out of memory) in the model's import, its compile or "
                                           "its runtime",
                                           "see the lab host's log (dmesg for an OOM kill); the cell is not measured "
                                           "again, so the sweep can end", "not reached: the worker died")
                store_unmeasured(store, result, target, stand_in, sweep_id, spec.attempts_spent(attempts) + 1, lease)
        return False

    def holder(self, sweep_id: int, device: str, model: str) -> str:
        return f"{self.name or 'a worker'}/{threading.current_thread().name} (sweep {sweep_id}: {device} × {model})"

    def _say(self, device: str, model: str) -> Callable[[str], None] | None:
        progress = self.progress
        return (lambda text: progress(device, model, "lease", text)) if progress else None

    def _attempts_unless_done(self, store: Store, spec: SweepSpec, sweep_id: int, device: str,
                              model: str) -> list[StoredAttempt] | None:
        """The cell's stored attempts, or None (said) when it is done: a job delivered again measures nothing."""
        attempts = spec.by_cell(store.sweep_attempts(sweep_id)).get((device, model), [])
        if not spec.cell_done(attempts):
            return attempts
        if self.progress:
            self.progress(device, model, "done before", "stored already, nothing measured")
        return None

    def artifact(self, ctx: CellContext, store: Store, device: Device, model: ModelSource,
                 build: BuildState) -> Artifact | FarmError:
        """The cell's artifact: its build job's (``build``: its status once settled), read from the lab's artifact
        store once that job has built it (waited for while it runs, ``BUILD_WAIT_S``), if it is what this host
        would build (``_stored_build``); else compiled here, as a sweep on one host does."""
        assert ctx.sweep_id is not None
        lab, deadline = LabQueue(self.db_url), time.monotonic() + BUILD_WAIT_S
        while build == BuildState.DOING and time.monotonic() < deadline:
            time.sleep(BUILD_POLL_S)
            build = lab.settle_build(ctx.sweep_id, device.name, model.name)
        made = self._stored_build(ctx, store, device, model, build == BuildState.SUCCEEDED)
        if isinstance(made, Artifact):
            return made
        if made:
            log.warning("%s × %s: %s: compiling here", device.name, model.name, made)
        return compile_or_error(ctx, store, device, model, apart=True)  # a crash fails the cell, not the worker

    def _stored_build(self, ctx: CellContext, store: Store, device: Device, model: ModelSource,
                      built: bool) -> Artifact | str:
        """The artifact the cell's build job stored (``built``: the job succeeded), else one a device alike's build
        stored under the key this host would build (``planned_key``), installed in this host's cache: only when it
        is built for the model, target, export, tuning records and TVM this host would compile with (a device
        whose target depends on its host, or a builder with another inventory or store, builds something else),
        and its bytes have the sha256 its builder recorded. Else why not, in words ('' when no build was made:
        the caller compiles)."""
        assert ctx.sweep_id is not None
        tuning = tuning_set(store, device) if ctx.tuned else None
        made = store.sweep_builds(ctx.sweep_id).get((device.name, model.name)) if built else None
        if made is None:
            try:
                key = planned_key(model, device, tuning)
            except FarmError:
                return ""  # no toolchain here: the compile says so
            if store.artifact_file_head(key) is None:
                return "" if not built else "its build job stored nothing"
            made = SweepBuild(key, None, "a build of a device alike")
        if made.error or made.cache_key is None:
            return f"its build failed on {made.builder} ({made.error})"
        if (stored := store.artifact_file(made.cache_key)) is None:
            return f"its artifact {made.cache_key[:12]} is not in the lab's store"
        meta = stored[1]
        secret = lab_key()
        if refused := unsigned_reason(secret, meta):  # the row's own sha256 tells damage, not tampering (#62)
            log.error("%s × %s: the artifact %s in the lab's store is refused: %s", device.name, model.name,
                      str(made.cache_key)[:12], refused)
            if secret is not None:  # a row the lab key never signed: dropped, so the next build stores a signed one
                store.drop_artifact_file(made.cache_key)
            return f"its artifact is refused: {refused}"
        want = {"model_digest": model.digest, "target": effective_target(device), "export": device.export,
                "tuning_digest": tuning.digest if tuning is not None and tuning.records else "",
                "tvm_version": TVM_VERSION, "pipeline_version": PIPELINE_VERSION}
        got = {field: meta.get(field) for field in want}
        if json.dumps(got, sort_keys=True) != json.dumps(want, sort_keys=True):
            return f"{made.builder} built it as {got}, not as this host compiles it ({want})"
        try:
            artifact = install_artifact(self.cache_dir, *stored)
        except BuildError as exc:
            store.drop_artifact_file(made.cache_key)  # the next build of the key stores it again
            return exc.message
        if self.progress:
            took = f" in {made.build_s:.1f} s" if made.build_s is not None else ""
            self.progress(device.name, model.name, "artifact", f"built by {meta.get('builder', made.builder)}{took}, "
                          f"{len(stored[2]) / 1e6:.1f} MB from the lab's store, sha256 checked")
        return artifact

    def build(self, sweep_id: int, device: str, model: str) -> str:
        """A cell's build job (on a build worker): the artifact compiled with the store's records (this host's cache
        first), its library put in the lab's artifact store, its key recorded for the cell (``sweep_builds``); or
        the build's error (the cell then compiles on its own host: the error may be this host's)."""
        name = self.name or "a build worker"
        with self.store() as store:
            spec, _ = self.context(store, sweep_id)
            target, source = self.device(device), self.model(spec, model)
            tuning = tuning_set(store, target) if spec.tuned else None  # read once: the key and the compile's
            try:
                key = planned_key(source, target, tuning)
                if (stored := store.artifact_file_head(key)) is not None:  # a device alike built it (its group's lock)
                    store.record_sweep_build(sweep_id, device, model, stored[1].get("builder", name), cache_key=key,
                                             build_s=stored[1].get("build_s"))
                    if self.progress:
                        self.progress(device, model, "artifact", f"{key[:12]} in the lab's store already")
                    return "built before"
                if self.progress:
                    self.progress(device, model, "compile", f"build job on {name}")
                artifact = compile_apart(source, target, self.cache_dir, tuning)  # a crash fails the build alone
            except FarmError as exc:
                store.record_sweep_build(sweep_id, device, model, name, error=exc.message, hint=exc.hint)
                return "failed"
            if store.artifact_file_head(artifact.cache_key) is None:
                meta, data = artifact_file(artifact)
                if (signing := lab_key()) is None:
                    log.warning("%s × %s: this build worker has no lab key (%s): the library it stores is run by no "
                                "host", device, model, KEY_ENV)
                meta = {**meta, "builder": name}
                store.put_artifact_file(artifact.cache_key, artifact.file_digest, sign(signing, meta) if signing else meta, data)
            store.record_sweep_build(sweep_id, device, model, name, cache_key=artifact.cache_key,
                                     build_s=artifact.build_s)
            return "built"

    def curve(self, sweep_id: int, device: str) -> str:
        """A GPU device's copy curve, after its cells (the same device lock: they ran first), under the device's
        lease; not measured again once one is stored ok for the sweep (a redelivered job, a resume)."""
        with self.store() as store:
            spec, _ = self.context(store, sweep_id)
            target = self.device(device)
            with self.leases.hold(store, target.name, self.holder(sweep_id, device, "copy curve"),
                                  self._say(device, "-")) as lease:
                curves = store.sweep_curves(sweep_id, device)
                if "ok" in curves:
                    return "done before"
                if offline_keys(self.tracker, {target.key}):
                    return "offline"
                try:
                    record_copy_curve(self.tracker, target, spec.config, store, sweep_id, self.progress,
                                      len(curves) + 1, lease)
                except LeaseLost as exc:
                    log.error("sweep %d, %s's copy curve: %s", sweep_id, device, exc.message)
                    return "lease lost"
                return "stored"


FACTORIES_ENV = "FARM_LAB_FACTORIES"  # the module:factory models a lab spec may run on this host (fnmatch patterns)


def refuse_unlisted_factory(name: str) -> None:
    """A ``module:factory`` model imports and runs its module's code: from a lab's spec (any host that queues work
    writes it) only where this host's own configuration lists it (``FACTORIES_ENV``, comma-separated patterns such
    as ``mymodels:*``), else a ``ModelError`` (#62). Files (ONNX, TFLite, .pt2) and built-ins are data: always."""
    if not is_factory(name):
        return
    allowed = [p.strip() for p in os.environ.get(FACTORIES_ENV, "").split(",") if p.strip()]
    if not any(fnmatch.fnmatchcase(name, pattern) for pattern in allowed):
        raise ModelError(f"{name} is a module:factory model, whose code runs on the host that loads it; this host "
                         f"runs those of a lab's spec only when {FACTORIES_ENV} lists them",
                         f"on this host: export {FACTORIES_ENV}='{name.partition(':')[0]}:*' (the service's "
                         "environment), then resume the sweep")


def is_factory(name: str) -> bool:
    """``module:factory``: what ``models.load_model`` imports and calls (``models.torch_spec``, not a .pt2 file)."""
    return torch_spec(name) and not name.endswith(".pt2")


def serve_lab_host(db_url: str, lab_host: str, worker: LabWorker, slots: int, name: str, wait: bool = True,
                   tuning: Callable[..., str] | None = None) -> None:
    """Run ``farm worker``'s queue worker for ``lab_host``: ``slots`` jobs at once, over its devices: cells, copy
    curves, and with ``tuning`` (``night.tuning.LabTuning``) its keys' nightly tuning."""
    handlers: dict[str, Callable[..., str]] = {CELL: worker.cell, CURVE: worker.curve}
    if tuning is not None:
        handlers[TUNE] = tuning
    LabQueue(db_url).serve([queue_of(lab_host)], handlers, slots, name, wait, poisoned=worker.poisoned)


def buildable(devices: dict[str, Device]) -> tuple[list[str], dict[str, str]]:
    """The devices this host builds for (their toolchain is here: ``toolchain_for``), and why not for the others."""
    from farm.compile import effective_target, toolchain_for

    yes, no = [], {}
    for name, device in devices.items():
        try:
            toolchain_for(device, effective_target(device))
            yes.append(name)
        except FarmError as exc:
            no[name] = exc.message
    return yes, no


def serve_builds(db_url: str, worker: LabWorker, names: list[str], name: str, wait: bool = True) -> None:
    """Run ``farm worker --builds``: the build jobs of the devices ``names`` (their build queues), one at a time
    (TVM's compiler: one build per process; start more workers for more)."""
    LabQueue(db_url).serve([build_queue(device) for device in names], {BUILD: worker.build}, 1, name, wait,
                           poisoned=worker.poisoned)
