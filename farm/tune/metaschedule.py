"""MetaSchedule's plumbing for a farm: candidates built for the device, measured on it through the tracker.

- ``AheadBuilder`` builds a batch in the background; ``PooledBuilder`` builds it, then answers (the device
  measures on this host: no build beside a measurement), in one pool of workers for the session.
- ``AfterBuildRunner`` measures with MetaSchedule's RPC runner, each candidate as soon as its library exists,
  asking the tracker for a session only then (``open_session``: a bounded wait, retried while the key is busy).
- ``PassScheduler`` lets a pass's tasks take turns, so one task's batch is generated while another's is measured.
- Candidates are exported with ``compile.export_library``: one export rule for artifacts and candidates.

TVM's private names these need (MetaSchedule's worker functions) come from ``farm.tvm_private``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, PyRunner, RPCConfig, RPCRunner
from tvm.support.popen_pool import PopenPoolExecutor

from farm.compile import export_library
from farm.errors import BuildError, DeviceUnavailable, message_line
from farm.records import Device, candidate_timing, cpu_arch, ModelSource, TrackerAddress
from farm.rpc.session import request_session
from farm.rpc.tracker import query_summary
from farm.tune.config import BUSY_RETRIES, TuneConfig
from farm.tvm_private import (artifact_path, build_in_worker, import_tensor_intrinsics, measure_in_worker, outer_object,
                               pseudo_files_have_no_module, runner_args, runner_future, stop_runner_pool, unchecked)

log = logging.getLogger(__name__)

NOT_BUILT = "not built: the session's minutes were spent"  # a build cut off at the session's deadline
BUILD_FAILED = ".build-error"  # beside a candidate's planned library: why its build failed

# MetaSchedule's logs (per-batch tables, builder and runner errors) are kept for this many latest sessions
KEPT_SESSION_LOGS = 20
# A build worker's builds before it restarts (MetaSchedule's LocalBuilder: every batch, for a known leak; a new
# worker imports TVM again, seconds of this host's CPU: at one candidate a batch, every candidate)
BUILDS_PER_WORKER = 64


def build_candidate(mod, target, _params):
    """MetaSchedule's default build without importing tensor intrinsics (15-30 s per worker). A candidate whose
    weights ``RewriteLayout`` packed (weight prepacking) is built without its repacking block, as MetaSchedule's
    own builder does: the runner gives it weights already in the packed layout, and a tuned compile folds that
    repacking into the library (``compile.fold_weight_prepack``), so the device times what will run."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def export_candidate(toolchain: str, mod) -> str:
    """Export a candidate as a shared library the device can load (``compile.export_library``) in a new folder."""
    return export_to(toolchain, os.path.join(tempfile.mkdtemp(prefix="farm-cand-"), "candidate.so"), mod)


def export_to(toolchain: str, path: str, mod) -> str:
    """``export_candidate`` to a path chosen before the build: written whole (a temp name, then renamed), so a
    runner waiting for it never reads half a library."""
    part = f"{path}.part.so"
    export_library(mod, part, toolchain)
    os.replace(part, path)
    return path


def open_session(host: str, port: int, key: str, request_timeout_s: float, session_timeout_s: float, _config):
    """RPCRunner's session factory, with a bounded wait (TVM's blocks forever on a missing key).

    A key with no server at all fails at once: the device is gone, not busy."""
    tracker = TrackerAddress(host, port)
    for attempt in range(BUSY_RETRIES + 1):
        status = query_summary(tracker).keys.get(key)
        if status is None or status.servers == 0:
            raise DeviceUnavailable(f"no server registered under key {key!r}", "the device left the tracker")
        try:
            return request_session(tracker, key, request_timeout_s, session_timeout_s)
        except DeviceUnavailable:  # every server of the key busy: wait again rather than fail the candidate
            if attempt == BUSY_RETRIES:
                raise
    raise AssertionError("unreachable")


def _run_with_cooldown(cooldown_s: float, session, rt_mod, device, evaluator_config, repeated_args) -> list[float]:
    """MetaSchedule's RPC evaluator, then ``cooldown_s`` of rest with the session held: the device is busy for
    it, as a phone that must cool between candidates is (RPCRunner's own ``cooldown_sec`` is unused in 0.27)."""
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_run_evaluator

    costs = default_run_evaluator(session, rt_mod, device, evaluator_config, repeated_args)
    time.sleep(cooldown_s)
    return costs


def _warm_worker() -> None:
    """Nothing: run in a new pool worker, unpickling it imports this module, TVM and MetaSchedule (seconds), so
    the first candidate's build or measurement does not wait for that while the devices idle."""


def warm_pool(pool: PopenPoolExecutor, workers: int) -> None:
    """Start ``workers`` of ``pool``'s processes now, each importing what candidates need (not waited for)."""
    for _ in range(workers):
        pool.submit(_warm_worker)


class BuildPool:
    """Both builders' workers: started and warmed at once (``warm_pool``), each restarted after
    ``BUILDS_PER_WORKER`` builds (MetaSchedule's ``LocalBuilder`` starts new ones every batch, for a known leak, each
    importing TVM again), and one wording for a build that failed."""

    def __init__(self, timeout_s: float, workers: int) -> None:
        self.timeout_s, self.workers = timeout_s, workers
        self.pool = self._new_pool()
        self.folders: set[str] = set()  # the candidates' folders (MetaSchedule removes each measured one's)
        warm_pool(self.pool, workers)

    def _new_pool(self) -> PopenPoolExecutor:
        return PopenPoolExecutor(max_workers=self.workers, timeout=self.timeout_s,
                                 maximum_process_uses=BUILDS_PER_WORKER)

    def submit(self, build_input, export: Callable):
        """``build_input``'s candidate built (``build_candidate``) and exported by ``export(mod)``: its future."""
        return self.pool.submit(build_in_worker, build_candidate, export, build_input.mod, build_input.target, None)

    def failure(self, future, deadline: float | None = None) -> str | None:
        """Why ``future``'s build failed (waiting for it, at most until ``deadline``, a ``time.monotonic()``: then
        ``NOT_BUILT``), None when it did not."""
        try:
            future.result(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return f"build timed out after {self.timeout_s:g} s" if future.done() else NOT_BUILT
        except Exception as exc:  # the build's own error, from its worker process
            return f"build failed: {message_line(exc)}"
        return None

    def restart(self) -> None:
        """Stop the workers, builds in progress included, and start new ones (not warmed: the session is ending)."""
        self.pool.shutdown(wait=False)
        self.pool = self._new_pool()

    def shutdown(self) -> None:
        """Stop the workers and remove the candidates' folders still there: those built and never measured (a
        session's last batch when its minutes ran out), which MetaSchedule's ``RemoveBuildArtifact`` never saw
        and which piled up in the temp folder."""
        self.pool.shutdown(wait=False)
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)


@derived_object
class AheadBuilder(PyBuilder):
    """Builds a batch in the background and answers at once with each candidate's planned library path, so
    MetaSchedule hands the batch to the runner while it builds: a device starts on the first candidate as soon
    as it is built instead of after the whole batch (``AfterBuildRunner`` waits for each library). A failed
    build reaches the runner as ``<path>.build-error``; its candidate is stored failed, as a builder error is."""

    def __init__(self, toolchain: str, timeout_s: float, workers: int) -> None:
        super().__init__()
        self.toolchain = toolchain
        self.builds = BuildPool(timeout_s, workers)

    def build(self, build_inputs: list) -> list:
        results = []
        for build_input in build_inputs:
            path = os.path.join(tempfile.mkdtemp(prefix="farm-cand-"), "candidate.so")
            self.builds.folders.add(os.path.dirname(path))
            future = self.builds.submit(build_input, functools.partial(export_to, self.toolchain, path))
            future.add_done_callback(functools.partial(_note_build_failure, path, self.builds))
            results.append(BuilderResult(path, None))
        return results

    def shutdown(self) -> None:
        self.builds.shutdown()


@derived_object
class PooledBuilder(PyBuilder):
    """MetaSchedule's ``LocalBuilder`` (a batch built, then answered), but one pool of workers for the session,
    restarted after ``BUILDS_PER_WORKER`` builds instead of every batch (seconds a batch, on the CPU the device
    measures on). Builds not done at the session's ``deadline`` (``time.monotonic()``) fail as ``NOT_BUILT`` and
    their workers are stopped: a batch whose candidates each take a minute or two to compile (squeezenet's first
    conv, seen here: 12 minutes for 16) must not run a session given minutes that far past them."""

    def __init__(self, toolchain: str, timeout_s: float, workers: int, deadline: float | None = None) -> None:
        super().__init__()
        self.export = functools.partial(export_candidate, toolchain)
        self.builds = BuildPool(timeout_s, workers)
        self.deadline = deadline

    def build(self, build_inputs: list) -> list:
        futures = [self.builds.submit(build_input, self.export) for build_input in build_inputs]
        results = []
        for future in futures:
            why = self.builds.failure(future, self.deadline)
            path = None if why else future.result()
            results.append(BuilderResult(path, why))
            if path:
                self.builds.folders.add(os.path.dirname(path))
        if any(result.error_msg == NOT_BUILT for result in results):
            self.builds.restart()
        return results

    def shutdown(self) -> None:
        self.builds.shutdown()


def _note_build_failure(path: str, builds: BuildPool, future) -> None:
    why = builds.failure(future)
    if why is None:
        return
    with contextlib.suppress(OSError):  # the candidate's folder is gone when its run already ended
        Path(path + BUILD_FAILED).write_text(why)


def measure_when_built(build_wait_s: float, busy_log: str, *args):
    """RPCRunner's worker, once the candidate's library exists (``AheadBuilder``); the device's session is
    asked for only then, so a server is not held while its candidate builds. The time from asking for the
    session to releasing it (upload, load, runs, cooldown, clean-up) is appended to ``busy_log``."""
    library = artifact_path(args)
    deadline = time.monotonic() + build_wait_s
    while not os.path.exists(library):
        failed = Path(library + BUILD_FAILED)
        if failed.exists():
            raise RuntimeError(failed.read_text())
        if time.monotonic() > deadline:
            raise RuntimeError(f"no library after {build_wait_s:g} s of building")
        time.sleep(0.05)
    started = time.monotonic()
    try:
        return measure_in_worker(*args)
    finally:
        with open(busy_log, "a", encoding="utf-8") as out:  # one short append per candidate: atomic
            out.write(f"{time.monotonic() - started:.6f}\n")


@derived_object
class AfterBuildRunner(PyRunner):
    """MetaSchedule's RPC runner (its worker, session factory, evaluator and clean-up), with ``max_workers``
    candidates measured at once, each starting when its library is built."""

    def __init__(self, rpc: RPCRunner, workers: int, build_wait_s: float, timeout_s: float) -> None:
        super().__init__()
        self.rpc = rpc
        self.build_wait_s = build_wait_s
        self.timeout_s = timeout_s
        self.pool = PopenPoolExecutor(max_workers=workers, timeout=timeout_s + build_wait_s)
        warm_pool(self.pool, workers)
        handle, self.busy_log = tempfile.mkstemp(prefix="farm-busy-", suffix=".txt")
        os.close(handle)

    def busy_seconds(self) -> list[float]:
        """Each candidate's time on its device so far (session asked for → released): summed and divided by
        K × the search's time, the share of it the devices were busy."""
        try:
            text = Path(self.busy_log).read_text()
        except OSError:
            return []
        return [float(word) for word in text.split() if word.replace(".", "", 1).isdigit()]

    def run(self, runner_inputs: list) -> list:
        return [runner_future(self.pool.submit(measure_when_built, self.build_wait_s, self.busy_log,
                                               *runner_args(self.rpc, runner_input)), self.timeout_s)
                for runner_input in runner_inputs]

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False)
        with contextlib.suppress(OSError):
            os.unlink(self.busy_log)


def make_runner(tracker: TrackerAddress, device: Device, config: TuneConfig, runners: int,
                ahead: bool, cold: bool) -> AfterBuildRunner:
    """The session's runner: ``runners`` candidates measured at once on the servers of ``device``'s key, each
    waiting for its library (up to the builder's timeout when builds run ahead); ``cold`` (``records.cold_weights``):
    timed with weights flushed from the caches before each run."""
    rpc = unchecked(RPCRunner)(
        RPCConfig(tracker.host, tracker.port, device.key, session_timeout_sec=int(config.runner_timeout_s)),
        evaluator_config(cold),
        f_create_session=functools.partial(open_session, tracker.host, tracker.port, device.key,
                                           config.request_timeout_s, config.runner_timeout_s),
        f_run_evaluator=functools.partial(_run_with_cooldown, config.candidate_cooldown_s)
        if config.candidate_cooldown_s else None,
    )
    stop_runner_pool(rpc)  # AfterBuildRunner measures with RPCRunner's functions in its own pool
    return AfterBuildRunner(rpc, runners, config.builder_timeout_s if ahead else 1.0,
                            config.runner_timeout_s + (BUSY_RETRIES + 1) * config.request_timeout_s)


def evaluator_config(cold: bool) -> EvaluatorConfig:
    """How the runner times a candidate (``records.COLD_WEIGHTS_RULE``): ``records.COLD_TIMING`` when ``cold``, else
    ``WARM_TIMING`` (MetaSchedule's cache flush is TVM's ``cache_flush_cpu_non_first_arg``, COLD_TIMING's)."""
    timing = candidate_timing(cold)
    return EvaluatorConfig(number=timing.number, repeat=timing.repeat, min_repeat_ms=timing.min_repeat_ms,
                           enable_cpu_cache_flush=timing.flushed)


def make_builder(toolchain: str, config: TuneConfig, ahead: bool, deadline: float | None = None):
    """The session's builder: ``AheadBuilder`` when builds run ahead of the measurements, else ``PooledBuilder``
    (whose builds stop at the session's ``deadline``, a ``time.monotonic()``)."""
    if ahead:
        return AheadBuilder(toolchain, config.builder_timeout_s, os.cpu_count() or 1)
    return PooledBuilder(toolchain, config.builder_timeout_s, os.cpu_count() or 1, deadline)


@derived_object
class PassScheduler(ms.task_scheduler.PyTaskScheduler):
    """MetaSchedule's round robin over one pass's tasks, each up to its quota of trials. MetaSchedule generates a
    task's next batch only once its last batch is measured; taking turns, the next task's batch is generated (and
    built ahead) while the devices measure this one's, instead of the devices waiting for each generation.

    At most two batches are in flight (the one measured, the one queued behind it), so a stop waits for no more
    than that: once ``stopped()`` (a time budget, an interrupt, a lost device) no task gets a new batch and
    MetaSchedule joins the batches in flight (their records kept). A task gets a batch only while a whole one
    fits its quota (all tasks share one per-task cap in MetaSchedule, the largest quota, and a search may return
    a short batch), so none exceeds it; ``ended`` holds the tasks this ended, the rest ended by MetaSchedule
    (no new candidate). ``measured(i)``: the trials task ``i`` of this call has measured so far."""

    def __init__(self, quotas: list[int], batch: int, measured: Callable[[int], int],
                 stopped: Callable[[], bool]) -> None:
        super().__init__()
        self.quotas = quotas
        self.batch = batch
        self.measured = measured
        self.stopped = stopped
        self.turn = -1
        self.in_flight: list[int] = []  # tasks whose batch was handed out and not yet joined, oldest first
        self.ended: set[int] = set()

    def next_task_id(self) -> int:
        scheduler = outer_object(self)
        for i in range(len(self.quotas)):
            scheduler.touch_task(i)  # joins a task whose batch is all measured, without waiting
        self.in_flight = [i for i in self.in_flight if scheduler.tasks_[i].runner_futures is not None]
        while len(self.in_flight) > 1 and not self.stopped():
            self.join_running_task(self.in_flight.pop(0))  # the devices measure the other one meanwhile
        if self.stopped():
            return -1  # MetaSchedule then joins the batches in flight
        for _ in range(2 * len(self.quotas)):  # twice round: a task in flight is waited for once it is the last
            self.turn = (self.turn + 1) % len(self.quotas)
            task = scheduler.tasks_[self.turn]
            live = sum(1 for other in scheduler.tasks_ if not other.is_terminated)
            if task.is_terminated or (self.turn in self.in_flight and live > 1):
                continue
            if task.runner_futures is not None:  # the last task left: wait for its batch
                self.join_running_task(self.turn)
                self.in_flight.remove(self.turn)
                if self.stopped():
                    return -1
            if self.quotas[self.turn] - self.measured(self.turn) < min(self.batch, self.quotas[self.turn]):
                self.ended.add(self.turn)
                scheduler.terminate_task(self.turn)
                continue
            self.in_flight.append(self.turn)
            return self.turn
        return -1


def extract_tasks(mod, target, model: ModelSource) -> list:
    """MetaSchedule's tuning tasks of ``mod``; TVM's errors become a BuildError naming the model (cause kept: -v)."""
    try:
        return list(ms.relax_integration.extract_tasks(mod, target))
    except Exception as exc:  # tvm.error.TVMError and the FFI's own: TVM raises many types here
        log.info("extracting tuning tasks of %s failed", model.name, exc_info=True)
        raise BuildError(f"cannot extract tuning tasks from {model.name}: {message_line(exc)}",
                         "check that farm compile works for this model and device; -v shows TVM's trace") from exc


def session_log_dir(work_root: Path, device: Device, session_id: int) -> Path:
    """WORK_ROOT/sessions/KEY-SESSION-TIME: MetaSchedule's log folder for one session, kept after it (the last
    ``KEPT_SESSION_LOGS`` sessions) so a slow or failing search can be read afterwards."""
    root = work_root / "sessions"
    root.mkdir(parents=True, exist_ok=True)
    # named KEY-SESSION-TIME (stores sharing one FARM_HOME number their sessions alike), pruned by name's time
    folders = sorted(root.iterdir(), key=lambda p: p.name.rsplit("-", 1)[-1])
    for old in folders[:max(0, len(folders) - KEPT_SESSION_LOGS + 1)]:
        shutil.rmtree(old, ignore_errors=True)
    folder = root / f"{device.key}-{session_id}-{time.strftime('%Y%m%dT%H%M%S')}"
    folder.mkdir(exist_ok=True)
    return folder


def logs_to_file_only() -> None:
    """MetaSchedule's per-batch tables and XGBoost's lines go to its log files (WORK_DIR/logs), not to stdout.

    Each ``tune_tasks`` call sets its console handler's level from the package logger's level, then sets that
    logger to DEBUG (for its files): so before every call the package logger goes back to WARNING."""
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)


def load_tensor_intrinsics(target: dict) -> None:
    """Register the tensor intrinsics a tune context for ``target`` needs (``tvm_private.import_tensor_intrinsics``:
    an LLVM CPU's architecture's only, in about half a second; a GPU's, all of them) in seconds instead of ~40 s.

    Defining their TVMScript functions is slow under ``inspect.stack()``: ``tvm_private.pseudo_files_have_no_module``
    says why, and makes it fast."""
    arch = cpu_arch(target) if target.get("kind") == "llvm" else None
    with pseudo_files_have_no_module():
        import_tensor_intrinsics(arch)
