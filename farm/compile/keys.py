"""The keys that say when a tuning record or an artifact is valid: ``tuning_key`` (effective target, TVM version,
threads, weight prepacking, layout, how candidates were timed) and ``artifact_key`` (everything that changes the
artifact), and the versions they hold."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import tvm

from farm.compile.targets import effective_target
from farm.records import Device, ModelSource, cold_weights, layout_setting, threads_setting, weight_prepack_setting

TVM_VERSION: str = tvm.__version__  # part of every tuning key and artifact key (for modules that import no TVM)
# bump when farm changes how it lowers models (2: records applied without re-fusion; 3: CPU weight prepacking,
# records.PREPACK_RULE, where the device's weight_prepack is on; 4: convolutions NHWC, records.LAYOUT_RULE, by default
# on llvm targets; 5: ONNX's Sum as adds before the NHWC conversion, so resnet50 converts; 6: batch norms folded into
# the convolutions before them, frontends.for_inference; 7: in NHWC, output channels padded to whole vectors,
# frontends.whole_vectors; 8: on CPUs, a concatenation alone as one copy per input, kernels.copy_per_input;
# 9: prepacked weights' dead tuples dropped, frontends.fold_weight_prepack; 10: output channels padded to whole
# pairs of vectors where that costs little, frontends.PAIR_WASTE)
PIPELINE_VERSION = 10
# how a compile finds a function's record: its own, else one of the same anchor block (part of a tuned artifact's key)
RECORD_MATCH = "exact, else anchor-block"


def tuning_key(target: dict[str, Any], threads: int | None, weight_prepack: bool = False, tvm: str = TVM_VERSION,
               layout: str = "model", cold: bool | None = None) -> str:
    """Tuning records are valid for one effective target, TVM version and thread count: MetaSchedule ignores the
    target, and a candidate ranked on 1 thread is not the best on 2 (``records.THREADS_RULE``: the runner's sessions
    run on the device's setting). With weight prepacking (``records.PREPACK_RULE``) the tasks are other workloads
    (functions with layout-free weights, renamed), so its records are kept apart; without it the key is the one
    records had before the setting existed (pipeline 2), and those still apply to a device that turns it off.
    ``tvm``: another TVM version's key for the same settings (what a TVM upgrade may replay). A ``layout`` other
    than the model's own (``records.LAYOUT_RULE``) makes other workloads too; the model's own keeps the key it had
    before the setting existed. Candidates timed with their weights flushed from the caches (``cold``, by default
    ``records.cold_weights`` of the target: llvm targets, ``records.COLD_WEIGHTS_RULE``) rank otherwise than timed
    back to back, so those records are kept apart too (``cold=False``: the key llvm records had before)."""
    prepack = {"weight_prepack": True} if weight_prepack else {}
    flushed = {"cold_weights": True} if (cold_weights(target) if cold is None else cold) else {}
    return _short_hash({"target": target, "tvm": tvm, "threads": threads, **prepack, **_converted(layout), **flushed})


def _converted(layout: str) -> dict[str, str]:
    """A key's layout field: none for the model's own, so keys from before the setting stay as they were."""
    return {"layout": layout} if layout != "model" else {}


def _short_hash(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def device_tuning_key(device: Device, target: dict[str, Any] | None = None) -> str:
    """``device``'s tuning key: its effective target (``target``, where the caller has it) and settings."""
    target = target or effective_target(device)
    return tuning_key(target, threads_setting(device, target), weight_prepack_setting(device, target),
                      layout=layout_setting(device, target))


def key_before_threads(target: dict[str, Any]) -> str:
    """The tuning key farm used before it set threads (schema 13 and older: target and TVM version only). Records
    under it were measured on TVM's default thread count (half the CPUs on x86) and no longer apply."""
    return _short_hash({"target": target, "tvm": TVM_VERSION})


def artifact_key(model: ModelSource, device: Device, target: dict[str, Any], toolchain: str, tuning_digest: str = "",
                 device_code: str = "") -> str:
    """Everything that changes the artifact; a tuned one also how its records are found (``RECORD_MATCH``),
    whether its weights are prepacked and its convolutions' layout, where not the model's (an untuned compile never
    prepacks nor converts: nothing chose a layout). ``device_code``: the compiler of a CUDA target's device code
    (``compile.cuda.CudaCompiler.label``; absent from other keys, so theirs stay as they were)."""
    tuned: dict[str, Any] = {}
    if tuning_digest:
        tuned = {"record_match": RECORD_MATCH, "weight_prepack": weight_prepack_setting(device, target),
                 **_converted(layout_setting(device, target))}
    blob = json.dumps(
        {"model": model.digest, "target": target, "export": device.export, "toolchain": toolchain,
         "tvm": TVM_VERSION, "pipeline": PIPELINE_VERSION, "tuning": tuning_digest, **tuned,
         **({"device_code": device_code} if device_code else {})},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()
