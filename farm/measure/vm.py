"""Load an artifact as a Relax VM in a session and time it on the device: the one ``load_vm`` and the one steady
timer (``SteadyTimer``: ``time_evaluator`` over ``invoke_stateful``, ``calibrate_number``) that bench, interleaved
rounds and the task profile share."""

from __future__ import annotations

import math
import struct
import time
from typing import Any, Callable

import tvm
from tvm.runtime.vm import VirtualMachine

from farm.records import BenchConfig

MAX_NUMBER = 100_000  # calibrate_number's ceiling on calls per repeat
Timer = Callable[[int, int], tuple[float, ...]]  # (number, repeat) -> each repeat's seconds a call


def load_vm(session, remote_name: str, dev) -> VirtualMachine:
    """The uploaded artifact ``remote_name`` loaded in ``session`` and made a Relax VM on ``dev``."""
    return VirtualMachine(session.load_module(remote_name), dev)


def device_timer(module, name: str, dev, number: int, repeat: int,
                 min_repeat_ms: float = 0, f_preproc: str = "") -> Callable[..., tuple[float, ...]]:
    """TVM's ``time_evaluator`` of ``module``'s function ``name`` on ``dev``, timed on the device (warm-up
    discarded): called with the function's arguments, it gives each of ``repeat`` results, seconds a call (the
    mean of ``number`` calls); ``f_preproc``: a device function called before each repeat (TVM's
    ``cache_flush_cpu_non_first_arg``)."""
    timer = module.time_evaluator(name, dev, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms,
                                  f_preproc=f_preproc)
    return lambda *args: tuple(float(v) for v in timer(*args).results)


class SteadyTimer:
    """A loaded VM's ``main`` with ``args`` set as its inputs (they stay on the device), called through
    ``invoke_stateful``: what is timed is the model's compute alone."""

    def __init__(self, vm: VirtualMachine, dev, args: list) -> None:
        vm.set_input("main", *args)
        self.vm, self.dev = vm, dev

    def evaluator(self, number: int, repeat: int) -> Callable[[], tuple[float, ...]]:
        """One timer of ``number`` calls a repeat, made once and called as often as wanted."""
        timer = device_timer(self.vm, "invoke_stateful", self.dev, number, repeat)
        return lambda: timer("main")

    def __call__(self, number: int, repeat: int) -> tuple[float, ...]:
        return self.evaluator(number, repeat)()

    def number(self, config: BenchConfig) -> int:
        """The calls per repeat: the config's, else calibrated to ``config.min_repeat_ms``."""
        return config.number or calibrate_number(self, config.min_repeat_ms)


def calibrate_number(run: Timer, min_repeat_ms: float) -> int:
    """Choose ``number`` so one repeat lasts at least ``min_repeat_ms`` (TVM's own growth is not reported)."""
    if min_repeat_ms <= 0:
        return 1
    number = 1
    while True:
        seconds = max(min(run(number, 1)), 1e-9)
        if seconds * number * 1000 >= min_repeat_ms or number >= MAX_NUMBER:
            return number
        number = min(MAX_NUMBER, max(number * 2, math.ceil(number * min_repeat_ms / (seconds * number * 1000) * 1.1)))


def first_run(vm: VirtualMachine, dev, args: list) -> tuple[float, Any]:
    """Host wall clock around the first call and a device sync (one RPC round trip included), and its result."""
    dev.sync()
    t0 = time.perf_counter()
    result = vm["main"](*args)
    dev.sync()
    return time.perf_counter() - t0, result


def wall_timer(make_timer, vm: VirtualMachine, dev) -> Timer:
    """Per-call wall time on the device: each call followed by a sync, timed by the server's clock
    (``farm.WallTimeEvaluator``)."""
    dev_type = remote_device_type(dev)

    def run(number: int, repeat: int) -> tuple[float, ...]:
        blob = make_timer(vm.module, "invoke_stateful", dev_type, dev.index, number, repeat)("main")
        return struct.unpack("@" + "d" * repeat, bytes(blob))

    return run


def unpack(session, result) -> list:
    """The VM returns one tensor or, for several outputs, a remote Array."""
    if isinstance(result, tvm.runtime.Tensor):
        return [result]
    size = session.get_function("ffi.ArraySize")(result)
    get_item = session.get_function("ffi.ArrayGetItem")
    return [get_item(result, i) for i in range(size)]


def remote_device_type(dev) -> int:
    """``dev``'s DLPack device type on the device's side (kDLCPU 1, kDLOpenCL 4, ...)."""
    return int(dev.dlpack_device_type()) % 128  # strip the RPC session mask: the timer runs on the remote side


def remove_quietly(session, name: str) -> None:
    """Remove an uploaded file from the session's folder: the session may be gone, and its folder with it."""
    try:
        session.remove(name)
    except Exception:  # the session may be gone; nothing left to clean
        pass
