"""Measure one artifact on one device over RPC, in numbered steps.

    1 session   request a server for the device's key (bounded wait)
    2 upload    push the artifact (timed)
    3 load      read the session's CPU threads (``runtime.NumThreads``, as farm's server set them: ``session_threads``),
                then load the module and create the Relax VM (timed); the driver's kernel cache is
                cleared first where the server offers it (farm's GPU server), so this is a cold start.
                Where the server offers ``farm.MemoryStats`` (farm's servers), the session process's RSS
                before and after the load, and its peak over load, first run and steady runs (``_Memory``)
    4 first     cold first run, host wall clock around call + device sync (timed: GPU kernels built)
    4 warm      a second load of the same artifact and its first run (kernels from the driver's cache)
    5 steady    ``time_evaluator`` on the device: warm-up discarded, every repeat kept raw. On OpenCL
                that is the sum of kernel event times (``steady_clock = "kernel"``), so GPUs also get
                per-call wall time on the device (call + sync) where the server offers it
    6 copy      device→host copy of each output, timed on the device apart from compute
    7 check     outputs against the reference, with tolerance
    cleanup     remove the uploaded file and drop the session (always)

A failing step ends the run as a failed result carrying the step and the reason;
what was measured before it is kept. Nothing here raises for a device failure.
"""

from __future__ import annotations

import json
import logging
import math
import os
import struct
import time
from datetime import datetime, timezone
from typing import Any, Callable

import numpy as np
import tvm
from tvm import relax

import farm
from farm.devices import kind_of
from farm.errors import FarmError, message_line
from farm.records import (Artifact, BenchConfig, BenchResult, CheckResult, CopyCurve, CopyPoint, CopyTiming,
                           Device, TrackerAddress)
from farm.records import CPU_TARGETS, TARGET_KINDS, target_kind
from farm.rpc.session import request_session
from farm.stats import nonempty_median

log = logging.getLogger(__name__)

Progress = Callable[[str, str], None]
DEVICE_TYPE = {target: "cpu" if target in CPU_TARGETS else target for target in TARGET_KINDS}  # a GPU kind's type: its name
# What TVM's time_evaluator measures per device type: OpenCL sums kernel events (no launch overhead, no gaps)
STEADY_CLOCK = {"cpu": "wall", "opencl": "kernel"}
# Device types whose TVM timer sees only kernels: copies (blocking: clFinish) are timed with the CPU's clock
KERNEL_ONLY_TIMERS = ("opencl",)
CPU_DEVICE_TYPE = 1
SERVER_HELPERS = ("farm.WallTimeEvaluator", "farm.ClearKernelCache", "farm.MemoryStats",
                  "farm.ThreadsSet")  # farm's servers have them
THREADS_BY_FARM = "farm's server (TVM_NUM_THREADS)"
THREADS_NOT_SET = "threads not set by farm: the server's own default (a stock TVM server)"
MEMORY_MEASURED = "RSS of the process serving the session (VmRSS, VmHWM); GPU driver allocations are not in it"
MEMORY_EMULATED = "RSS of qemu's process (its translator and code cache too): emulated, never compare with hardware"
MEMORY_UNMEASURED = "not measured: the device's server has no farm.MemoryStats (a stock TVM server, iOS)"
MAX_NUMBER = 100_000
COPY_CURVE_BYTES = tuple(4096 * 4**i for i in range(8))  # 4 KiB … 64 MiB


class StepFailed(Exception):
    def __init__(self, step: str, reason: str, hint: str = "") -> None:
        super().__init__(reason)
        self.step, self.reason, self.hint = step, reason, hint


def bench_artifact(
    tracker: TrackerAddress,
    device: Device,
    artifact: Artifact,
    inputs: dict[str, np.ndarray],
    reference: list[np.ndarray] | None,
    config: BenchConfig,
    reference_name: str = "onnxruntime",
    progress: Progress | None = None,
) -> BenchResult:
    """Run every step on ``device``; always returns a BenchResult (status ok or failed)."""
    say = progress or (lambda step, detail: None)
    fields: dict[str, Any] = {}
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    context = measurement_context(device, artifact)
    session = None
    remote_name = os.path.basename(artifact.path)
    step = "session"
    try:
        say("session", f"requesting {device.key!r}")
        try:
            session = request_session(tracker, device.key, config.timeout_s, device.session_timeout_s)
        except FarmError as exc:
            raise StepFailed("session", exc.message, exc.hint) from exc
        step = "upload"
        say(step, artifact.path)
        t0 = time.perf_counter()
        session.upload(artifact.path, remote_name)
        fields["upload_s"] = time.perf_counter() - t0

        step = "load"
        say(step, remote_name)
        device_type = DEVICE_TYPE[target_kind(artifact.target)]
        helpers = _server_helpers(session)
        context["kernel_cache"] = "cpu code" if device_type == "cpu" else \
            f"cleared ({helpers['farm.ClearKernelCache']()})" if "farm.ClearKernelCache" in helpers else "not controlled"
        fields["steady_clock"] = STEADY_CLOCK.get(device_type, "device")
        fields["threads"], context["threads_by"] = session_threads(session, helpers)
        memory = _Memory(helpers.get("farm.MemoryStats"), fields, context, device.emulated)
        memory.read("rss_before_load_bytes", reset_peak=True)
        t0 = time.perf_counter()
        lib = session.load_module(remote_name)
        dev = session.device(device_type, 0)
        vm = relax.VirtualMachine(lib, dev)
        fields["load_s"] = time.perf_counter() - t0
        memory.read("rss_after_load_bytes")

        step = "first"
        say(step, "first run (cold)")
        args = [tvm.runtime.tensor(value, dev) for value in inputs.values()]
        fields["first_run_s"], result = _first_run(vm, dev, args)
        outputs = _unpack(session, result)
        memory.read(reset_peak=True, peak=True)  # the peak of load and first run; the warm load holds two copies

        step = "warm"
        say(step, "second load, first run (warm)")
        lib = vm = None  # the first copy is freed before the second load: the steady peak holds one copy
        memory.read(reset_peak=True)
        t0 = time.perf_counter()
        vm = relax.VirtualMachine(session.load_module(remote_name), dev)
        fields["load_warm_s"] = time.perf_counter() - t0
        fields["first_run_warm_s"], _ = _first_run(vm, dev, args)
        memory.read(reset_peak=True)  # the warm load's own peak (its load) is left out of the steady peak

        step = "steady"
        vm.set_input("main", *args)
        number = config.number or calibrate_number(
            lambda n, r: vm.time_evaluator("invoke_stateful", dev, number=n, repeat=r)("main").results,
            config.min_repeat_ms)
        say(step, f"{config.repeat} repeats × {number} calls ({fields['steady_clock']} time)")
        timer = vm.time_evaluator("invoke_stateful", dev, number=number, repeat=config.repeat)
        fields["steady_number"] = number
        fields["steady_samples_s"] = tuple(float(v) for v in timer("main").results)
        if device_type != "cpu" and "farm.WallTimeEvaluator" in helpers:
            wall = _wall_timer(helpers["farm.WallTimeEvaluator"], vm, dev)
            number = config.number or calibrate_number(wall, config.min_repeat_ms)
            say(step, f"{config.repeat} repeats × {number} calls (wall time: call + sync)")
            fields["steady_wall_number"] = number
            fields["steady_wall_samples_s"] = tuple(float(v) for v in wall(number, config.repeat))
        memory.read(peak=True)

        step = "copy"
        say(step, f"{len(outputs)} output(s)")
        fields["copies"] = tuple(_time_copy(session, i, out, config) for i, out in enumerate(outputs))

        step = "check"
        fields["check"] = check_outputs(outputs, reference, config, reference_name)
        say(step, fields["check"].status)
        if fields["check"].status == "failed":
            raise StepFailed("check", f"outputs differ from {reference_name}: {fields['check'].detail}",
                             "the compiled model computes something else than the reference; "
                             "the check is stored with its max error")
    except StepFailed as exc:
        return _result(device, artifact, config, context, started_at, fields, "failed", exc.step, exc.reason, exc.hint)
    except Exception as exc:  # TVM raises RuntimeError/TVMError/OSError for device-side failures
        reason = failure_reason(exc)
        if not isinstance(exc, FarmError) and raised_in_farm(exc):  # farm's own bug: stored as failed, never quiet
            log.exception("%s × %s: farm failed at step %s", device.name, artifact.model_name, step)
            return _result(device, artifact, config, context, started_at, fields, "failed", "farm",
                           f"farm bug at step {step}: {type(exc).__name__}: {reason}",
                           "the traceback is in the log above; report it")
        log.info("%s × %s failed at step %s", device.name, artifact.model_name, step, exc_info=True)  # -v shows it
        hint = "the device dropped the session; check `farm devices`" if _is_connection_error(exc) else \
            _driver_hint(reason) or "see the device's server log; the failure is stored with its reason"
        return _result(device, artifact, config, context, started_at, fields, "failed", step, reason, hint)
    finally:
        if session is not None:
            say("cleanup", remote_name)
            try:
                session.remove(remote_name)
            except Exception:  # the session may be gone; nothing left to clean
                pass
    return _result(device, artifact, config, context, started_at, fields, "ok", "", "", "")


def _result(device, artifact, config, context, started_at, fields, status, step, reason, hint) -> BenchResult:
    if step and "check" not in fields:
        fields["check"] = CheckResult("skipped", detail=f"not reached: failed at {step}")
    return BenchResult(
        device=device.name, key=device.key, model=artifact.model_name, model_digest=artifact.model_digest,
        status=status, reason=reason, failed_step=step, hint=hint, artifact_key=artifact.cache_key,
        config=config, context=context, started_at=started_at, params_bytes=artifact.params_bytes,
        planned_host_bytes=artifact.planned_host_bytes, planned_device_bytes=artifact.planned_device_bytes, **fields,
    )


class _Memory:
    """The session process's memory through the server's ``farm.MemoryStats`` (JSON: rss_bytes, peak_bytes,
    total_bytes), into the run's fields and context; without it (a stock TVM server, iOS) nothing is read and
    the context says "not measured", never a guess. ``rss_peak_bytes`` is the highest peak (VmHWM) of the readings
    marked ``peak``, each covering the time since the reset before it."""

    def __init__(self, stats: Callable[[int], str] | None, fields: dict[str, Any], context: dict[str, Any],
                 emulated: bool) -> None:
        self.stats, self.fields, self.context, self.emulated = stats, fields, context, emulated
        self.peak_known = True  # False once a reset of the peak failed: the peak would then span earlier steps
        context["memory"] = MEMORY_UNMEASURED if stats is None else MEMORY_EMULATED if emulated else MEMORY_MEASURED

    def read(self, field: str = "", reset_peak: bool = False, peak: bool = False) -> None:
        """One reading. A server whose reading fails leaves memory "not measured" with the reason; the run goes on."""
        if self.stats is None:
            return
        try:
            reading = json.loads(self.stats(int(reset_peak)))
        except Exception as exc:  # RPC or JSON: memory is a side figure, never the run's failure
            self.stats = None
            self.context["memory"] = f"not measured: reading the server's memory failed ({message_line(exc, 200)})"
            for name in ("rss_before_load_bytes", "rss_after_load_bytes", "rss_peak_bytes"):
                self.fields.pop(name, None)
            return
        if not self.emulated:  # under qemu-user /proc/meminfo is this host's, not the device's: no guess
            self.context.setdefault("memory_total_bytes", reading.get("total_bytes"))  # the device's RAM: will it fit?
        if field:
            self.fields[field] = reading.get("rss_bytes")
        if reset_peak and reading.get("peak_reset") is False and self.peak_known:
            self.peak_known = False
            self.fields.pop("rss_peak_bytes", None)
            self.context["memory"] += "; peak not measured: the server could not reset it (no /proc/self/clear_refs)"
        if peak and self.peak_known and reading.get("peak_bytes") is not None:
            self.fields["rss_peak_bytes"] = max(reading["peak_bytes"], self.fields.get("rss_peak_bytes") or 0)


def session_threads(session, helpers: dict[str, Any]) -> tuple[int, str]:
    """The CPU threads TVM uses in this session, as the device reports them (``runtime.NumThreads``, never assumed),
    and who set them: farm's server (``farm.ThreadsSet``) or the server's own default."""
    threads = int(session.get_function("runtime.NumThreads")())
    if "farm.ThreadsSet" not in helpers:
        return threads, THREADS_NOT_SET
    return threads, THREADS_BY_FARM


def _server_helpers(session) -> dict[str, Any]:
    """farm's own server functions, where the device's server has them (farm.rpc.server)."""
    found = {}
    for name in SERVER_HELPERS:
        try:
            found[name] = session.get_function(name)
        except AttributeError:  # a stock TVM server: no such function
            pass
    return found


def _first_run(vm, dev, args) -> tuple[float, Any]:
    """Host wall clock around the first call and a device sync (one RPC round trip included)."""
    dev.sync()
    t0 = time.perf_counter()
    result = vm["main"](*args)
    dev.sync()
    return time.perf_counter() - t0, result


def _wall_timer(make_timer, vm, dev) -> Callable[[int, int], tuple[float, ...]]:
    """Per-call wall time on the device: each call followed by a sync, timed by the server's clock."""
    dev_type = _dev_type(dev)

    def run(number: int, repeat: int) -> tuple[float, ...]:
        blob = make_timer(vm.module, "invoke_stateful", dev_type, dev.index, number, repeat)("main")
        return struct.unpack("@" + "d" * repeat, bytes(blob))

    return run


def _unpack(session, result) -> list:
    """The VM returns one tensor or, for several outputs, a remote Array."""
    if isinstance(result, tvm.runtime.Tensor):
        return [result]
    size = session.get_function("ffi.ArraySize")(result)
    get_item = session.get_function("ffi.ArrayGetItem")
    return [get_item(result, i) for i in range(size)]


def calibrate_number(run: Callable[[int, int], tuple[float, ...]], min_repeat_ms: float) -> int:
    """Choose ``number`` so one repeat lasts at least ``min_repeat_ms`` (TVM's own growth is not reported)."""
    if min_repeat_ms <= 0:
        return 1
    number = 1
    while True:
        seconds = max(min(run(number, 1)), 1e-9)
        if seconds * number * 1000 >= min_repeat_ms or number >= MAX_NUMBER:
            return number
        number = min(MAX_NUMBER, max(number * 2, math.ceil(number * min_repeat_ms / (seconds * number * 1000) * 1.1)))


def _time_copy(session, index: int, output, config: BenchConfig) -> CopyTiming:
    shape = tuple(int(d) for d in output.shape)
    dtype = str(output.dtype)
    host = tvm.runtime.empty(shape, dtype, session.cpu(0))
    run = _copy_timer(session, output, host, output.device)
    number = calibrate_number(run, max(config.min_repeat_ms / 5, 1.0))
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return CopyTiming(index, nbytes, shape, dtype, number, tuple(float(v) for v in run(number, config.copy_repeat)))


def _copy_timer(session, source, dest, gpu) -> Callable[[int, int], tuple[float, ...]]:
    """Time ``runtime.TVMTensorCopyFromTo(source, dest)`` on the device, no network in the figure.

    The timer syncs ``gpu``, the device side of the copy; where TVM's timer for that device sees only
    kernel events (OpenCL), the CPU's clock times it instead: TVM's OpenCL copies block (clFinish)."""
    make_timer = session.get_function("runtime.RPCTimeEvaluator")
    dev_type = _dev_type(gpu)
    if gpu._DEVICE_TYPE_TO_NAME.get(dev_type) in KERNEL_ONLY_TIMERS:
        dev_type = CPU_DEVICE_TYPE

    def run(number: int, repeat: int) -> tuple[float, ...]:
        # (mod=None, name, dev_type, dev_id, number, repeat, min_repeat_ms, limit_zero_time_iterations,
        #  cooldown_interval_ms, repeats_to_cooldown, cache_flush_bytes, f_preproc)
        timer = make_timer(None, "runtime.TVMTensorCopyFromTo", dev_type, gpu.index, number, repeat, 0, 100, 0, 1, 0, "")
        return struct.unpack("@" + "d" * repeat, timer(source, dest))

    return run


def _dev_type(dev) -> int:
    return int(dev.dlpack_device_type()) % 128  # strip the RPC session mask: the timer runs on the remote side


def measure_copy_curve(
    tracker: TrackerAddress, device: Device, target_kind: str, config: BenchConfig,
    sizes: tuple[int, ...] = COPY_CURVE_BYTES, progress: Progress | None = None,
) -> CopyCurve:
    """Device→host and host→device copy time per size on ``device``, timed on the device (no network).

    Always returns a CopyCurve; a failure is stored as a failed curve with its reason."""
    say = progress or (lambda step, detail: None)
    device_type = DEVICE_TYPE[target_kind]
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    context = {"farm_version": farm.__version__, "tvm_version": tvm.__version__, "device_kind": device.kind,
               "emulated": device.emulated, "clock": "wall (CPU clock; TVM's OpenCL copies block)"
               if device_type in KERNEL_ONLY_TIMERS else f"{device_type} timer"}
    points: list[CopyPoint] = []
    session = None
    try:
        say("session", f"requesting {device.key!r}")
        session = request_session(tracker, device.key, config.timeout_s, device.session_timeout_s)
        dev, host = session.device(device_type, 0), session.cpu(0)
        for nbytes in sizes:
            say("copy curve", f"{nbytes} bytes")
            on_device = tvm.runtime.empty((nbytes,), "uint8", dev)
            on_host = tvm.runtime.empty((nbytes,), "uint8", host)
            for direction, source, dest in (("d2h", on_device, on_host), ("h2d", on_host, on_device)):
                run = _copy_timer(session, source, dest, dev)
                number = config.number or calibrate_number(run, max(config.min_repeat_ms / 5, 1.0))
                points.append(CopyPoint(direction, nbytes, number, tuple(float(v) for v in run(number, config.copy_repeat))))
            del on_device, on_host
    except FarmError as exc:
        return CopyCurve(device.name, device.key, device_type, started_at, tuple(points), "failed",
                         f"{exc.message} ({exc.hint})", context)
    except Exception as exc:  # TVM raises RuntimeError/TVMError for device-side failures
        log.debug("copy curve on %s failed", device.name, exc_info=True)
        return CopyCurve(device.name, device.key, device_type, started_at, tuple(points), "failed", failure_reason(exc),
                         context)
    return CopyCurve(device.name, device.key, device_type, started_at, tuple(points), "ok", "", context)


def raised_in_farm(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by farm's own code (its innermost frame is in the farm package), not by TVM,
    the RPC session or the device: a bug to show, not a device failure to store quietly."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(os.path.dirname(os.path.abspath(farm.__file__)) + os.sep)


def failure_reason(exc: BaseException) -> str:
    """The message line of a device-side error (``errors.message_line``), plus the driver's own error lines when TVM
    quotes a build log."""
    text = str(exc)
    head = message_line(exc)
    driver = [line.strip() for line in text.splitlines()[1:]
              if "error" in line.lower() and "traceback" not in line.lower() and line.strip() not in head][:3]
    return " | ".join([head, *driver]) if driver else head


def check_outputs(outputs: list, reference: list[np.ndarray] | None, config: BenchConfig, reference_name: str) -> CheckResult:
    if reference is None:
        return CheckResult("skipped", reference=reference_name, detail="no reference outputs")
    if len(reference) != len(outputs):
        return CheckResult("failed", reference=reference_name, rtol=config.rtol, atol=config.atol,
                           detail=f"{len(outputs)} outputs, reference has {len(reference)}")
    worst = 0.0
    bad = []
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        got = out.numpy() if hasattr(out, "numpy") else np.asarray(out)  # TVM tensors, or a runtime's arrays
        if got.shape != ref.shape:
            return CheckResult("failed", reference=reference_name, rtol=config.rtol, atol=config.atol,
                               detail=f"output {i} has shape {got.shape}, reference {ref.shape}")
        err = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)))) if got.size else 0.0
        worst = max(worst, err)
        if not np.allclose(got, ref, rtol=config.rtol, atol=config.atol, equal_nan=True):
            bad.append(i)
    if bad:
        return CheckResult("failed", worst, config.rtol, config.atol, reference_name,
                           f"output(s) {bad} exceed rtol={config.rtol:g} atol={config.atol:g}; max abs error {worst:.3g}")
    return CheckResult("passed", worst, config.rtol, config.atol, reference_name)


def measurement_context(device: Device, artifact: Artifact) -> dict[str, Any]:
    """What a number needs beside it to be trusted later; the device's kind adds what it can tell (this host's
    CPU, load and sensors for devices on this host)."""
    context: dict[str, Any] = {
        "farm_version": farm.__version__, "tvm_version": tvm.__version__, "target": artifact.target,
        "artifact_digest": artifact.file_digest, "export": artifact.export, "toolchain": artifact.toolchain,
        "pipeline_version": artifact.pipeline_version,
        "device_kind": device.kind, "emulated": device.emulated, "thermal": None,
    }
    return {**context, **kind_of(device).measurement_context(device)}


# What OpenCL drivers and TVM's OpenCL runtime say when a device has no usable OpenCL (no libOpenCL.so, no ICD,
# no GPU) or cannot build a kernel; the hint says what it means for the user.
NO_PLATFORM = ("cannot open libopencl", "cl_platform_not_found", "no opencl platform", "cl_device_not_found",
               "cl_invalid_platform")


def _driver_hint(reason: str) -> str:
    text = reason.lower()
    if any(marker in text for marker in NO_PLATFORM):
        return ("the device has no usable OpenCL platform (no libOpenCL.so, ICD or GPU driver): install its GPU driver, "
                'or set fallback = "cpu" to measure its CPU instead')
    if "cl_build_program_failure" in text:
        return ("the device's OpenCL compiler rejected a kernel (the driver's words are in the reason): the model uses "
                'something this GPU lacks; fallback = "cpu" measures its CPU instead')
    return ""


def _is_connection_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    if "error caught from rpc call" in text:  # the device answered with its own error: it is there
        return False
    return isinstance(exc, (ConnectionError, OSError)) or "socket" in text or "connection" in text or "rpc" in text



def interleaved_rounds(
    tracker: TrackerAddress, device: Device, old: Artifact, new: Artifact, inputs: dict[str, np.ndarray],
    rounds: int, config: BenchConfig, repeats: int = 5,
) -> tuple[list[float], list[float]]:
    """Per-round figures of two artifacts: each round opens a new session, uploads and loads both, and runs
    them alternately (``repeats`` each, the same number of calls per repeat; which goes first alternates by
    round); a round's figure is each artifact's median. Samples from one load are correlated (code placement,
    caches, clocks at load time), so the comparison is made across rounds, each a fresh load.
    Raises MeasurementError on any failure."""
    from farm.errors import MeasurementError

    number = config.number
    old_rounds, new_rounds = [], []
    for round_index in range(rounds):
        try:
            number, (old_s, new_s) = _interleaved_round(tracker, device, (old, new), inputs, config, number, repeats,
                                                        first=round_index % 2)
        except FarmError:
            raise
        except Exception as exc:
            raise MeasurementError(f"interleaved rerun on {device.name!r} failed in round {round_index + 1}: "
                                   f"{message_line(exc)}",
                                   "check the device (farm devices) and that both artifacts still exist") from exc
        old_rounds.append(nonempty_median(old_s))
        new_rounds.append(nonempty_median(new_s))
    return old_rounds, new_rounds


def _interleaved_round(tracker: TrackerAddress, device: Device, artifacts: tuple[Artifact, Artifact],
                       inputs: dict[str, np.ndarray], config: BenchConfig, number: int | None, repeats: int,
                       first: int) -> tuple[int, tuple[list[float], list[float]]]:
    """One round in its own session (it ends when this returns: nothing of it outlives the call)."""
    session = request_session(tracker, device.key, config.timeout_s, device.session_timeout_s)
    names = [f"farm-interleave-{i}-{os.path.basename(a.path)}" for i, a in enumerate(artifacts)]
    try:
        timers = []
        for name, artifact in zip(names, artifacts):
            session.upload(artifact.path, name)
            dev = session.device(DEVICE_TYPE[target_kind(artifact.target)], 0)
            vm = relax.VirtualMachine(session.load_module(name), dev)
            vm.set_input("main", *[tvm.runtime.tensor(value, dev) for value in inputs.values()])
            timers.append((vm, dev))
        if number is None:  # calibrated once, on the new artifact: every round runs the same number of calls
            new_vm, new_dev = timers[1]
            number = calibrate_number(
                lambda k, r: new_vm.time_evaluator("invoke_stateful", new_dev, number=k, repeat=r)("main").results,
                config.min_repeat_ms)
        evaluators = [vm.time_evaluator("invoke_stateful", dev, number=number, repeat=1) for vm, dev in timers]
        for evaluator in evaluators:
            evaluator("main")  # warm-up after load
        samples: tuple[list[float], list[float]] = ([], [])
        for _ in range(repeats):
            for which in (first, 1 - first):
                samples[which].append(float(evaluators[which]("main").results[0]))
        return number, samples
    finally:
        for name in names:
            try:
                session.remove(name)
            except Exception:  # the session may be gone; its folder goes with it
                pass
