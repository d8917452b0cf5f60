"""Copies between the device and the host, timed on the device apart from compute (no network in the figure):
each output of a run (step 7, copy), and the copy curve, copy time against size (``farm copies``)."""

from __future__ import annotations

import logging
import struct

import numpy as np
import tvm

import farm
from farm.errors import FarmError
from farm.measure.context import DEVICE_TYPE
from farm.records import StepProgress
from farm.measure.failures import failure_reason
from farm.measure.vm import Timer, calibrate_number, remote_device_type
from farm.records import BenchConfig, CopyCurve, CopyPoint, CopyTiming, Device, TrackerAddress, utc_now
from farm.rpc.session import request_session

log = logging.getLogger(__name__)

# Device types whose TVM timer sees only kernels: copies (blocking: clFinish) are timed with the CPU's clock
KERNEL_ONLY_TIMERS = ("opencl",)
CPU_DEVICE_TYPE = 1  # DLPack's kDLCPU
COPY_CURVE_BYTES = tuple(4096 * 4**i for i in range(8))  # 4 KiB … 64 MiB


def time_copy(session, index: int, output, config: BenchConfig) -> CopyTiming:
    """Device→host copy of the run's output ``index``, calibrated to a fifth of ``min_repeat_ms`` (at least 1 ms)."""
    shape = tuple(int(d) for d in output.shape)
    dtype = str(output.dtype)
    host = tvm.runtime.empty(shape, dtype, session.cpu(0))
    run = copy_timer(session, output, host, output.device)
    number = calibrate_number(run, max(config.min_repeat_ms / 5, 1.0))
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return CopyTiming(index, nbytes, shape, dtype, number, tuple(float(v) for v in run(number, config.copy_repeat)))


def copy_timer(session, source, dest, gpu) -> Timer:
    """Time ``runtime.TVMTensorCopyFromTo(source, dest)`` on the device, no network in the figure.

    The timer syncs ``gpu``, the device side of the copy; where TVM's timer for that device sees only
    kernel events (OpenCL), the CPU's clock times it instead: TVM's OpenCL copies block (clFinish)."""
    make_timer = session.get_function("runtime.RPCTimeEvaluator")
    dev_type = remote_device_type(gpu)
    if _kernel_only(dev_type):
        dev_type = CPU_DEVICE_TYPE

    def run(number: int, repeat: int) -> tuple[float, ...]:
        # (mod=None, name, dev_type, dev_id, number, repeat, min_repeat_ms, limit_zero_time_iterations,
        #  cooldown_interval_ms, repeats_to_cooldown, cache_flush_bytes, f_preproc)
        timer = make_timer(None, "runtime.TVMTensorCopyFromTo", dev_type, gpu.index, number, repeat, 0, 100, 0, 1, 0, "")
        return struct.unpack("@" + "d" * repeat, timer(source, dest))

    return run


def _kernel_only(dev_type: int) -> bool:
    """Whether TVM's timer for this DLPack device type sees only kernels (``KERNEL_ONLY_TIMERS``). The type is named
    through TVM's public ``tvm.runtime.device(name)``, not its private type→name table."""
    return any(int(tvm.runtime.device(name).dlpack_device_type()) == dev_type for name in KERNEL_ONLY_TIMERS)


def measure_copy_curve(
    tracker: TrackerAddress, device: Device, target_kind: str, config: BenchConfig,
    sizes: tuple[int, ...] = COPY_CURVE_BYTES, progress: StepProgress | None = None,
) -> CopyCurve:
    """Device→host and host→device copy time per size on ``device``, timed on the device (no network).

    Always returns a CopyCurve; a failure is stored as a failed curve with its reason."""
    say = progress or (lambda step, detail: None)
    device_type = DEVICE_TYPE[target_kind]
    started_at = utc_now()
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
                run = copy_timer(session, source, dest, dev)
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
