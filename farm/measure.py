"""Measure one artifact on one device over RPC, in numbered steps.

    1 session   request a server for the device's key (bounded wait)
    2 upload    push the artifact (timed)
    3 load      load the module and create the Relax VM (timed)
    4 first     first run, host wall clock around call + device sync (timed)
    5 steady    ``time_evaluator`` on the device: warm-up discarded, every repeat kept raw
    6 copy      device→host copy of each output, timed on the device apart from compute
    7 check     outputs against the reference, with tolerance
    cleanup     remove the uploaded file and drop the session (always)

A failing step ends the run as a failed result carrying the step and the reason;
what was measured before it is kept. Nothing here raises for a device failure.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import struct
import time
from datetime import datetime, timezone
from typing import Any, Callable

import numpy as np
import psutil
import tvm
from tvm import relax

import farm
from farm.errors import FarmError, first_line
from farm.records import Artifact, BenchConfig, BenchResult, CheckResult, CopyTiming, Device, TrackerAddress
from farm.rpc.session import request_session

log = logging.getLogger(__name__)

Progress = Callable[[str, str], None]
DEVICE_TYPE = {"llvm": "cpu", "c": "cpu", "opencl": "opencl", "cuda": "cuda", "metal": "metal",
               "vulkan": "vulkan", "rocm": "rocm", "webgpu": "webgpu"}
MAX_NUMBER = 100_000


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
            raise StepFailed("session", exc.message, exc.hint) from None
        step = "upload"
        say(step, artifact.path)
        t0 = time.perf_counter()
        session.upload(artifact.path, remote_name)
        fields["upload_s"] = time.perf_counter() - t0

        step = "load"
        say(step, remote_name)
        t0 = time.perf_counter()
        lib = session.load_module(remote_name)
        dev = session.device(DEVICE_TYPE[artifact.target["kind"]], 0)
        vm = relax.VirtualMachine(lib, dev)
        fields["load_s"] = time.perf_counter() - t0

        step = "first"
        say(step, "first run")
        args = [tvm.runtime.tensor(value, dev) for value in inputs.values()]
        dev.sync()
        t0 = time.perf_counter()
        result = vm["main"](*args)
        dev.sync()
        fields["first_run_s"] = time.perf_counter() - t0
        outputs = _unpack(session, result)

        step = "steady"
        vm.set_input("main", *args)
        number = config.number or _calibrate(
            lambda n, r: vm.time_evaluator("invoke_stateful", dev, number=n, repeat=r)("main").results,
            config.min_repeat_ms)
        say(step, f"{config.repeat} repeats × {number} calls")
        timer = vm.time_evaluator("invoke_stateful", dev, number=number, repeat=config.repeat)
        fields["steady_number"] = number
        fields["steady_samples_s"] = tuple(float(v) for v in timer("main").results)

        step = "copy"
        say(step, f"{len(outputs)} output(s)")
        fields["copies"] = tuple(_time_copy(session, i, out, config) for i, out in enumerate(outputs))

        step = "check"
        fields["check"] = _check(outputs, reference, config, reference_name)
        say(step, fields["check"].status)
        if fields["check"].status == "failed":
            raise StepFailed("check", f"outputs differ from {reference_name}: {fields['check'].detail}",
                             "the compiled model computes something else than the reference; the check is stored with its max error")
    except StepFailed as exc:
        return _result(device, artifact, config, context, started_at, fields, "failed", exc.step, exc.reason, exc.hint)
    except Exception as exc:  # TVM raises RuntimeError/TVMError/OSError for device-side failures
        reason = first_line(exc)
        hint = "the device dropped the session; check `farm devices`" if _is_connection_error(exc) else \
            "see the device's server log; the failure is stored with its reason"
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
        config=config, context=context, started_at=started_at, **fields,
    )


def _unpack(session, result) -> list:
    """The VM returns one tensor or, for several outputs, a remote Array."""
    if isinstance(result, tvm.runtime.Tensor):
        return [result]
    size = session.get_function("ffi.ArraySize")(result)
    get_item = session.get_function("ffi.ArrayGetItem")
    return [get_item(result, i) for i in range(size)]


def _calibrate(run: Callable[[int, int], tuple[float, ...]], min_repeat_ms: float) -> int:
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
    dev = output.device
    make_timer = session.get_function("runtime.RPCTimeEvaluator")
    dev_type = dev.dlpack_device_type() if hasattr(dev, "dlpack_device_type") else dev.device_type
    dev_type = int(dev_type) % 128  # strip the RPC session mask: the timer runs on the remote side

    def run(number: int, repeat: int) -> tuple[float, ...]:
        # (mod=None, name, dev_type, dev_id, number, repeat, min_repeat_ms, limit_zero_time_iterations,
        #  cooldown_interval_ms, repeats_to_cooldown, cache_flush_bytes, f_preproc)
        timer = make_timer(None, "runtime.TVMTensorCopyFromTo", dev_type, dev.index, number, repeat, 0, 100, 0, 1, 0, "")
        blob = timer(output, host)
        return struct.unpack("@" + "d" * repeat, blob)

    number = _calibrate(run, max(config.min_repeat_ms / 5, 1.0))
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return CopyTiming(index, nbytes, shape, dtype, number, tuple(float(v) for v in run(number, config.copy_repeat)))


def _check(outputs: list, reference: list[np.ndarray] | None, config: BenchConfig, reference_name: str) -> CheckResult:
    if reference is None:
        return CheckResult("skipped", reference=reference_name, detail="no reference outputs")
    if len(reference) != len(outputs):
        return CheckResult("failed", reference=reference_name, rtol=config.rtol, atol=config.atol,
                           detail=f"{len(outputs)} outputs, reference has {len(reference)}")
    worst = 0.0
    bad = []
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        got = out.numpy()
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
    """What a number needs beside it to be trusted later."""
    context: dict[str, Any] = {
        "farm_version": farm.__version__, "tvm_version": tvm.__version__, "target": artifact.target,
        "artifact_digest": artifact.file_digest, "export": artifact.export, "toolchain": artifact.toolchain,
        "device_kind": device.kind, "emulated": device.emulated, "thermal": None,
    }
    if device.kind == "local":  # the device is this host: its own figures describe it
        context["host"] = {
            "platform": platform.platform(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "load_avg": list(os.getloadavg()), "mem_available_mb": psutil.virtual_memory().available // 2**20,
        }
        freq = psutil.cpu_freq()
        if freq is not None:
            context["host"]["cpu_freq_mhz"] = freq.current
        temps = getattr(psutil, "sensors_temperatures", lambda: {})()
        if temps:
            context["thermal"] = {name: max(t.current for t in entries) for name, entries in temps.items() if entries}
    return context


def _is_connection_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, (ConnectionError, OSError)) or "socket" in text or "connection" in text or "rpc" in text



def interleaved_samples(
    tracker: TrackerAddress, device: Device, old: Artifact, new: Artifact, inputs: dict[str, np.ndarray],
    n: int, config: BenchConfig,
) -> tuple[list[float], list[float]]:
    """Run two artifacts alternately in one session, ``n`` repeats each (same number of calls per repeat).

    What changed between nights (temperature, load, clocks) hits both equally, so the comparison
    tests the artifacts. Raises MeasurementError on any failure."""
    from farm.errors import MeasurementError

    session = request_session(tracker, device.key, config.timeout_s, device.session_timeout_s)
    names = [f"farm-interleave-{i}-{os.path.basename(a.path)}" for i, a in enumerate((old, new))]
    try:
        timers = []
        for name, artifact in zip(names, (old, new)):
            session.upload(artifact.path, name)
            dev = session.device(DEVICE_TYPE[artifact.target["kind"]], 0)
            vm = relax.VirtualMachine(session.load_module(name), dev)
            vm.set_input("main", *[tvm.runtime.tensor(value, dev) for value in inputs.values()])
            timers.append((vm, dev))
        new_vm, new_dev = timers[1]
        number = config.number or _calibrate(
            lambda k, r: new_vm.time_evaluator("invoke_stateful", new_dev, number=k, repeat=r)("main").results,
            config.min_repeat_ms)
        evaluators = [vm.time_evaluator("invoke_stateful", dev, number=number, repeat=1) for vm, dev in timers]
        old_s, new_s = [], []
        for _ in range(n):
            old_s.append(float(evaluators[0]("main").results[0]))
            new_s.append(float(evaluators[1]("main").results[0]))
        return old_s, new_s
    except Exception as exc:
        raise MeasurementError(f"interleaved rerun on {device.name!r} failed: {first_line(exc)}",
                               "check the device (farm devices) and that both artifacts still exist") from None
    finally:
        for name in names:
            try:
                session.remove(name)
            except Exception:
                pass
