"""A device's settings rules, each stated once (``THREADS_RULE``, ``PREPACK_RULE``, ``LAYOUT_RULE``,
``COLD_WEIGHTS_RULE``) with the function that applies it, and how tuning times a candidate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from farm.records.device import Device
from farm.records.targets import cpu_arch, target_kind


THREADS_RULE = ("TVM's CPU threads on a device: devices.toml's threads, else the target's num-cores (its host's for a "
                "GPU target), else the CPUs online on the device, as its server counts them; farm's servers apply it "
                "(TVM_NUM_THREADS) before any session, every run stores the count the session reports "
                "(runtime.NumThreads), and the reference runtime gets that count")


@dataclass(frozen=True)
class Threads:
    """The CPU threads a run used, and who set them (a session's report, or what the reference runtime was given)."""

    count: int
    set_by: str


def online_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's or taskset's limit counts): the count farm's
    servers give TVM when nothing else is set, and the num-cores farm fills in for this host's kinds."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_setting(device: Device, target: dict[str, Any] | None = None) -> int | None:
    """The CPU threads farm's servers give TVM on ``device`` (``THREADS_RULE``), reading ``num-cores`` from
    ``target`` (the effective target, where the caller has it) or the inventory's; None: the server's own count of
    its online CPUs. Never TVM's default, which halves the CPUs on x86 (it assumes two hyper-threads per core: 1
    thread on a 2-core VM)."""
    if device.threads is not None:
        return device.threads
    given = target or device.target
    for candidate in (given, given.get("host"), device.host):
        if isinstance(candidate, dict) and candidate.get("num-cores"):
            return int(candidate["num-cores"])
    return None

PREPACK_RULE = ("CPU weight prepacking, TVM's recipe for CPUs (static_shape_tuning_pipeline(cpu_weight_prepack=True)): "
                "tuning may give each conv or matmul its weights in a packed layout, and a tuned compile folds that "
                "repacking of the model's constant weights into the library (main(input) is unchanged); default: on "
                "for llvm targets, off elsewhere (MetaSchedule's GPU postprocessors rewrite no layout); records tuned "
                "with and without it are kept apart")


def weight_prepack_setting(device: Device, target: dict[str, Any] | None = None) -> bool:
    """Whether ``device``'s tuned compiles prepack weights and its tuning lets MetaSchedule choose weight layouts
    (``PREPACK_RULE``): devices.toml's ``weight_prepack``, else on for an llvm target (``target``, the effective one,
    where the caller has it). Only MetaSchedule's LLVM postprocessors include ``RewriteLayout``
    (``Postproc.create("cuda")`` has none), so on a GPU target the setting would change nothing but the workloads'
    names; the inventory refuses it there."""
    if device.weight_prepack is not None:
        return device.weight_prepack
    return target_kind(target or device.target) == "llvm"


# The data layouts a device's tuned compiles may give a model's convolutions (devices.toml's ``layout``)
LAYOUTS = ("model", "NHWC")
LAYOUT_RULE = ('the data layout of tuning\'s and tuned compiles\' convolutions: "NHWC" converts them (Relax\'s '
               'ConvertLayout: channels innermost, so the CPU\'s vectors hold a conv\'s output channels; the model\'s '
               'inputs and outputs keep their layout), "model" keeps the model\'s own (ONNX\'s NCHW); default: NHWC '
               'for llvm targets, the model\'s own elsewhere; records tuned with either are kept apart')


def layout_setting(device: Device, target: dict[str, Any] | None = None) -> str:
    """The layout ``device``'s tuning and tuned compiles give convolutions (``LAYOUT_RULE``): devices.toml's
    ``layout``, else NHWC for an llvm target (``target``, the effective one, where the caller has it), else the
    model's own. On this host's CPU, NHWC tuned squeezenet 1.3–2× faster in the same minutes
    (tools/bench_tuning.py --layouts, docs/benchmarks.md); GPU targets were not measured with it."""
    if device.layout is not None:
        return device.layout
    return "NHWC" if target_kind(target or device.target) == "llvm" else "model"


# How tuning times a candidate on a CPU: inside a model, a kernel finds its input where the kernel before left it, but
# its weights have left the caches since the last run (resnet50's 100 MB of them stream from memory every run). Timed
# warm, back to back, resnet50's stage-4 convs and its matmul ran 1.3-4x faster than inside the model, and schedules
# within 1 % of each other warm were 20 % apart cold (tools/bench_kernels.py, docs/benchmarks.md).
COLD_WEIGHTS_RULE = ("how tuning times a candidate: on llvm targets its weights and output flushed from the CPU's "
                     "caches before each of 10 runs (its input left warm), as inside a model and as TVM's x86 tuning "
                     "recipe does; elsewhere 3 runs of at least 20 ms back to back; records measured each way are "
                     "kept apart")
COLD_RUNS = 10  # runs a candidate is timed, each after the flush (their mean is its record's time, as MetaSchedule's)


@dataclass(frozen=True)
class CandidateTiming:
    """How tuning times a candidate (``COLD_WEIGHTS_RULE``), in TVM's ``time_evaluator``'s terms: the runner, the
    untuned profile and the anchor-block seeds (when cold), and ``tools/bench_kernels.py``'s records."""

    number: int  # calls a repeat
    repeat: int
    min_repeat_ms: int
    f_preproc: str  # run before each repeat: TVM's flush, or "" (none)

    @property
    def flushed(self) -> bool:
        return bool(self.f_preproc)


# cold: each of COLD_RUNS single runs after TVM's flush of every argument but the first (the input stays warm, as
# the kernel before leaves it); warm: 3 runs back to back, repeated until they last 20 ms
COLD_TIMING = CandidateTiming(1, COLD_RUNS, 0, "cache_flush_cpu_non_first_arg")
WARM_TIMING = CandidateTiming(3, 1, 20, "")


def candidate_timing(cold: bool) -> CandidateTiming:
    return COLD_TIMING if cold else WARM_TIMING


def cold_weights(target: dict[str, Any]) -> bool:
    """Whether tuning for ``target`` (the effective one) times candidates with their weights flushed from the caches
    (``COLD_WEIGHTS_RULE``): on llvm targets for x86-64 and aarch64 (this host's, or by ``mtriple``), the CPUs whose
    flush TVM's runtime implements (``cache_flush_cpu_non_first_arg``; elsewhere it does nothing, and single runs
    would only be noisier); a GPU's weights live in its own memory."""
    return target_kind(target) == "llvm" and cpu_arch(target) in ("x86_64", "amd64", "aarch64", "arm64")
