"""Compile models with Relax for a device's target and export them; cache the artifacts.

One of the few packages that touch TVM's compiler. The cache key covers everything
that changes the artifact: model digest, effective target (host included), export
format, toolchain and TVM version.

    targets.py     the effective target (tags resolved, the kind's rules, host_cpu), fallback_device,
                   make_target, the toolchain (toolchain_for, CROSS_CC) and export_library
    keys.py        tuning_key, device_tuning_key, key_before_threads, artifact_key;
                   TVM_VERSION, PIPELINE_VERSION, RECORD_MATCH
    frontends.py   import_model (ONNX, torch, TFLite); tuning_module (device_tuning_module: a device's
                   settings), the module MetaSchedule sees, its convolutions NHWC where asked (channels_last),
                   and fold_weight_prepack, the weights' repacking folded after the records (weight prepacking)
    kernels.py     copy_per_input: fused kernels TVM lowers in a form no CPU schedule makes fast, rewritten
    schedules.py   tuning records into a compile: record_databases, apply_records, untuned_trace, is_schedule
    memory.py      planned_memory, from the Relax module the build produced (BuiltModule)
    build.py       compile_model: build (tuned or not), export, cache (planned_key: its key before it
                   is built); artifact_file and install_artifact, an
                   artifact carried to another host (the lab's store); main_calls, read from an exported library
    artifacts.py   what is inside an exported artifact, from its bytes (no TVM): formats, arches, device code
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# ruff: noqa: F401 (the block below re-exports names for type checkers only)
if TYPE_CHECKING:  # the names as the modules define them, for type checkers
    from farm.compile.build import (EXPORT_SUFFIX, artifact_file, compile_model, install_artifact, main_calls,
                                    planned_key)
    from farm.compile.frontends import (channels_last, device_tuning_module, fold_weight_prepack, import_model,
                                        import_onnx, prepack_calls, tuning_module)
    from farm.compile.keys import (PIPELINE_VERSION, RECORD_MATCH, TVM_VERSION, artifact_key, device_tuning_key,
                                   key_before_threads, tuning_key)
    from farm.compile.memory import ALLOC_STORAGE, BuiltModule, planned_memory
    from farm.compile.schedules import LOOKUP_INSTRUCTIONS, apply_records, is_schedule, record_databases, untuned_trace
    from farm.compile.targets import (ANDROID_CPU_TAGS, CROSS_CC, TAG_HOSTS, effective_target, export_library,
                                      fallback_device, host_cpu, make_target, toolchain_for)

# Each name and the module that defines it, imported when first asked for: a host that runs artifacts compiled
# elsewhere has TVM's runtime alone (tvm_private.runtime_only_env: no Relax, no compiler), and still finds a cached
# artifact (planned_key, compile_model's cache) and a device's effective target without importing the compiler.
_EXPORTS = {
    "build": ("EXPORT_SUFFIX", "artifact_file", "compile_model", "install_artifact", "main_calls", "planned_key"),
    "frontends": ("channels_last", "device_tuning_module", "fold_weight_prepack", "import_model", "import_onnx",
                  "prepack_calls", "tuning_module"),
    "keys": ("PIPELINE_VERSION", "RECORD_MATCH", "TVM_VERSION", "artifact_key", "device_tuning_key",
             "key_before_threads", "tuning_key"),
    "memory": ("ALLOC_STORAGE", "BuiltModule", "planned_memory"),
    "schedules": ("LOOKUP_INSTRUCTIONS", "apply_records", "is_schedule", "record_databases", "untuned_trace"),
    "targets": ("ANDROID_CPU_TAGS", "CROSS_CC", "TAG_HOSTS", "effective_target", "export_library", "fallback_device",
                "host_cpu", "make_target", "toolchain_for"),
}
_OWNER = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_OWNER)


def __getattr__(name: str) -> Any:
    if name not in _OWNER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_OWNER[name]}"), name)
    globals()[name] = value
    return value
