"""farm's RPC server for devices on this host: TVM's own rpc_server, kept alive, plus what a GPU measurement needs.

    python -m farm.rpc.server --tracker HOST:PORT --key KEY [--host 127.0.0.1] [--port 9090]
                              [--load-library libtvm_runtime_opencl.so] [--kernel-cache DIR] [--threads N]

It runs TVM's RPC server (same protocol, same forked session per connection) in this process, not in the
``PopenWorker`` of its own that ``rpc.Server`` starts (``farm.tvm_private.serve_rpc_here``). Where TVM's
server stops serving for good when a session's child exits non-zero (a client killed in the middle
of a transfer: the child dies on the broken socket, its ``_serving`` raises and the listen loop ends:
``farm.tvm_private.rpc_serving``),
farm's logs it and keeps serving: a sweep killed mid-cell must not take the device down with it.
It registers, before any session forks from this process:

- ``farm.WallTimeEvaluator(mod, name, dev_type, dev_id, number, repeat)`` → a timer that returns
  ``repeat`` doubles (bytes): per-call wall time on the device, each call followed by a device
  sync. On OpenCL TVM's own ``time_evaluator`` sums kernel event times instead (no launch
  overhead, no gaps); farm stores both, labelled.
- ``farm.ClearKernelCache()`` → empties the driver's on-disk kernel cache (``--kernel-cache``:
  POCL_CACHE_DIR, and CUDA_CACHE_PATH for NVIDIA's OpenCL) so the next first run builds its
  kernels cold. Returns the folder it cleared.
- ``farm.MemoryStats(reset_peak)`` → a JSON object ``{"rss_bytes", "peak_bytes", "total_bytes"}``: VmRSS and
  VmHWM of the process serving the session (a session's forked child, where the model loads) and the
  machine's MemTotal (null where unreadable); then, when ``reset_peak`` is non-zero, the peak is reset to the
  current RSS (``5`` written to ``/proc/self/clear_refs``). farm's native server answers the same.

- ``farm.ThreadsSet()`` → the CPU threads this server gave TVM (``--threads``, default the CPUs online here):
  set as ``TVM_NUM_THREADS`` before the server starts, so every session's thread pool is sized by it, not by TVM's
  default (half the CPUs on x86). A run stores what the session reports (``runtime.NumThreads``); this helper
  says farm set it. farm's native server answers the same.

- ``farm.KernelProfile(module, dev_type, dev_id, runs, *inputs)`` → JSON: the module's ``main`` run ``runs`` times
  (after one not counted; ``runs`` 0: the first run alone, counted) with a VM instrument that syncs the device and
  reads the clock around each call, in this process (no round trip per call): ``{"clock", "runs", "main_s", "kernels":
  [{"name", "calls", "time_s"}]}``, sums over the runs (``farm/measure/profile.py``). On a GPU whose runtime registers
  an event timer (``runtime.timer.opencl``, ``.cuda``) each kernel's time is its own on that timer instead: TVM's
  ``time_evaluator`` on the arguments of its first call, so launches, syncs and the gaps between kernels are not in
  it; ``clock`` says which. farm's native server answers the same.

- ``farm.ServerBuild()`` → what this server runs: a digest of its files (``server_build``); farm's native server
  answers what it was built from (the source's digest, TVM's versions). A run's manifest field ``device.server``.

The device runtime's library is loaded here too, before any session; no OpenCL or CUDA context is made here, so
each session's is created fresh in its own child.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import hashlib
import json
import logging
import os
import shutil
import struct
import time
from pathlib import Path

KERNEL_CACHE_ENV = ("POCL_CACHE_DIR", "CUDA_CACHE_PATH")


def wall_time_evaluator(mod, name: str, dev_type: int, dev_id: int, number: int, repeat: int):
    import tvm

    func = mod[name]
    dev = tvm.runtime.device(int(dev_type), int(dev_id))

    def timer(*args) -> bytearray:
        func(*args)  # warm-up, as TVM's evaluator does
        dev.sync()
        values = []
        for _ in range(int(repeat)):
            start = time.perf_counter()
            for _ in range(int(number)):
                func(*args)
                dev.sync()
            values.append((time.perf_counter() - start) / int(number))
        return bytearray(struct.pack("@" + "d" * len(values), *values))

    return tvm.runtime.convert(timer)


def _proc_kib(path: str, names: tuple[str, ...]) -> dict[str, int | None]:
    """Fields of a /proc file of ``Name:  N kB`` lines, in bytes (None when a name is missing)."""
    found: dict[str, int | None] = dict.fromkeys(names)
    try:
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(":")
            if name in found and value.split():
                found[name] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return found


def memory_stats(reset_peak: int) -> str:
    status = _proc_kib("/proc/self/status", ("VmRSS", "VmHWM"))
    total = _proc_kib("/proc/meminfo", ("MemTotal",))["MemTotal"]
    reset = False
    if reset_peak:
        try:
            with open("/proc/self/clear_refs", "w") as f:  # 5: reset the peak RSS (VmHWM) to the current RSS
                f.write("5")
            reset = True
        except OSError:  # a kernel without it (gVisor, no CONFIG_PROC_PAGE_MONITOR): the peak is then not measured
            pass
    return json.dumps({"rss_bytes": status["VmRSS"], "peak_bytes": status["VmHWM"], "total_bytes": total,
                       "peak_reset": reset})


def clear_kernel_cache() -> str:
    folder = os.environ.get("FARM_KERNEL_CACHE", "")
    if not folder:
        return ""
    shutil.rmtree(folder, ignore_errors=True)
    Path(folder).mkdir(parents=True, exist_ok=True)
    return folder


# the device timers TVM registers (``runtime.timer.<name>``) by DLPack device type: a GPU's event timer
DEVICE_TIMERS = {2: "cuda", 4: "opencl", 7: "vulkan", 8: "metal", 10: "rocm"}
WALL_CLOCK = "wall, the device synced before and after each call"


def device_timer(dev_type: int) -> str:
    """The name of ``dev_type``'s own timer where this process has one registered (a GPU's runtime loaded), else ""."""
    import tvm

    name = DEVICE_TIMERS.get(int(dev_type), "")
    return name if name and tvm.get_global_func(f"runtime.timer.{name}", allow_missing=True) else ""


def device_clock(timer: str) -> str:
    return (f"device: each kernel on the {timer} event timer (TVM's time_evaluator, on its first call's own "
            "arguments, as often as the runs); the VM's calls and main wall, the device synced around each call")


def kernel_device_times(module, dev, runs: int, first_calls: dict) -> dict[str, float]:
    """Seconds per call of each kernel in ``first_calls`` (symbol → its first call's arguments) on the device's own
    timer: the median of ``runs`` repeats of one call by TVM's ``time_evaluator`` (one call before, not counted),
    where a module the executable imports holds the kernel; the VM's calls are held by none."""
    seconds = {}
    for symbol, args in first_calls.items():
        holder = next((m for m in module.imports if m.implements_function(symbol, True)), None)
        if holder is not None:
            timed = holder.time_evaluator(symbol, dev, number=1, repeat=max(int(runs), 1))(*args)
            seconds[symbol] = float(timed.median)
    return seconds


def kernel_profile(module, dev_type: int, dev_id: int, runs: int, *inputs) -> str:
    """``farm.KernelProfile``: each call of ``main`` timed between device syncs, summed over ``runs`` runs after one
    not counted (``runs`` 0: the first run alone, counted: ``measure.profile.profile_runs``); on a GPU
    with an event timer, each kernel's time is its own on that timer (``kernel_device_times``)."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    dev = tvm.runtime.device(int(dev_type), int(dev_id))
    vm = VirtualMachine(module, dev)
    timer = device_timer(dev_type)
    capture = bool(timer)  # the uncounted run's calls, kept for the device's timer
    times: dict[str, float] = {}
    calls: dict[str, int] = {}
    started: dict[str, float] = {}
    first_calls: dict[str, tuple] = {}

    def instrument(func, symbol, before_run, ret_value, *args) -> int:  # the VM's signature; 0: go on
        dev.sync()
        now = time.perf_counter()
        if before_run:
            started[symbol] = now
            if capture and symbol not in first_calls:
                first_calls[symbol] = args
        else:
            times[symbol] = times.get(symbol, 0.0) + now - started.pop(symbol, now)
            calls[symbol] = calls.get(symbol, 0) + 1
        return 0

    vm.set_instrument(instrument)
    count_first = int(runs) == 0  # runs 0: one run, the first, counted (a slow model's profile within its share)
    runs = max(int(runs), 1)
    dev.sync()
    begun = time.perf_counter()
    vm["main"](*inputs)  # else not counted: the first run allocates, and builds kernels where the driver is lazy
    dev.sync()
    main_s = time.perf_counter() - begun
    capture = False
    on_device = kernel_device_times(module, dev, runs, first_calls)
    first_calls.clear()  # the first run's tensors go back to the VM's pool before the counted runs
    if not count_first:
        times.clear()
        calls.clear()
        dev.sync()
        begun = time.perf_counter()
        for _ in range(runs):
            vm["main"](*inputs)
        dev.sync()
        main_s = time.perf_counter() - begun
    for symbol, per_call in on_device.items():
        times[symbol] = per_call * calls.get(symbol, 0)
    clock = device_clock(timer) if on_device else WALL_CLOCK
    return json.dumps({"clock": clock + (FIRST_COUNTED if count_first else ""),
                       "runs": int(runs), "main_s": main_s,
                       "kernels": [{"name": name, "calls": calls[name], "time_s": times[name]} for name in times]})


FIRST_COUNTED = "; the first run, counted (runs 0)"  # a profile of one counted run says so (kernel_diff's note)


def keep_serving(serving):
    """TVM's ``_serving`` (``tvm_private.rpc_serving``), but a session whose child died is logged and closed instead
    of ending the server."""

    @functools.wraps(serving)
    def wrapped(sock, addr, opts, load_library):
        home = os.getcwd()
        try:
            serving(sock, addr, opts, load_library)
        except RuntimeError as exc:  # "Child process N exited unsuccessfully": the client went away mid-call
            logging.getLogger("farm.rpc.server").warning("session from %s ended abnormally: %s; still serving",
                                                         addr, exc)
            session_dir = os.getcwd()
            os.chdir(home)
            if session_dir != home:
                shutil.rmtree(session_dir, ignore_errors=True)
            sock.close()

    return wrapped


def register(library: str | None, threads: int = 0) -> None:
    """Runs before the server listens: keep serving after a bad session, load the device runtime, register helpers."""
    import tvm

    from farm.tvm_private import rpc_serving, set_rpc_serving

    if not getattr(rpc_serving(), "__wrapped__", None):
        set_rpc_serving(keep_serving(rpc_serving()))
    if library:
        ctypes.CDLL(library, ctypes.RTLD_GLOBAL)
    tvm.register_global_func("farm.WallTimeEvaluator", wall_time_evaluator, override=True)
    tvm.register_global_func("farm.ClearKernelCache", clear_kernel_cache, override=True)
    tvm.register_global_func("farm.MemoryStats", memory_stats, override=True)
    tvm.register_global_func("farm.ThreadsSet", lambda: threads, override=True)
    tvm.register_global_func("farm.KernelProfile", kernel_profile, override=True)
    tvm.register_global_func("farm.ServerBuild", server_build, override=True)
    server_build()  # once, before sessions fork


def server_build() -> str:
    """``farm.ServerBuild``: what this server runs, as a digest of its files (this module, TVM's runtime and tvm-ffi's
    libraries), computed once per server: a run's manifest field ``device.server`` (farm/manifest.py)."""
    global SERVER_BUILD  # pylint: disable=global-statement
    if SERVER_BUILD is None:
        import tvm
        import tvm_ffi

        digest = hashlib.sha256()
        for lib in (Path(__file__), *sorted(Path(tvm.__file__).parent.glob("lib/libtvm_runtime*.so")),
                    *sorted(Path(tvm_ffi.__file__).parent.glob("lib/libtvm_ffi.so"))):
            digest.update(lib.name.encode() + b"\0" + lib.read_bytes())
        SERVER_BUILD = f"python-server-{digest.hexdigest()}"
    return SERVER_BUILD


SERVER_BUILD: str | None = None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m farm.rpc.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracker", required=True, help="HOST:PORT of the tracker to register with")
    parser.add_argument("--key", required=True, help="the tracker key (the device's key in devices.toml)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9090, help="exactly this port (no sliding to the next)")
    parser.add_argument("--load-library", default="", help="a device runtime to load, e.g. libtvm_runtime_opencl.so")
    parser.add_argument("--kernel-cache", default="", help="the driver's kernel cache folder (cleared for cold runs)")
    parser.add_argument("--threads", type=int, default=0,
                        help="TVM's CPU threads in every session (default: the CPUs online here; TVM's own default "
                             "halves them on x86)")
    args = parser.parse_args(argv)
    from farm.records import online_cpus
    from farm.tvm_private import import_tvm_without_torch, serve_rpc_here

    import_tvm_without_torch()

    threads = args.threads if args.threads > 0 else online_cpus()
    os.environ["TVM_NUM_THREADS"] = str(threads)  # before TVM starts: each session inherits it
    if args.kernel_cache:
        Path(args.kernel_cache).mkdir(parents=True, exist_ok=True)
        os.environ["FARM_KERNEL_CACHE"] = args.kernel_cache
        for name in KERNEL_CACHE_ENV:
            os.environ[name] = args.kernel_cache
    host, port = args.tracker.rsplit(":", 1)  # register runs in this process: nothing is pickled to a worker now
    serve_rpc_here(args.host, args.port, args.key, (host, int(port)),
                   functools.partial(register, args.load_library or None, threads))


if __name__ == "__main__":
    main()
