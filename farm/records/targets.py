"""The target kinds farm knows (``TARGET_KINDS``, ``TAG_KINDS``) and the one reading of a target's kind
(``target_kind``), its description and an llvm target's CPU architecture (``cpu_arch``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


def cpu_arch(target: dict[str, Any]) -> str:
    """The CPU architecture an llvm target's code is for: its ``mtriple``'s first word, else this host's (the one
    rule: the cold-weights rule and MetaSchedule's tensor intrinsics read it)."""
    import platform

    return str(target.get("mtriple") or platform.machine()).split("-")[0].lower()
