"""Frozen records passed between farm's modules, and the target kinds farm knows. Imports nothing from farm
but the error tree (``errors.py``).

Named ``records`` rather than ``model`` so it is never confused with the ML models
that ``models/`` loads.
"""

from __future__ import annotations

import enum

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from farm.errors import InventoryError

# The TVM target kinds farm compiles for and measures: the inventory accepts these, measure/ maps each to its
# device type (a GPU kind's device type has the kind's name).
CPU_TARGETS = ("llvm", "c")  # code runs on the CPU (no GPU to fall back from; what can be a host)
GPU_TARGETS = ("cuda", "opencl", "metal", "vulkan", "rocm", "webgpu")
TARGET_KINDS = CPU_TARGETS + GPU_TARGETS
# TVM 0.27's target tags (tvm.target.list_tags(): 287) by family, each family's one kind, so a tag's kind is known
# without importing TVM (farm.compile resolves the tag itself with TVM). Families whose kind farm does not measure
# (qcom/hexagon-*, aws/trn1/*) are left out; tests/test_inventory.py checks this table against TVM's tags.
TAG_KINDS = {
    "nvidia/": "cuda", "apple/": "metal", "qcom/adreno-opencl": "opencl", "qcom/adreno-vulkan": "vulkan",
    "arm/": "llvm", "aws/cpu/": "llvm", "raspberry-pi/": "llvm", "riscv/": "llvm",
}
EXPORT_FORMATS = ("so", "tar", "system-lib")
TARGET_HINT = (f'write target = {{ kind = "llvm" }} (one of {", ".join(TARGET_KINDS)}), or a TVM tag of '
               f'{", ".join(family + "*" for family in TAG_KINDS)}, e.g. target = {{ tag = "nvidia/jetson-orin-nano" }}')


def tag_kind(tag: str) -> str | None:
    """The target kind of TVM target tag ``tag`` by its family (``TAG_KINDS``); None when farm knows no such family."""
    return next((kind for family, kind in TAG_KINDS.items() if tag.startswith(family)), None)


def target_kind(target: Mapping[str, Any]) -> str:
    """A target table's kind: its ``kind``, or the kind of its ``tag`` (``{ tag = "nvidia/jetson-tx2" }`` → cuda).

    Every target the inventory accepts has one; InventoryError for a table that has neither."""
    if "kind" in target:
        return str(target["kind"])
    tag = target.get("tag")
    if isinstance(tag, str) and (kind := tag_kind(tag)) is not None:
        return kind
    raise InventoryError(f"target {dict(target)!r} has no kind farm knows", TARGET_HINT)


def describe_target(target: Mapping[str, Any]) -> str:
    """A target as a person reads it: its kind, and its tag when it has one (``cuda (nvidia/jetson-tx2)``)."""
    kind = target_kind(target)
    return f"{kind} ({target['tag']})" if target.get("tag") else kind


class Record(Mapping):
    """Base of the read side's frozen records (a run, a verdict, an alert): attributes for code, and also
    readable by name (``r["device"]``, ``dict(r)``, JSON) for templates, tables and ``--json`` output. Its keys are
    the dataclass fields, then ``VIEWS``: properties derived from them (``steady_median_s`` of a run)."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every record is a frozen dataclass
    VIEWS: ClassVar[tuple[str, ...]] = ()

    def __getitem__(self, key: str) -> Any:
        if key not in _record_keys(type(self))[1]:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return iter(_record_keys(type(self))[0])

    def __len__(self) -> int:
        return len(_record_keys(type(self))[0])


@functools.cache
def _record_keys(cls: type[Record]) -> tuple[tuple[str, ...], frozenset[str]]:
    names = tuple(f.name for f in fields(cls)) + tuple(cls.VIEWS)
    return names, frozenset(names)


@dataclass(frozen=True)
class Alert(Record):
    """A stored verdict of one series and metric in one sweep, with its confirmation (``Store.alerts``)."""

    id: int
    created_at: str
    updated_at: str
    sweep_id: int
    device: str
    model: str
    tuned: bool
    runtime: str  # tvm, or the reference runtime whose series it judges (onnxruntime …)
    metric: str
    run_id: int
    baseline_run_id: int | None
    status: str  # candidate | improved | confirmed | rejected | unknown | ok | no-baseline | unstable
    value: float
    z: float | None
    change: float | None
    baseline: dict[str, Any] | None
    method: dict[str, Any]
    confirmation: dict[str, Any]


# a finding's triage state (findings.Finding.state): the store checks it, the CLI parses it, each from here
# new | acknowledged | invalid (a false alert) | duplicate (of another finding) | expected (an accepted change) |
# fixed | wontfix (won't fix); each change is an event with its author, note and bug (Store.triage)
TRIAGE_STATES = ("new", "acknowledged", "invalid", "duplicate", "expected", "fixed", "wontfix")


@dataclass(frozen=True)
class TrackerAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def split_address(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` as (host, port); None when it is not one (no host, blanks in it, a port outside 1-65535).
    The one reader of addresses: --tracker, --adb, the inventory's ``adb`` and ``proxy`` fields."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or any(c.isspace() for c in host) or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


@dataclass(frozen=True)
class Device:
    """One inventory entry. ``key`` is its tracker key, everywhere."""

    name: str
    kind: str
    key: str
    target: dict[str, Any]
    host: dict[str, Any] | None = None
    export: str = "so"
    cooldown_s: float = 0.0
    session_timeout_s: float = 600.0
    emulated: bool = False
    tags: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    threads: int | None = None  # devices.toml's ``threads``: TVM's CPU threads on the device (``threads_setting``)
    # devices.toml's ``weight_prepack``; None: the default for the target (``weight_prepack_setting``)
    weight_prepack: bool | None = None
    # devices.toml's ``layout``; None: the default for the target (``layout_setting``)
    layout: str | None = None
    lab_host: str | None = None  # devices.toml's ``lab_host``: the host it is attached to, whose ``farm worker`` serves it


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


# Device-minutes a sweep's confirmation may spend by default (findings' representatives, in rank order). One
# representative costs 8 rounds × (a fresh session, two loads, 2 × 5 repeats): ~1 device-minute for a 10 ms model
# (bench_detect's --round-s), 16 rounds when inconclusive. 30 device-minutes confirm ~10 findings × 3
# representatives in a night. Here, not in ``findings``, so every command's --help reads it without importing scipy.
DEFAULT_BUDGET_MIN = 30.0

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


def cpu_arch(target: dict[str, Any]) -> str:
    """The CPU architecture an llvm target's code is for: its ``mtriple``'s first word, else this host's (the one
    rule: the cold-weights rule and MetaSchedule's tensor intrinsics read it)."""
    import platform

    return str(target.get("mtriple") or platform.machine()).split("-")[0].lower()


@dataclass(frozen=True)
class HostCPU:
    """This host's CPU as a device kind's target rules need it: LLVM's name for it (None when LLVM does not
    know it) and its core count."""

    cpu: str | None
    cores: int


@dataclass(frozen=True)
class Inventory:
    path: str
    tracker: TrackerAddress
    devices: dict[str, Device]
    db: str | None = None  # [store] db: the results database shared by the farm's hosts
    # [tracker] lab_hosts: each lab host's address; when given, the tracker takes registrations only from where
    # each key's server runs (``rpc.registrations``: a rogue server cannot register under a device's key)
    lab_hosts: dict[str, str] | None = None
    dashboard_url: str | None = None  # [dashboard] url: where the lab's farm dashboard is read (digests link to it)
    triage_token_file: str | None = None  # [dashboard] token_file: the lab's triage token (FARM_TRIAGE_TOKEN overrides)
    notify_url: str | None = None  # [notify] url: the webhook a night's digest is POSTed to when it has new findings


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ModelSource:
    """A model ready to compile: its file's bytes, digest and input signature."""

    name: str
    origin: str  # "builtin:mlp", a file path, or "module:factory"
    digest: str  # sha256 of ``data``
    data: bytes = field(repr=False)  # an ONNX model, or a torch.export program (.pt2) when frontend == "torch"
    inputs: tuple[InputSpec, ...]
    variant: str = "fp32"  # fp32 | fp16 | int8
    base_onnx: bytes = field(default=b"", repr=False)  # the fp32 model a variant is checked against
    frontend: str = "onnx"  # onnx | torch
    ops: tuple[str, ...] = ()  # the operator types of its graph (models.sources.graph_ops; () = not known)
    # what the model is for a sweep (``identity_digest``), where not its bytes' digest: a ``module:factory`` model's
    # exported bytes change with torch's version and unseeded initializers, so its module file's digest, the factory's
    # name and its shapes (``models.frameworks.factory_identity``); a variant's, its base's identity and the variant
    identity: str = ""

    @property
    def identity_digest(self) -> str:
        """What a sweep's spec records and a worker checks (#61): the same identity, the same model."""
        return self.identity or self.digest


@dataclass(frozen=True)
class Artifact:
    """A compiled, exported model for one target."""

    cache_key: str
    path: str
    model_name: str
    model_digest: str
    target: dict[str, Any]  # effective target, host included, as TVM exports it
    export: str
    toolchain: str
    tvm_version: str
    file_digest: str
    build_s: float
    cached: bool = False
    tuning_digest: str = ""  # digest of the tuning records compiled in ('' = untuned)
    tuned_tasks: int = 0  # tasks that received a record
    anchor_tasks: int = 0  # of those, tasks whose record is another task's of the same anchor block (a conv with
    # another epilogue: compile.apply_records)
    total_tasks: int = 0
    pipeline_version: int = 0  # how farm lowered it (compile.PIPELINE_VERSION); 0 = not known
    # planned memory, read from the module Relax's pipeline built (compile.planned_memory); None = not known
    params_bytes: int | None = None  # the constants the executable holds (weights), each tensor once
    planned_host_bytes: int | None = None  # Relax memory planning's storage allocations (alloc_storage, static
    planned_device_bytes: int | None = None  # shapes) in host memory and in the target's device (GPU) memory
    planned_dynamic: int = 0  # storage allocations of dynamic size, not in the sums above
    # each kernel (PrimFunc) of the built module by name: {"args": [...], "flops": N | None, "schedule": ...}, what a
    # profile names beside its time (compile.kernel_facts); {} = not known (built before farm read it)
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict, hash=False, compare=False)
    # what built it, as a run's manifest names it (farm.manifest: TVM's build, LLVM, the compiler, the records applied);
    # {} = not known (built before farm read it)
    built_with: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class TuningSet:
    """MetaSchedule database lines for one tuning key (device target + TVM version); ``sessions``: the tuning session
    that added each record line, where known (() or None: not known)."""

    key: str
    workloads: tuple[str, ...]
    records: tuple[str, ...]
    sessions: tuple[int | None, ...] = ()

    @property
    def digest(self) -> str:
        import hashlib

        return hashlib.sha256("\n".join(self.workloads + ("--",) + self.records).encode()).hexdigest()


@dataclass(frozen=True)
class SavedCostModel:
    """A tuning key's XGBoost cost model as the store keeps it: farm/costmodel.py's bytes, their format, the samples
    it learned from."""

    body: bytes
    format: str
    samples: int


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


VARIANTS = ("fp32", "fp16", "int8")  # a model's precision variants (farm/models/variants.py makes them)
CALIBRATION_METHODS = ("minmax", "entropy", "percentile")  # int8 calibration; the first is the default


def split_variant(spec: str) -> tuple[str, str]:
    """``NAME@VARIANT`` as (NAME, VARIANT); a spec with no known variant after its last ``@`` is (spec, "fp32")."""
    base, _, variant = spec.rpartition("@")
    if base and variant in VARIANTS:
        return base, variant
    return spec, "fp32"


OFFLINE_ATTEMPT = 0  # a sweep cell stored failed because no server of its key was registered: not a measured attempt
RETRYABLE_STEPS = ("session", "upload", "load", "first", "steady", "copy")  # a dropped session, not a wrong output


@dataclass(frozen=True)
class StoredAttempt:
    """One stored TVM attempt of a sweep's cell (``Store.sweep_attempts``): its number, status and failed step. A
    cell's attempt is stored whole with its fallback and reference runs (``Store.record_cell``), so an attempt
    here has all of them."""

    attempt: int
    status: str
    failed_step: str | None = None

    @property
    def final(self) -> bool:
        """Measuring the cell again cannot change it: ok, or failed at a step no retry helps (a compile, a wrong
        output, a farm bug), unlike a dropped session or a device offline."""
        return self.status == "ok" or (self.attempt != OFFLINE_ATTEMPT and self.failed_step not in RETRYABLE_STEPS)


@dataclass(frozen=True)
class Lease:
    """A device held for one lab cell (``Store.take_lease``): by ``holder`` (worker and job), under ``epoch`` (one
    more at each new holder). ``previous``: the holder it was taken from after that one went silent without
    releasing it (a frozen or killed worker), which may still hold the device's RPC session; '' otherwise."""

    device: str
    holder: str
    epoch: int
    previous: str = ""

    @property
    def taken_over(self) -> bool:
        return bool(self.previous)


@dataclass(frozen=True)
class RunToStore:
    """One run of a cell's unit, before it is stored (``Store.record_cell``): its result, where and what it ran,
    its artifact (None: a reference runtime's, or nothing built), and the cell's attempt it belongs to."""

    result: "BenchResult"
    device: "Device"
    model: "ModelSource"
    artifact: "Artifact | None"
    attempt: int = 1


@dataclass(frozen=True)
class SweepBuild:
    """What a queued sweep's build job made for a cell (``Store.sweep_builds``, schema 18): its artifact's cache key,
    or the build's error and hint; which worker built it, and in how long."""

    cache_key: str | None
    error: str | None
    builder: str
    build_s: float | None = None
    hint: str | None = None


class CellStanding(enum.StrEnum):
    """Where a sweep's cell stands (``SweepSpec.standing``): what ``farm sweep`` reports and ``--resume`` redoes."""

    OK = "ok"
    FAILED = "failed"  # failed for good: at a step no retry helps, or its retries spent (--resume leaves it)
    RETRY = "failed, retries left"  # --resume measures it again
    OFFLINE = "offline"  # only stored while its device or lab host was unreachable (--resume measures it)
    NEVER = "never measured"  # nothing stored (a killed sweep or worker: --resume measures it)

    @property
    def redone(self) -> bool:
        return self in (CellStanding.RETRY, CellStanding.OFFLINE, CellStanding.NEVER)


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep measures. Stored with the sweep, so ``--resume`` needs nothing else."""

    devices: tuple[str, ...]
    models: tuple[str, ...]
    reference: str | None = "mlp"  # measured first on every device, every sweep: tells drift from regressions
    config: BenchConfig = BenchConfig()
    retries: int = 1
    tuned: bool = True
    variants: tuple[str, ...] = ("fp32",)  # a sweep axis: each model in each variant
    shapes: dict = field(default_factory=dict)  # model -> {input name: shape}, for dynamic or overridden inputs
    # model as the spec names it -> the name its runs carry (``dyn`` for ``/models/dyn.onnx``); set by run_sweep
    stored_names: dict = field(default_factory=dict)
    reference_runtime: bool = True  # also time each cell's model in its reference runtime where the device runs one
    # devices and models whose cells are profiled (a sweep file's profile = ["mate10", "resnet50"]); every cell when
    # config.profile is set
    profile_cells: tuple[str, ...] = ()
    # model as the spec names it -> its ``ModelSource.identity_digest`` when the sweep started (set by run_sweep): a
    # cell measures that model or is stored failed "model changed since the sweep started" ({}: a sweep from before)
    model_digests: dict = field(default_factory=dict)

    def cell_models(self) -> tuple[str, ...]:
        ref = (self.reference,) if self.reference else ()
        names = [m if v == "fp32" else f"{m}@{v}" for m in self.models for v in self.variants]
        return ref + tuple(dict.fromkeys(n for n in names if n != self.reference))

    def shapes_of(self, name: str) -> dict[str, tuple[int, ...]] | None:
        """The input shapes the spec gives a cell's model (``mlp@fp16``: its base's), None when it gives none."""
        return self.shapes.get(split_variant(name)[0])

    def cells(self) -> list[tuple[str, str]]:
        """Every (device, model) cell in sweep order; models carry their variant (``mlp@fp16``)."""
        return [(device, model) for device in self.devices for model in self.cell_models()]

    def cell_done(self, attempts: list[StoredAttempt]) -> bool:
        """A cell is done when an attempt is final (ok, or failed where no retry helps: a redelivered compile
        failure is not compiled again) or its retries are spent."""
        return not self.standing(attempts).redone

    def standing(self, attempts: list[StoredAttempt]) -> CellStanding:
        if any(a.status == "ok" for a in attempts):
            return CellStanding.OK
        if any(a.final for a in attempts) or self.attempts_spent(attempts) > self.retries:
            return CellStanding.FAILED
        if self.attempts_spent(attempts):
            return CellStanding.RETRY
        return CellStanding.OFFLINE if attempts else CellStanding.NEVER

    @staticmethod
    def attempts_spent(attempts: list[StoredAttempt]) -> int:
        """The measured attempts among a cell's stored ones: a cell stored while its device was offline
        (attempt ``OFFLINE_ATTEMPT``) spent none of its retries."""
        return sum(1 for a in attempts if a.attempt != OFFLINE_ATTEMPT)

    def by_cell(self, attempts: dict[tuple[str, str], list]) -> dict[tuple[str, str], list]:
        """A sweep's stored attempts (``Store.sweep_attempts``: by device and stored model name) by cell as the spec
        names it. Also drops what is no cell (a GPU device's CPU fallback, ``NAME@cpu``)."""
        return {(d, m): attempts.get((d, self.stored_names.get(m, m)), []) for d, m in self.cells()}

    def to_json(self) -> dict:
        return {**asdict(self), "config": asdict(self.config)}

    @staticmethod
    def from_json(data: dict) -> "SweepSpec":
        return SweepSpec(devices=tuple(data["devices"]), models=tuple(data["models"]), reference=data["reference"],
                         config=BenchConfig(**data["config"]), retries=data["retries"], tuned=data["tuned"],
                         variants=tuple(data.get("variants", ("fp32",))),
                         shapes={m: {k: tuple(v) for k, v in d.items()} for m, d in data.get("shapes", {}).items()},
                         stored_names=dict(data.get("stored_names", {})),
                         model_digests=dict(data.get("model_digests", {})),
                         reference_runtime=data.get("reference_runtime", True),
                         profile_cells=tuple(data.get("profile_cells", ())))


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
