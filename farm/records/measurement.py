"""What a measurement is told and gives back: ``BenchConfig``, ``BenchResult``, kernel profiles, copies,
the output check, copy curves."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

# What long work reports as it goes, one shape each (a command prints them on stderr with --progress):
Progress = Callable[[str, str, str, str], None]  # a cell's step: device, model, step, detail (sweeps, bench, reruns)
StepProgress = Callable[[str, str], None]  # one cell's step, its device and model known: step, detail (measure/)
Say = Callable[[str], None]  # a line: a tuning session's, a night's steps'




@dataclass(frozen=True)
class BenchConfig:
    """How to measure. ``number=None`` calibrates it from ``min_repeat_ms``."""

    repeat: int = 20
    number: int | None = None
    min_repeat_ms: float = 50.0
    copy_repeat: int = 10
    timeout_s: float = 30.0
    rtol: float = 1e-4
    atol: float = 1e-4
    seed: int = 0
    profile: bool = False  # then where the time goes: each kernel timed on the device, after the timed runs
    # ... within a share of the cell's device time (a sweep's default profile, #63: measure.profile.profile_runs);
    # False: as many runs as a profile asked for takes
    profile_share: bool = False


@dataclass(frozen=True)
class KernelTime:
    """One kernel of a run's profile: per run of ``main``; what the compile knew of it (``args``, ``flops``,
    ``schedule``: tuned by a record | scheduled by TVM's default rules (GPUs) | untuned; "" where not known)."""

    name: str
    op_class: str
    calls: float
    time_s: float
    args: tuple[str, ...] = ()  # "float32[1, 64, 56, 56]", parameters in order (inputs, then outputs)
    flops: float | None = None  # per call, TIR's estimate
    schedule: str = ""

    @property
    def gflops(self) -> float | None:
        """GFLOP/s over its time (None where the FLOPs are not known or it took no time)."""
        return None if not self.flops or not self.time_s or not self.calls else \
            self.flops * self.calls / self.time_s / 1e9


@dataclass(frozen=True)
class KernelProfile:
    """A run's per-kernel profile, or why there is none (``status`` "not available": the run stands)."""

    status: str  # "ok" | "not available"
    reason: str = ""
    clock: str = ""  # what timed each call
    runs: int = 0
    main_s: float = 0.0  # one run of main, instrumented (the calls and what lies between them)
    kernels: tuple[KernelTime, ...] = ()

    @property
    def kernel_sum_s(self) -> float:
        """The kernels' time per run; the VM's own calls (op class "vm") are not kernels."""
        return sum(k.time_s for k in self.kernels if k.op_class != "vm")

    def by_class(self) -> dict[str, float]:
        """Seconds per run by op class, largest first."""
        totals: dict[str, float] = {}
        for kernel in self.kernels:
            totals[kernel.op_class] = totals.get(kernel.op_class, 0.0) + kernel.time_s
        return dict(sorted(totals.items(), key=lambda item: -item[1]))

    def top(self, n: int | None = None) -> list[KernelTime]:
        """The kernels, most time first (the VM's calls among them)."""
        return sorted(self.kernels, key=lambda k: -k.time_s)[:n]

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "clock": self.clock, "runs": self.runs,
                "main_s": self.main_s, "kernel_sum_s": self.kernel_sum_s, "by_class_s": self.by_class(),
                "kernels": [{**asdict(k), "args": list(k.args), "gflops": k.gflops} for k in self.top()]}


@dataclass(frozen=True)
class CopyTiming:
    """Device→host copy of one output, timed on the device apart from compute."""

    output_index: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    number: int
    samples_s: tuple[float, ...]


@dataclass(frozen=True)
class CheckResult:
    status: str  # passed | failed | skipped
    max_abs_err: float | None = None
    rtol: float | None = None
    atol: float | None = None
    reference: str = ""
    detail: str = ""


def utc_now() -> str:
    """A timestamp as farm keeps them (runs, sweeps, the database, reports): UTC, ISO 8601, to the second."""
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class BenchResult:
    """Everything one ``farm bench`` measured, failed or not."""

    device: str
    key: str
    model: str
    model_digest: str
    status: str  # ok | failed
    reason: str = ""
    failed_step: str = ""
    hint: str = ""
    artifact_key: str = ""
    upload_s: float | None = None
    load_s: float | None = None
    first_run_s: float | None = None  # the cold first run: kernels built (driver kernel cache cleared where farm can)
    load_warm_s: float | None = None  # a second load of the same artifact in the same session
    first_run_warm_s: float | None = None  # ... and its first run: kernels from the driver's cache
    steady_number: int | None = None
    steady_samples_s: tuple[float, ...] = ()  # what TVM's time_evaluator gives: see steady_clock
    steady_clock: str = "wall"  # wall (CPU) | kernel (OpenCL: sum of kernel event times) | device (GPU events)
    steady_wall_number: int | None = None
    steady_wall_samples_s: tuple[float, ...] = ()  # GPUs: per-call wall time on the device, call + sync
    fallback_of: int | None = None  # the failed GPU run this CPU run stands in for
    runtime: str = "tvm"  # tvm, or the reference runtime timed beside it: onnxruntime | litert | torch (no artifact)
    runtime_version: str = ""  # the reference runtime's version (TVM's is in the context)
    # the CPU threads the run used, as the device's session reported them (runtime.NumThreads) for TVM, and as given
    # to the reference runtime (TVM's reported count, THREADS_RULE); None: not known. context["threads_by"] says who set them
    threads: int | None = None
    copies: tuple[CopyTiming, ...] = ()
    # planned memory, the artifact's (Artifact.params_bytes …), carried onto the run; None for a reference runtime
    params_bytes: int | None = None
    planned_host_bytes: int | None = None
    planned_device_bytes: int | None = None
    # measured: the session's server process RSS (farm.MemoryStats; VmRSS, VmHWM) before and after the load and its
    # peak over the steady runs; GPU driver allocations are not in it, and under qemu it is qemu's own. None: the
    # server cannot say (a stock TVM server, iOS)
    rss_before_load_bytes: int | None = None
    rss_after_load_bytes: int | None = None
    rss_peak_bytes: int | None = None
    check: CheckResult = CheckResult("skipped", detail="not reached")
    profile: KernelProfile | None = None  # where the time goes (config.profile), in runs after the timed ones
    config: BenchConfig = BenchConfig()
    context: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""


@dataclass(frozen=True)
class CopyPoint:
    """Copies of ``nbytes`` in one direction (``d2h`` device→host, ``h2d`` host→device), timed on the device."""

    direction: str
    nbytes: int
    number: int
    samples_s: tuple[float, ...]


@dataclass(frozen=True)
class CopyCurve:
    """Copy time against size for one device: is get_output eating the GPU's gain?"""

    device: str
    key: str
    device_type: str
    started_at: str
    points: tuple[CopyPoint, ...]
    status: str = "ok"  # ok | failed
    reason: str = ""
    context: dict[str, Any] = field(default_factory=dict)
