"""A sweep's records: its spec (``SweepSpec``: devices, models, cells), a cell's standing and stored
attempts, a device's lease, a run handed to the store, a queued build, and the confirmation's default budget."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field

from farm.records.builds import Artifact, ModelSource, split_variant
from farm.records.device import Device
from farm.records.measurement import BenchConfig, BenchResult


# Device-minutes a sweep's confirmation may spend by default (findings' representatives, in rank order). One
# representative costs 8 rounds × (a fresh session, two loads, 2 × 5 repeats): ~1 device-minute for a 10 ms model
# (bench_detect's --round-s), 16 rounds when inconclusive. 30 device-minutes confirm ~10 findings × 3
# representatives in a night. Here, not in ``findings``, so every command's --help reads it without importing scipy.
DEFAULT_BUDGET_MIN = 30.0


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
