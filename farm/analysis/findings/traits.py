"""What farm knows of a series' device and model, as traits a finding can name a set by. No TVM, no database.

Devices: their kind (``devices.toml``'s ``kind``), their target's kind (``records.target_kind``: a tag's family
counts) and their ``tags`` (a SoC, a rack: whatever the inventory says), from the store's ``devices`` table, else
from the run's context. Models (by label: ``stats.model_label``): each operator type their graph contains
(``ModelSource.ops``, the store's ``models.ops``; a grouped convolution is ``DepthwiseConv``), their variant
(fp32 | fp16 | int8), whether tuning records were compiled in, and the runtime of a reference series.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping

from farm.records import Device, split_variant, tag_kind
from farm.stats import model_label

if TYPE_CHECKING:
    from farm.analysis.runs import Run

# the order a side is named in when two traits name the same members: the broadest fact first
ORDER = ("kind", "target kind", "tag", "runtime", "variant", "tuning", "op")


@dataclass(frozen=True)
class Trait:
    """A fact about a device (``side`` device: kind, target kind, tag) or a model (model: op, variant, tuning,
    runtime)."""

    side: str
    name: str
    value: str

    @property
    def order(self) -> tuple[int, str]:
        return ORDER.index(self.name), self.value

    def words(self, count: str) -> str:
        """The members it names, in a sentence: "models with DepthwiseConv (6/25)", "devices of target kind opencl
        (8/40)"; ``count`` is the "(6/25)"."""
        if self.side == "device":
            if self.name == "tag":
                return f"devices tagged {self.value} {count}"
            return f"devices of {self.name} {self.value} {count}"
        if self.name == "op":
            return f"models with {self.value} {count}"
        if self.name == "runtime":
            return f"{self.value} series {count}"
        return f"{self.value} models {count}"  # variant (int8 models), tuning (tuned models)


def device_traits(device: Device | None, run: "Run | None") -> frozenset[Trait]:
    """A device's traits: from its stored record (``Store.devices``), else what its run's context says."""
    found = set()
    kind = device.kind if device else (run.context.get("device_kind") if run else None)
    target = device.target if device else (run.context.get("target") if run else None)
    if kind:
        found.add(Trait("device", "kind", str(kind)))
    if isinstance(target, dict) and (named := target.get("kind") or tag_kind(str(target.get("tag", "")))):
        found.add(Trait("device", "target kind", str(named)))
    found.update(Trait("device", "tag", str(tag)) for tag in (device.tags if device else ()))
    return frozenset(found)


def model_traits(model: str, tuned: bool, runtime: str, ops: Iterable[str]) -> frozenset[Trait]:
    found = {Trait("model", "op", op) for op in ops}
    found.add(Trait("model", "variant", split_variant(model)[1]))
    if runtime == "tvm":
        found.add(Trait("model", "tuning", "tuned" if tuned else "untuned"))
    found.add(Trait("model", "runtime", runtime))
    return frozenset(found)


@dataclass(frozen=True)
class SeriesTraits:
    """Device name → its traits; model label → its traits."""

    devices: Mapping[str, frozenset[Trait]]
    models: Mapping[str, frozenset[Trait]]


NO_TRAITS = SeriesTraits({}, {})


def series_traits(runs: Iterable["Run"], devices: Mapping[str, Device],
                  model_ops: Mapping[str, tuple[str, ...]]) -> SeriesTraits:
    """The traits of every device and model label of ``runs``."""
    of_device: dict[str, frozenset[Trait]] = {}
    of_model: dict[str, frozenset[Trait]] = {}
    for run in runs:
        if run.device not in of_device:
            of_device[run.device] = device_traits(devices.get(run.device), run)
        label = model_label(run.model, run.tuned, run.runtime)
        if label not in of_model:
            of_model[label] = model_traits(run.model, run.tuned, run.runtime, model_ops.get(run.model, ()))
    return SeriesTraits(of_device, of_model)
