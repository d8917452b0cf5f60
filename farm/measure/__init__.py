"""Measure one artifact on one device over RPC, in numbered steps (``steps.STEPS``, in this order).

    1 session   request a server for the device's key (bounded wait)
    2 upload    push the artifact (timed)
    3 load      read the session's CPU threads (``runtime.NumThreads``, as farm's server set them: ``session_threads``),
                then load the module and create the Relax VM (timed); the driver's kernel cache is
                cleared first where the server offers it (farm's GPU server), so this is a cold start.
                Where the server offers ``farm.MemoryStats`` (farm's servers), the session process's RSS
                before and after the load, and its peak over load, first run and steady runs (``Memory``)
    4 first     cold first run, host wall clock around call + device sync (timed: GPU kernels built)
    5 warm      a second load of the same artifact and its first run (kernels from the driver's cache)
    6 steady    ``time_evaluator`` on the device: warm-up discarded, every repeat kept raw. On OpenCL
                that is the sum of kernel event times (``steady_clock = "kernel"``), so GPUs also get
                per-call wall time on the device (call + sync) where the server offers it
    7 copy      device→host copy of each output, timed on the device apart from compute
    8 check     outputs against the reference, with tolerance
    9 profile   where ``config.profile`` asks: each kernel of main timed on the device by the server's helper
                (farm.KernelProfile), in runs of its own after the timed ones; a server without it, or a failure,
                is a profile "not available" with the reason, and the run stands (``profile.py``)
      cleanup   remove the uploaded file and drop the session (always)

Each step is a function over the run (``steps.Run``) that writes what it measures into the run's typed draft
(``RunDraft``: exactly the BenchResult fields a step fills); the BenchResult is built from the draft by keyword.
A failing step ends the run as a failed result carrying the step and the reason; what was measured before it is
kept. Nothing here raises for a device failure; an error raised in farm's own code is farm's bug, stored as failed
at step "farm" with its traceback logged (``raised_in_farm``).

One ``load_vm`` and one steady timer (``SteadyTimer``: ``time_evaluator`` over ``invoke_stateful``, with
``calibrate_number``) serve bench, ``interleaved_rounds`` and (its ``device_timer``) the task profile.

    context.py      device type per target, steady clock, threads, farm's server helpers, measurement context
    draft.py        RunDraft
    memory.py       the session process's memory (farm.MemoryStats)
    vm.py           load_vm, SteadyTimer, device_timer, calibrate_number, first run, wall timer
    copies.py       step 7's copy timer, and the copy curve (measure_copy_curve)
    check.py        step 8: check_outputs
    profile.py      step 9: the per-kernel profile (profile_loaded), op classes by kernel name
    failures.py     a failure's reason and hint; raised_in_farm
    steps.py        the steps, STEPS, bench_artifact
    interleaved.py  interleaved_rounds
"""

from farm.measure.check import check_outputs
from farm.measure.context import (DEVICE_TYPE, SERVER_HELPERS, STEADY_CLOCK, THREADS_BY_FARM, THREADS_NOT_SET,
                                  measurement_context, server_helpers, session_threads)
from farm.measure.copies import COPY_CURVE_BYTES, KERNEL_ONLY_TIMERS, copy_timer, measure_copy_curve, time_copy
from farm.measure.draft import RunDraft
from farm.records import StepProgress
from farm.measure.failures import StepFailed, failure_reason, raised_in_farm
from farm.measure.interleaved import interleaved_rounds
from farm.measure.memory import MEMORY_EMULATED, MEMORY_MEASURED, MEMORY_UNMEASURED, Memory
from farm.measure.steps import STEPS, Run, Step, bench_artifact
from farm.measure.vm import MAX_NUMBER, SteadyTimer, calibrate_number, device_timer, load_vm

__all__ = [
    "COPY_CURVE_BYTES", "DEVICE_TYPE", "KERNEL_ONLY_TIMERS", "MAX_NUMBER", "MEMORY_EMULATED", "MEMORY_MEASURED",
    "MEMORY_UNMEASURED", "SERVER_HELPERS", "STEADY_CLOCK", "STEPS", "THREADS_BY_FARM", "THREADS_NOT_SET", "Memory",
    "StepProgress", "Run", "RunDraft", "Step", "StepFailed", "SteadyTimer", "bench_artifact", "calibrate_number",
    "check_outputs", "copy_timer", "device_timer", "failure_reason", "interleaved_rounds", "load_vm",
    "measure_copy_curve", "measurement_context", "raised_in_farm", "server_helpers", "session_threads", "time_copy",
]
