"""What a compile takes and makes: a model's source and inputs, its precision variants, an ``Artifact``,
the tuning records it applies (``TuningSet``), a saved cost model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any



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
    """A tuning key's XGBoost cost model as the store keeps it: farm/tune/costmodel.py's bytes, their format, the samples
    it learned from."""

    body: bytes
    format: str
    samples: int


VARIANTS = ("fp32", "fp16", "int8")  # a model's precision variants (farm/models/variants.py makes them)
CALIBRATION_METHODS = ("minmax", "entropy", "percentile")  # int8 calibration; the first is the default


def split_variant(spec: str) -> tuple[str, str]:
    """``NAME@VARIANT`` as (NAME, VARIANT); a spec with no known variant after its last ``@`` is (spec, "fp32")."""
    base, _, variant = spec.rpartition("@")
    if base and variant in VARIANTS:
        return base, variant
    return spec, "fp32"
