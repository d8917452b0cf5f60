"""The steps of a bench run, each a function over the run (``Run``) that fills its draft (``RunDraft``), in the
order of ``STEPS``; ``bench_artifact`` runs them, then cleanup, and builds the BenchResult from the draft. The
table of steps is the package's docstring (farm/measure/__init__.py)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import tvm

from farm.devices.cuda import runtime_refusal
from farm.errors import FarmError
from farm.measure.check import check_outputs
from farm.measure.context import DEVICE_TYPE, STEADY_CLOCK, measurement_context, server_helpers, session_threads
from farm.measure.copies import time_copy
from farm.measure.draft import RunDraft
from farm.records import StepProgress
from farm.measure.failures import StepFailed, device_hint, failure_reason, raised_in_farm
from farm.measure.manifest import session_part
from farm.measure.memory import Memory
from farm.measure.profile import ONE_COUNTED_RUN, profile_loaded, profile_runs, skipped
from farm.measure.vm import SteadyTimer, calibrate_number, first_run, load_vm, remove_quietly, unpack, wall_timer
from farm.records import Artifact, BenchConfig, BenchResult, CheckResult, Device, TrackerAddress, target_kind, utc_now
from farm.rpc.session import request_session

log = logging.getLogger(__name__)


@dataclass
class Run:
    """One bench run: what it measures, its draft, and what each step hands on to the next."""

    tracker: TrackerAddress
    device: Device
    artifact: Artifact
    inputs: dict[str, np.ndarray]
    reference: list[np.ndarray] | None
    config: BenchConfig
    reference_name: str
    say: StepProgress
    draft: RunDraft
    remote_name: str  # the artifact's name in the session's folder
    session: Any = None  # 1 session: TVM's RPCSession (None until a server is granted)
    device_type: str = ""  # 3 load: "cpu" or the GPU kind (DEVICE_TYPE)
    helpers: dict[str, Any] = field(default_factory=dict)  # 3 load: farm's functions on the server (server_helpers)
    memory: Memory | None = None  # 3 load: the session process's memory
    dev: Any = None  # 3 load: the session's device
    vm: Any = None  # 3 load, 5 warm: the loaded Relax VM
    args: list = field(default_factory=list)  # 4 first: the inputs, on the device
    outputs: list = field(default_factory=list)  # 4 first: the first run's outputs (copied in 7, checked in 8)
    warm_result: Any = None  # 5 warm: its run's outputs, held to the end of the run (the steady peak counts them)
    started: float = field(default_factory=time.perf_counter)  # the cell's start (its device time: the profile's share)

    def read_memory(self, reset_peak: bool = False, peak: bool = False) -> int | None:
        """A reading of the session process's memory (``Memory.read``); None before the load or without one."""
        return self.memory.read(reset_peak, peak) if self.memory is not None else None


DRIVER_STEP = "driver"  # a device whose driver cannot run TVM's runtime as shipped (devices.cuda.runtime_refusal)


def open_session(run: Run) -> None:
    """1 session: a server for the device's key, within the config's timeout."""
    device = run.device
    if (refused := runtime_refusal(device)) is not None:  # before the upload: nothing it could load would run
        raise StepFailed(DRIVER_STEP, *refused)  # final (not a retryable step): measuring again cannot help
    run.say("session", f"requesting {device.key!r}")
    try:
        run.session = request_session(run.tracker, device.key, run.config.timeout_s, device.session_timeout_s)
    except FarmError as exc:
        raise StepFailed("session", exc.message, exc.hint) from exc
    run.started = time.perf_counter()  # the cell's device time (the profile's share) from here, not the wait


def upload(run: Run) -> None:
    """2 upload: the artifact into the session's folder (timed)."""
    run.say("upload", run.artifact.path)
    t0 = time.perf_counter()
    run.session.upload(run.artifact.path, run.remote_name)
    run.draft.upload_s = time.perf_counter() - t0


def load(run: Run) -> None:
    """3 load: the session's threads and helpers, the kernel cache cleared, then the VM loaded (timed), with the
    session process's memory before and after."""
    draft, context, session = run.draft, run.draft.context, run.session
    run.say("load", run.remote_name)
    run.device_type = device_type = DEVICE_TYPE[target_kind(run.artifact.target)]
    run.helpers = helpers = server_helpers(session)
    context["kernel_cache"] = "cpu code" if device_type == "cpu" else \
        f"cleared ({helpers['farm.ClearKernelCache']()})" if "farm.ClearKernelCache" in helpers else "not controlled"
    draft.steady_clock = STEADY_CLOCK.get(device_type, "device")
    threads = session_threads(session, helpers, run.device)
    draft.threads, context["threads_by"] = threads.count, threads.set_by
    run.memory = Memory(helpers.get("farm.MemoryStats"), draft, run.device.emulated)
    draft.rss_before_load_bytes = run.read_memory(reset_peak=True)
    t0 = time.perf_counter()
    run.dev = session.device(device_type, 0)
    run.vm = load_vm(session, run.remote_name, run.dev)
    draft.load_s = time.perf_counter() - t0
    draft.rss_after_load_bytes = run.read_memory()
    # after the timed load: asking the GPU's driver its version creates its context, which the load pays for
    context["manifest"].update(session_part(helpers, run.dev, device_type))


def first(run: Run) -> None:
    """4 first: the cold first run (kernels built), host wall clock around the call and a device sync."""
    run.say("first", "first run (cold)")
    run.args = [tvm.runtime.tensor(value, run.dev) for value in run.inputs.values()]
    run.draft.first_run_s, result = first_run(run.vm, run.dev, run.args)
    run.outputs = unpack(run.session, result)
    run.read_memory(reset_peak=True, peak=True)  # the peak of load and first run; the warm load holds two copies


def warm(run: Run) -> None:
    """5 warm: a second load of the same artifact and its first run (kernels from the driver's cache)."""
    run.say("warm", "second load, first run (warm)")
    run.vm = None  # the first copy is freed before the second load: the steady peak holds one copy
    run.read_memory(reset_peak=True)
    t0 = time.perf_counter()
    run.vm = load_vm(run.session, run.remote_name, run.dev)
    run.draft.load_warm_s = time.perf_counter() - t0
    run.draft.first_run_warm_s, run.warm_result = first_run(run.vm, run.dev, run.args)
    run.read_memory(reset_peak=True)  # the warm load's own peak (its load) is left out of the steady peak


def steady(run: Run) -> None:
    """6 steady: ``time_evaluator`` on the device, every repeat kept raw; on GPUs where the server offers it, also
    per-call wall time on the device (call + sync)."""
    draft, config = run.draft, run.config
    timer = SteadyTimer(run.vm, run.dev, run.args)
    number = timer.number(config)
    run.say("steady", f"{config.repeat} repeats × {number} calls ({draft.steady_clock} time)")
    draft.steady_number = number
    draft.steady_samples_s = timer(number, config.repeat)
    if run.device_type != "cpu" and "farm.WallTimeEvaluator" in run.helpers:
        wall = wall_timer(run.helpers["farm.WallTimeEvaluator"], run.vm, run.dev)
        number = config.number or calibrate_number(wall, config.min_repeat_ms)
        run.say("steady", f"{config.repeat} repeats × {number} calls (wall time: call + sync)")
        draft.steady_wall_number = number
        draft.steady_wall_samples_s = tuple(float(v) for v in wall(number, config.repeat))
    run.read_memory(peak=True)


def copy(run: Run) -> None:
    """7 copy: device→host copy of each output, timed on the device apart from compute."""
    run.say("copy", f"{len(run.outputs)} output(s)")
    run.draft.copies = tuple(time_copy(run.session, i, out, run.config) for i, out in enumerate(run.outputs))


def check(run: Run) -> None:
    """8 check: the outputs against the reference, with tolerance; outputs that differ fail the run."""
    run.draft.check = checked = check_outputs(run.outputs, run.reference, run.config, run.reference_name)
    run.say("check", checked.status)
    if checked.status == "failed":
        raise StepFailed("check", f"outputs differ from {run.reference_name}: {checked.detail}",
                         "the compiled model computes something else than the reference; "
                         "the check is stored with its max error")


def profile(run: Run) -> None:
    """9 profile (``config.profile``): where the time goes, each kernel timed on the device by the server's helper in
    runs of its own, after the timed ones (``measure.profile``); never fails the run."""
    if not run.config.profile:
        return
    steady_s, cell_s = run.draft.steady_wall_samples_s or run.draft.steady_samples_s, time.perf_counter() - run.started
    run.draft.context["cell_s_before_profile"] = cell_s  # the device time the profile's share is of
    share = run.config.profile_share  # a sweep's default profile: within its share; one asked for: as asked
    if share and (too_slow := skipped(steady_s, cell_s)) is not None:
        run.draft.profile = too_slow
        run.say("profile", too_slow.reason)
        return
    runs = profile_runs(steady_s, cell_s if share else None)
    if runs == ONE_COUNTED_RUN and "farm.ServerBuild" not in run.helpers:  # a server before #63: no counted first run
        runs = 1
    run.say("profile", f"{runs} runs after one not counted, each kernel timed on the device" if runs else
            "the first run, counted (a slow model: its profile within its share of the cell)")
    started = time.perf_counter()
    run.draft.profile = profile_loaded(run.session, run.helpers, run.remote_name, run.dev, run.args, run.artifact,
                                       runs)
    run.draft.context["profile_s"] = time.perf_counter() - started  # the step's cost, load included
    if run.draft.profile.status != "ok":
        run.say("profile", f"not available: {run.draft.profile.reason}")


def cleanup(run: Run) -> None:
    """cleanup (always): remove the uploaded file; the session is dropped with the run."""
    if run.session is not None:
        run.say("cleanup", run.remote_name)
        remove_quietly(run.session, run.remote_name)


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[Run], None]


STEPS = (Step("session", open_session), Step("upload", upload), Step("load", load), Step("first", first),
         Step("warm", warm), Step("steady", steady), Step("copy", copy), Step("check", check),
         Step("profile", profile))


def bench_artifact(
    tracker: TrackerAddress,
    device: Device,
    artifact: Artifact,
    inputs: dict[str, np.ndarray],
    reference: list[np.ndarray] | None,
    config: BenchConfig,
    reference_name: str = "onnxruntime",
    progress: StepProgress | None = None,
) -> BenchResult:
    """Run every step on ``device``; always returns a BenchResult (status ok or failed)."""
    started_at = utc_now()
    run = Run(tracker, device, artifact, inputs, reference, config, reference_name,
              say=progress or (lambda step, detail: None), draft=RunDraft(measurement_context(device, artifact)),
              remote_name=os.path.basename(artifact.path))
    step = STEPS[0].name
    try:
        for each in STEPS:
            step = each.name
            each.run(run)
    except StepFailed as exc:
        return _result(run, started_at, "failed", exc.step, exc.reason, exc.hint)
    except Exception as exc:  # TVM raises RuntimeError/TVMError/OSError for device-side failures
        return _failed(run, started_at, step, exc)
    finally:
        cleanup(run)
    return _result(run, started_at, "ok")


def _failed(run: Run, started_at: str, step: str, exc: Exception) -> BenchResult:
    """A step that raised: farm's own bug is stored as failed at step "farm", never quiet; else the device's
    failure at ``step``, with its reason and a hint."""
    device, artifact = run.device, run.artifact
    reason = failure_reason(exc)
    if not isinstance(exc, FarmError) and raised_in_farm(exc):
        log.exception("%s × %s: farm failed at step %s", device.name, artifact.model_name, step)
        return _result(run, started_at, "failed", "farm", f"farm bug at step {step}: {type(exc).__name__}: {reason}",
                       "the traceback is in the log above; report it")
    log.info("%s × %s failed at step %s", device.name, artifact.model_name, step, exc_info=True)  # -v shows it
    return _result(run, started_at, "failed", step, reason, device_hint(exc, reason))


def _result(run: Run, started_at: str, status: str, step: str = "", reason: str = "", hint: str = "") -> BenchResult:
    """The BenchResult: the run's identity, and the draft's fields by keyword (mypy checks each)."""
    device, artifact, draft = run.device, run.artifact, run.draft
    checked = draft.check if draft.check is not None else CheckResult("skipped", detail=f"not reached: failed at {step}")
    return BenchResult(
        device=device.name, key=device.key, model=artifact.model_name, model_digest=artifact.model_digest,
        status=status, reason=reason, failed_step=step, hint=hint, artifact_key=artifact.cache_key,
        config=run.config, context=draft.context, started_at=started_at, params_bytes=artifact.params_bytes,
        planned_host_bytes=artifact.planned_host_bytes, planned_device_bytes=artifact.planned_device_bytes,
        upload_s=draft.upload_s, steady_clock=draft.steady_clock, threads=draft.threads, load_s=draft.load_s,
        rss_before_load_bytes=draft.rss_before_load_bytes, rss_after_load_bytes=draft.rss_after_load_bytes,
        first_run_s=draft.first_run_s, load_warm_s=draft.load_warm_s, first_run_warm_s=draft.first_run_warm_s,
        steady_number=draft.steady_number, steady_samples_s=draft.steady_samples_s,
        steady_wall_number=draft.steady_wall_number, steady_wall_samples_s=draft.steady_wall_samples_s,
        rss_peak_bytes=draft.rss_peak_bytes, copies=draft.copies, check=checked, profile=draft.profile,
    )
