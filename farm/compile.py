"""Compile models with Relax for a device's target and export them; cache the artifacts.

One of the few modules that touch TVM's compiler. The cache key covers everything
that changes the artifact: model digest, effective target (host included), export
format, toolchain and TVM version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import tvm
from tvm import relax
from tvm.target import codegen

from farm.devices import kind_of, kinds
from farm.errors import BuildError, message_line
from farm.models import onnx_proto
from farm.records import Artifact, Device, HostCPU, ModelSource, TuningSet, target_kind

log = logging.getLogger(__name__)

TVM_VERSION: str = tvm.__version__  # part of every tuning key and artifact key (for modules that import no TVM)
PIPELINE_VERSION = 2  # bump when farm changes how it lowers models (2: records applied without re-fusion)
# how a compile finds a function's record: its own, else one of the same anchor block (part of a tuned artifact's key)
RECORD_MATCH = "exact, else anchor-block"
EXPORT_SUFFIX = {"so": ".so", "tar": ".tar", "system-lib": ".tar"}  # iOS .so is a dylib by content
CROSS_CC = {"aarch64-linux-gnu": "aarch64-linux-gnu-g++", "arm-linux-gnueabihf": "arm-linux-gnueabihf-g++"}


# Tags whose host TVM 0.27 gets wrong or leaves out (checked against tvm.target.list_tags()).
TAG_HOSTS = {
    "nvidia/jetson-nano": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a57"},
    "nvidia/jetson-tx1": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a57"},
    "nvidia/jetson-tx2": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a57"},
    "nvidia/jetson-orin-nano": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a78"},  # tag says carmel
}
# arm/* phone tags use the arm64-linux-android triple, which TVM does not treat as aarch64.
ANDROID_CPU_TAGS = ("arm/mate10", "arm/pixel2")


def host_cpu() -> str | None:
    """The host CPU as LLVM names it (TVM 0.27 refuses ``mcpu=native``)."""
    cpu = codegen.llvm_get_system_cpu()
    triple = codegen.llvm_get_system_triple()
    return cpu if cpu and codegen.llvm_is_valid_cpu(cpu, triple) else None


def _tag_export(target: dict[str, Any]) -> dict[str, Any]:
    """What TVM's tag ``target["tag"]`` stands for, as TVM exports it."""
    tag = target["tag"]
    tags = tvm.target.list_tags()
    if tag not in tags:
        known = ", ".join(sorted(t for t in tags if "/" in t))
        raise BuildError(f"TVM 0.27 has no target tag {tag!r}", f"known tags: {known}")
    if set(target) - {"tag"}:
        raise BuildError(f"target tag {tag!r} takes no other fields ({', '.join(sorted(set(target) - {'tag'}))})",
                         "write the full target table instead, or set host = { ... } on the device")
    return json.loads(str(tags[tag]))


def _resolve_host_tag(host: dict[str, Any]) -> dict[str, Any]:
    """A host given by tag (``host = { tag = "arm/rasp4b" }``) as the table it stands for (kind, triple, CPU,
    features), so the toolchain follows its triple."""
    exported = _tag_export(host)
    if host["tag"] in ANDROID_CPU_TAGS:
        return {"kind": "llvm", "mtriple": "aarch64-linux-android", "mattr": exported.get("mattr", ["+neon"])}
    return {k: exported[k] for k in ("kind", "mtriple", "mcpu", "mattr") if k in exported}


def _resolve_tag(target: dict[str, Any]) -> dict[str, Any]:
    tag = target["tag"]
    exported = _tag_export(target)
    if tag in ANDROID_CPU_TAGS:
        return {"kind": "llvm", "mtriple": "aarch64-linux-android", "mattr": exported.get("mattr", ["+neon"])}
    resolved = {"tag": tag, "kind": exported["kind"]}
    if tag in TAG_HOSTS:
        resolved["host"] = dict(TAG_HOSTS[tag])
    elif isinstance(exported.get("host"), dict):
        host = exported["host"]
        resolved["host"] = {k: host[k] for k in ("kind", "mtriple", "mcpu", "mattr") if k in host}
    return resolved


def effective_target(device: Device) -> dict[str, Any]:
    """The target farm compiles for: tags resolved, then the device kind's rules (host CPU for devices on
    this host, hosts of GPU targets, the device's own ``host``)."""
    target = _resolve_tag(device.target) if "tag" in device.target else dict(device.target)
    if device.host is not None and "tag" in device.host:
        device = dataclasses.replace(device, host=_resolve_host_tag(device.host))
    return kind_of(device).effective_target(device, target, HostCPU(host_cpu(), os.cpu_count() or 1))


def fallback_device(device: Device) -> Device:
    """The device's CPU as a device of its own: same server (key), its host target, named ``NAME@cpu``.

    What a GPU device with ``fallback = "cpu"`` runs a model on when its GPU fails the model."""
    host = effective_target(device).get("host") or {"kind": "llvm"}
    options = {k: v for k, v in device.options.items() if k != "fallback"}
    return dataclasses.replace(device, name=f"{device.name}@cpu", target=dict(host), host=None, options=options,
                               tags=(*device.tags, "fallback"))


def make_target(target: dict[str, Any]) -> tvm.target.Target:
    try:
        if "tag" in target:
            return tvm.target.Target(target["tag"], host=target.get("host"))
        spec = {k: v for k, v in target.items() if k != "host"}
        return tvm.target.Target(spec, host=target.get("host"))
    except Exception as exc:
        raise BuildError(
            f"TVM refused target {json.dumps(target)}: {message_line(exc)}",
            "fix target/host in devices.toml; options are those of `tvm.target.Target` for that kind",
        ) from exc


def _triple(target: dict[str, Any]) -> str | None:
    host = target.get("host") or (target if target_kind(target) == "llvm" else {})
    return host.get("mtriple")


def toolchain_for(device: Device, target: dict[str, Any]) -> str:
    """The compiler that links the exported library: '' = TVM's default host cc, or none needed (tar).

    The device's ``cc``, else TVM's cc on x86, else the toolchain of the platform a kind owns
    (``DeviceKind.export_toolchain``: Android's NDK, Xcode), else a cross g++ by triple."""
    if device.export != "so":
        return ""  # tar and system-lib exports are object files: linked later, into the app or on the device
    if "cc" in device.options:
        return str(device.options["cc"])
    triple = _triple(target)
    if triple is None or triple.startswith("x86_64"):
        return ""
    own = kind_of(device)
    for kind in (own, *(k for k in kinds().values() if k is not own)):  # a platform's toolchain is its kind's
        if (toolchain := kind.export_toolchain(device, triple)) is not None:
            return toolchain
    for prefix, cc in CROSS_CC.items():
        if triple.startswith(prefix.split("-")[0]) and "linux" in triple:
            if shutil.which(cc) is None:
                raise BuildError(f"cross compiler {cc} for {triple} is not installed (device {device.name!r})",
                                 f"install it: apt-get install g++-{prefix}, or set cc in devices.toml")
            return cc
    raise BuildError(
        f"no cross compiler known for {triple} (device {device.name!r})",
        'set cc = "path/to/cross-g++" on the device in devices.toml',
    )


def export_library(module, path: str, toolchain: str) -> None:
    """Write ``module`` (an executable, or a tuning candidate) to ``path`` as the device loads it, linked by
    ``toolchain`` (``toolchain_for``): Xcode's dylib for iOS, a cross compiler, or TVM's host cc ('')."""
    if toolchain == "xcode":
        from tvm.support import xcode

        module.export_library(path, fcompile=xcode.create_dylib, arch="arm64", sdk="iphoneos")
    elif toolchain:
        from tvm.support import cc

        module.export_library(path, fcompile=cc.cross_compiler(toolchain))
    else:
        module.export_library(path)


def tuning_key(target: dict[str, Any]) -> str:
    """Tuning records are valid for one effective target and TVM version (MetaSchedule ignores the target)."""
    blob = json.dumps({"target": target, "tvm": TVM_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def artifact_key(model: ModelSource, device: Device, target: dict[str, Any], toolchain: str, tuning_digest: str = "") -> str:
    blob = json.dumps(
        {"model": model.digest, "target": target, "export": device.export, "toolchain": toolchain,
         "tvm": TVM_VERSION, "pipeline": PIPELINE_VERSION, "tuning": tuning_digest,
         **({"record_match": RECORD_MATCH} if tuning_digest else {})},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def tuning_module(model: ModelSource) -> tvm.IRModule:
    """The module MetaSchedule sees: the "zero" pipeline first, or extract_tasks finds nothing.

    Tuning and tuned compilation both start from this, so workloads match."""
    return relax.get_pipeline("zero")(import_model(model))


def compile_model(model: ModelSource, device: Device, cache_dir: Path, tuning: TuningSet | None = None) -> Artifact:
    """Return the cached artifact for (model, device target, tuning records) or build and export it."""
    target = effective_target(device)
    toolchain = toolchain_for(device, target)
    if tuning is not None and not tuning.records:
        tuning = None
    key = artifact_key(model, device, target, toolchain, tuning.digest if tuning else "")
    folder = Path(cache_dir) / key[:24]
    meta_path = folder / "artifact.json"
    if meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
            if "params_bytes" not in meta:  # written before farm read planned memory: built again to read it
                log.info("rebuilding %s: its metadata has no planned memory", meta_path)
            elif Path(meta["path"]).exists() and _digest(Path(meta["path"])) == meta["file_digest"]:
                # the key includes the pipeline version: metadata written before it was recorded has this one
                return Artifact(**{"pipeline_version": PIPELINE_VERSION, **meta, "cached": True})
        except (ValueError, KeyError, TypeError):
            log.warning("rebuilding: unreadable artifact metadata %s", meta_path)
    start = time.perf_counter()
    tvm_target = make_target(target)
    tuned_tasks = total_tasks = anchor_tasks = 0
    built = _BuiltModule()
    try:
        with tvm.transform.PassContext(instruments=[built]):
            if tuning is not None:
                executable, tuned_tasks, total_tasks, anchor_tasks = _compile_tuned(
                    model, tvm_target, tuning, device.export == "system-lib")
            elif device.export == "system-lib":
                executable = relax.build(import_model(model), tvm_target, system_lib=True)
            else:
                executable = tvm.compile(import_model(model), tvm_target)
    except BuildError:
        raise
    except Exception as exc:
        raise BuildError(f"TVM could not compile {model.name} for {json.dumps(target)}: {message_line(exc)}",
                         "check the target; GPU targets need a schedule (see README)") from exc
    memory: dict[str, int] = {}
    try:  # a side figure: an IR shape planned_memory does not know is a warning and "not known", never a failed build
        memory = planned_memory(built.module, "gpu" in tvm_target.keys) if built.module is not None else {}
    except Exception as exc:
        log.warning("planned memory of %s not known: %s", model.name, message_line(exc))
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    filename = f"{_safe(model.name)}{EXPORT_SUFFIX[device.export]}"
    try:
        export_library(executable, str(tmp / filename), toolchain)
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BuildError(f"exporting {model.name} as {device.export} failed: {message_line(exc)}",
                         f"check that the toolchain {toolchain or 'cc'} is installed and works") from exc
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    path = folder / filename
    artifact = Artifact(
        cache_key=key, path=str(path), model_name=model.name, model_digest=model.digest, target=target,
        export=device.export, toolchain=toolchain or "default", tvm_version=TVM_VERSION,
        file_digest=_digest(path), build_s=time.perf_counter() - start,
        tuning_digest=tuning.digest if tuning else "", tuned_tasks=tuned_tasks, total_tasks=total_tasks,
        anchor_tasks=anchor_tasks, pipeline_version=PIPELINE_VERSION, params_bytes=memory.get("params_bytes"),
        planned_host_bytes=memory.get("planned_host_bytes"), planned_device_bytes=memory.get("planned_device_bytes"),
        planned_dynamic=memory.get("planned_dynamic", 0),
    )
    meta_path.write_text(json.dumps({k: v for k, v in asdict(artifact).items() if k != "cached"}, indent=2))
    return artifact


@tvm.instrument.pass_instrument
class _BuiltModule:
    """Keeps the last module with Relax functions that an outermost pass returned: the Relax pipeline's output,
    which the VM code generator turns into the executable (the TIR passes that follow see PrimFuncs only).
    Observed, not chosen: TVM picks the pipeline (a GPU target's own, with DLight) as it always does."""

    def __init__(self) -> None:
        self.depth = 0
        self.module: tvm.IRModule | None = None

    def run_before_pass(self, mod, info) -> None:
        self.depth += 1

    def run_after_pass(self, mod, info) -> None:
        self.depth -= 1
        if self.depth == 0 and any(isinstance(f, relax.Function) for f in mod.functions.values()):
            self.module = mod


ALLOC_STORAGE = {"relax.vm.alloc_storage": (1, 2), "relax.memory.alloc_storage": (1, 3)}  # op -> (device, dtype) args


def planned_memory(mod: tvm.IRModule, gpu: bool) -> dict[str, int]:
    """What the built module plans to hold, from its IR (``relax.analysis.estimate_memory_usage`` only prints text):

    - ``params_bytes``: its constant tensors (the weights, each tensor once), which the VM places on its first
      device, the target's;
    - ``planned_host_bytes`` / ``planned_device_bytes``: the sizes of its storage allocations (``alloc_storage``,
      Relax's memory planning) of static size, by where they live: the device index names the VM's device (the
      module's ``vdevice`` list when it has one; else 0 is the target's device, a GPU's, and the rest the host);
    - ``planned_dynamic``: allocations whose size is known only at run time (not in the sums)."""
    tensors: dict[Any, int] = {}
    sums = {"planned_host_bytes": 0, "planned_device_bytes": 0, "planned_dynamic": 0}
    vdevices = list((mod.global_infos or {}).get("vdevice", []))

    def on_device(index: int) -> bool:
        if index < len(vdevices):
            return "gpu" in vdevices[index].target.keys
        return gpu and index == 0

    def visit(expr) -> None:
        if isinstance(expr, tvm.ir.expr.GenericConst) and isinstance(expr.value, tvm.runtime.Tensor):
            tensors[expr.value] = math.prod(int(d) for d in expr.value.shape) * expr.value.dtype.itemsize
        elif isinstance(expr, tvm.ir.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in ALLOC_STORAGE:
            device_arg, dtype_arg = ALLOC_STORAGE[expr.op.name]
            dims = [d.value if isinstance(d, tvm.tirx.IntImm) else None for d in expr.args[0].values]
            if None in dims:
                sums["planned_dynamic"] += 1
                return
            nbytes = math.prod(dims) * expr.args[dtype_arg].value.itemsize  # type: ignore[arg-type]
            index = expr.args[device_arg]
            index = int(index.value) if hasattr(index, "value") else 0
            sums["planned_device_bytes" if on_device(index) else "planned_host_bytes"] += nbytes

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return {"params_bytes": sum(tensors.values()), **sums}


def _compile_tuned(model: ModelSource, target: tvm.target.Target, tuning: TuningSet, system_lib: bool):
    """Compile with MetaSchedule records; returns (executable, functions that got a record, all functions,
    functions whose record came from another task of the same anchor block).

    The records are applied to exactly the module the tasks were extracted from (the "zero"
    pipeline's output), then built with the default pipeline, which does not fuse again.
    (TVM 0.27's ``compile_relax`` re-runs fusion on that module, and then no record applies:
    measured here on onnx:squeezenet, 30 tasks with records, 277 ms vs 9.1 ms.)"""
    mod = tuning_module(model)
    applied, tuned, anchored = apply_records(mod, target, tuning)
    functions = [gv for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    executable = relax.build(applied, target, system_lib=True) if system_lib else tvm.compile(applied, target)
    return executable, tuned, len(functions), anchored


def record_databases(tuning: TuningSet, folder: Path):
    """The records as two MetaSchedule databases over the same files: exact ("structural", as tuned) and by
    anchor block (``RECORD_MATCH``: a conv with another epilogue finds the conv's record)."""
    from tvm.s_tir import meta_schedule as ms

    workload_path, record_path = folder / "database_workload.json", folder / "database_tuning_record.json"
    workload_path.write_text("".join(line + "\n" for line in tuning.workloads))
    record_path.write_text("".join(line + "\n" for line in tuning.records))
    # by anchor block, another workload's untuned record (a cheaper epilogue) would rank above a schedule that
    # transfers: that database holds schedules only
    scheduled_path = folder / "database_scheduled_record.json"
    scheduled_path.write_text("".join(line + "\n" for line in tuning.records if not _untuned_line(line)))
    exact = ms.database.JSONDatabase(str(workload_path), str(record_path), allow_missing=False)
    anchor = ms.database.JSONDatabase(str(workload_path), str(scheduled_path), allow_missing=False,
                                      module_equality="anchor-block")
    return exact, anchor


def _untuned_line(line: str) -> bool:
    """A record line (``[workload, [trace, run_secs, …]]``) of a task's untuned code (``untuned_trace``)."""
    try:
        return _lookups_only(inst[0] for inst in json.loads(line)[1][0][0])
    except (ValueError, TypeError, IndexError, KeyError):
        return False


# Instructions that only look a block or loop up: a trace of these alone leaves its function as it was
LOOKUP_INSTRUCTIONS = frozenset({"GetSBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers",
                                 "GetOutputBlocks"})


def _lookups_only(instruction_names) -> bool:
    """The rule for a task's untuned code, by its trace's instruction names (a record line's or a Trace's)."""
    return all(name in LOOKUP_INSTRUCTIONS for name in instruction_names)


def untuned_trace(mod: tvm.IRModule):
    """A trace that leaves ``mod`` untuned: the root block looked up, nothing changed. ``farm tune`` records a searched
    task's untuned code with this trace and its profiled time, so that the task's own best record is not slower than
    its untuned code as profiled. (An empty trace would do the same, but MetaSchedule's databases drop a record with
    no instruction as invalid.)"""
    from tvm.s_tir import Schedule

    sch = Schedule(mod)
    sch.get_sblock("root")  # MetaSchedule's own rules annotate this block: every task has it
    return sch.trace


def is_schedule(trace) -> bool:
    """A record's trace changes its function; one of lookups only (``untuned_trace``) is its untuned code."""
    return not _lookups_only(inst.kind.name for inst in trace.insts)


def apply_records(mod: tvm.IRModule, target: tvm.target.Target, tuning: TuningSet) -> tuple[tvm.IRModule, int, int]:
    """``mod`` with each PrimFunc scheduled by its own record (replayed as tuned), else by the best record of the
    same anchor block (MetaSchedule's ``schedule_using_anchor_trace``, as its ApplyDatabase pass does when a
    database matches by anchor block); returns (module, functions scheduled, of which by anchor block).

    TVM's pass stops the whole compile when one transfer fails (a trace that asks for a consumer the function
    lacks, e.g. a conv with no epilogue): here that function stays untuned and the rest keep their records.
    Records are stored and tuned exactly ("structural"); only this lookup matches by anchor block, so the
    store never holds a record filed under another task's workload."""
    import tempfile

    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.trace_apply import schedule_using_anchor_trace

    normalize = tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod")
    out = mod.clone()
    tuned = anchored = 0
    with tempfile.TemporaryDirectory(prefix="farm-tuning-") as tmp:
        exact, anchor = record_databases(tuning, Path(tmp))
        for gv, func in mod.functions.items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            task = normalize(func)
            try:
                record = exact.query_tuning_record(task, target, gv.name_hint)
                if record is not None:
                    if not is_schedule(record.trace):  # its best is its untuned code: no schedule beat it
                        continue
                    sch = Schedule(record.workload.mod)
                    record.trace.apply_to_schedule(sch, remove_postproc=False)
                else:
                    record = anchor.query_tuning_record(task, target, gv.name_hint)
                    if record is None:  # (the anchor-block database holds schedules only: record_databases)
                        continue
                    sch = Schedule(task)
                    schedule_using_anchor_trace(sch, record.trace, target)
                    anchored += 1
            except Exception as exc:  # TVM's schedule errors, many types: this function stays untuned
                log.info("the record for %s did not apply (left untuned): %s", gv.name_hint, message_line(exc))
                continue
            scheduled = next(iter(sch.mod.functions.values()))
            out[gv] = tvm.tirx.PrimFunc(scheduled.params, scheduled.body, scheduled.ret_type,
                                        attrs=func.attrs).with_attr("tirx.is_scheduled", True)
            tuned += 1
    return out, tuned, anchored


def import_model(model: ModelSource) -> tvm.IRModule:
    """The model as a Relax module, through TVM's frontend for its format."""
    if model.frontend == "torch":
        from tvm.relax.frontend.torch import from_exported_program

        from farm.models import torch_program

        try:
            mod = from_exported_program(torch_program(model), keep_params_as_input=False)
        except Exception as exc:
            raise BuildError(f"TVM's torch importer rejected {model.name}: {message_line(exc)}",
                             "the program may use an operator TVM 0.27 does not support") from exc
        return relax.transform.DecomposeOpsForInference()(mod)
    if model.frontend == "tflite":
        from tvm.relax.frontend.tflite import from_tflite

        from farm.models import tflite_model

        try:
            mod = from_tflite(tflite_model(model), {s.name: s.shape for s in model.inputs},
                              {s.name: s.dtype for s in model.inputs})
        except Exception as exc:
            raise BuildError(f"TVM's TFLite importer rejected {model.name}: {message_line(exc)}",
                             "the model may use an operator TVM 0.27 does not support") from exc
        mod = mod[0] if isinstance(mod, tuple) else mod
        return relax.transform.DecomposeOpsForInference()(mod)
    return import_onnx(model)


def import_onnx(model: ModelSource) -> tvm.IRModule:
    from tvm.relax.frontend.onnx import from_onnx

    shapes = {spec.name: list(spec.shape) for spec in model.inputs}
    dtypes = {spec.name: spec.dtype for spec in model.inputs}
    try:
        mod = from_onnx(onnx_proto(model), shape_dict=shapes, dtype_dict=dtypes, keep_params_in_input=False)
    except Exception as exc:
        raise BuildError(f"TVM's ONNX importer rejected {model.name}: {message_line(exc)}",
                         "the model may use an operator TVM 0.27 does not support; see the TVM log above") from exc
    return relax.transform.DecomposeOpsForInference()(mod)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)

