"""``compile_model``: build a model for a device's target (with tuning records, where there are any), export it,
and cache the artifact under its ``artifact_key``."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import tempfile
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

import tvm

from farm.compile.cuda import CudaCompiler, DeviceCode, compile_cubin, device_code_for
from farm.compile.keys import PIPELINE_VERSION, TVM_VERSION, artifact_key
from farm.compile.provenance import built_with, default_cc
from farm.compile.targets import effective_target, export_library, make_target, toolchain_for
from farm.errors import BuildError, message_line
from farm.tvm_private import pack_imports_with_cubin
from farm.records import Artifact, Device, ModelSource, TuningSet, layout_setting, weight_prepack_setting

log = logging.getLogger(__name__)

EXPORT_SUFFIX = {"so": ".so", "tar": ".tar", "system-lib": ".tar"}  # iOS .so is a dylib by content
META = "artifact.json"  # an artifact folder's metadata, beside its library


def planned_key(model: ModelSource, device: Device, tuning: TuningSet | None = None) -> str:
    """The artifact key ``compile_model`` builds (model, device, tuning records) under, before building it."""
    target = effective_target(device)
    return _key(model, device, target, toolchain_for(device, target), tuning, device_code_for(device, target))


def _key(model: ModelSource, device: Device, target: dict, toolchain: str, tuning: TuningSet | None,
         cuda: tuple[CudaCompiler, DeviceCode] | None) -> str:
    return artifact_key(model, device, target, toolchain, tuning.digest if tuning is not None and tuning.records else "",
                        device_code=cuda[1].compiler if cuda else "")


def compile_model(model: ModelSource, device: Device, cache_dir: Path, tuning: TuningSet | None = None) -> Artifact:
    """Return the cached artifact for (model, device target, tuning records) or build and export it."""
    target = effective_target(device)
    toolchain = toolchain_for(device, target)
    cuda = device_code_for(device, target)  # an arch its compiler cannot target fails here, before TVM compiles
    if tuning is not None and not tuning.records:
        tuning = None
    key = _key(model, device, target, toolchain, tuning, cuda)
    folder = Path(cache_dir) / key[:24]
    if (cached := _cached(folder)) is not None:
        return cached
    # the compiler's modules only now: a host with TVM's runtime alone finds cached artifacts above (package docstring)
    from tvm import relax

    from farm.compile.frontends import import_model
    from farm.compile.kernel_facts import kernel_facts
    from farm.compile.memory import BuiltModule, planned_memory

    start = time.perf_counter()
    tvm_target = make_target(target)
    tuned_tasks = total_tasks = anchor_tasks = 0
    used: set[int] = set()
    built = BuiltModule()
    try:
        with tvm.transform.PassContext(instruments=[built]):
            if tuning is not None:
                executable, tuned_tasks, total_tasks, anchor_tasks, used = _compile_tuned(
                    model, tvm_target, tuning, device.export == "system-lib", weight_prepack_setting(device, target),
                    layout_setting(device, target))
            elif device.export == "system-lib":
                executable = relax.build(import_model(model, cuda is not None), tvm_target, system_lib=True)
            else:
                executable = tvm.compile(import_model(model, cuda is not None), tvm_target)
    except BuildError:
        raise
    except Exception as exc:
        raise BuildError(f"TVM could not compile {model.name} for {json.dumps(target)}: {message_line(exc)}",
                         "check the target; GPU targets need a schedule (see README)") from exc
    memory: dict[str, int] = {}
    kernels: dict[str, dict] = {}
    try:  # side figures, as memory below: never a failed build
        kernels = kernel_facts(built.module) if built.module is not None else {}
    except Exception as exc:
        log.warning("kernel facts of %s not known: %s", model.name, message_line(exc))
    try:  # a side figure: an IR shape planned_memory does not know is a warning and "not known", never a failed build
        memory = planned_memory(built.module, "gpu" in tvm_target.keys) if built.module is not None else {}
    except Exception as exc:
        log.warning("planned memory of %s not known: %s", model.name, message_line(exc))
    # built in a folder of its own, then published by one rename: two processes building one key (a sweep and a
    # `farm bench`, two lab hosts on one cache) never write into each other's folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{folder.name}.tmp-", dir=folder.parent))
    filename = f"{_safe(model.name)}{EXPORT_SUFFIX[device.export]}"
    exported = False
    try:
        export_library(executable, str(tmp / filename), toolchain, _cubin_packer(cuda, model) if cuda else None)
        exported = True
    except BuildError:  # the device code's compiler said what failed
        raise
    except Exception as exc:
        raise BuildError(f"exporting {model.name} as {device.export} failed: {message_line(exc)}",
                         f"check that the toolchain {toolchain or 'cc'} is installed and works") from exc
    finally:
        if not exported:
            shutil.rmtree(tmp, ignore_errors=True)
    artifact = Artifact(
        cache_key=key, path=str(folder / filename), model_name=model.name, model_digest=model.digest, target=target,
        export=device.export, toolchain=toolchain or "default", tvm_version=TVM_VERSION,
        file_digest=_digest(tmp / filename), build_s=time.perf_counter() - start,
        tuning_digest=tuning.digest if tuning else "", tuned_tasks=tuned_tasks, total_tasks=total_tasks,
        anchor_tasks=anchor_tasks, pipeline_version=PIPELINE_VERSION, params_bytes=memory.get("params_bytes"),
        planned_host_bytes=memory.get("planned_host_bytes"), planned_device_bytes=memory.get("planned_device_bytes"),
        planned_dynamic=memory.get("planned_dynamic", 0), kernels=kernels,
        built_with=built_with(toolchain or (default_cc() if device.export == "so" else ""), cuda[0] if cuda else None,
                              tuning, used),
    )
    (tmp / META).write_text(json.dumps({k: v for k, v in asdict(artifact).items() if k != "cached"}, indent=2))
    return _publish(tmp, folder) or artifact


def _cubin_packer(cuda: tuple[CudaCompiler, DeviceCode], model: ModelSource):
    """Packs the executable's CUDA modules as cubins compiled here (``compile/cuda.py``), with their note."""
    compiler, code = cuda

    def cubin_for(source: str) -> bytes:
        started = time.perf_counter()
        cubin = compile_cubin(compiler, source, code.arch, progress=log.warning)
        log.info("%s: %s compiled %d bytes of CUDA source for %s in %.1f s", model.name, compiler.label, len(source),
                 code.arch, time.perf_counter() - started)
        return cubin

    return pack_imports_with_cubin(cubin_for, code.note())


def artifact_file(artifact: Artifact) -> tuple[dict, bytes]:
    """An artifact as another host installs it (``install_artifact``): its metadata and its library's bytes."""
    return {k: v for k, v in asdict(artifact).items() if k != "cached"}, Path(artifact.path).read_bytes()


def install_artifact(cache_dir: Path, file_digest: str, meta: dict, data: bytes) -> Artifact:
    """An artifact another host built (``artifact_file``, through the lab's store), in this host's cache under its
    own key, once its bytes have the sha256 its builder recorded: nothing else is ever uploaded to a device."""
    if not isinstance(meta.get("cache_key"), str) or not isinstance(meta.get("path"), str):
        raise BuildError("an artifact read from the lab's store has no cache key or file name in its metadata",
                         "its builder runs another farm: upgrade both")
    folder = Path(cache_dir) / meta["cache_key"][:24]
    filename = Path(meta["path"]).name
    if not re.fullmatch(r"[0-9a-f]{64}", meta["cache_key"]) or filename in ("", ".", "..") or \
            folder.resolve().parent != Path(cache_dir).resolve():  # a key that is a path would write anywhere (#62)
        raise BuildError(f"an artifact read from the lab's store names cache key {meta['cache_key'][:80]!r} and file "
                         f"{meta['path'][:80]!r}: not what farm makes, refused (nothing written)",
                         "someone wrote the lab's database who should not: check its users; the cell compiles here")
    if (got := hashlib.sha256(data).hexdigest()) != file_digest or meta.get("file_digest") != file_digest:
        raise BuildError(f"the artifact {meta.get('cache_key', '?')[:16]} read from the lab's store has sha256 "
                         f"{got[:16]}…, not the {file_digest[:16]}… its builder recorded",
                         "its bytes were damaged on the way or in the store: the cell compiles it on its own host")
    if (cached := _cached(folder)) is not None:
        return cached
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{folder.name}.tmp-", dir=folder.parent))
    (tmp / filename).write_bytes(data)
    known = {f.name for f in fields(Artifact)} - {"cached"}  # the store's metadata may say more (who built it)
    meta = {"pipeline_version": PIPELINE_VERSION, **{k: v for k, v in meta.items() if k in known},
            "path": str(folder / filename)}
    try:
        artifact = Artifact(**meta, cached=True)
    except TypeError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BuildError(f"the artifact {str(meta.get('cache_key', '?'))[:16]} read from the lab's store has "
                         f"metadata this farm cannot read: {exc}", "its builder runs another farm: upgrade both") from exc
    (tmp / META).write_text(json.dumps(meta, indent=2))
    return _publish(tmp, folder) or artifact


def _cached(folder: Path) -> Artifact | None:
    """The artifact ``folder`` holds, when its metadata is whole and its file has the digest it records. The library
    is the one in ``folder`` under its recorded name, wherever the cache was written (a cache carried to another
    host: tools/gpu_kit.py)."""
    meta_path = folder / META
    if not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        library = folder / Path(meta["path"]).name
        if "params_bytes" not in meta:  # written before farm read planned memory: built again to read it
            log.info("rebuilding %s: its metadata has no planned memory", meta_path)
        elif library.exists() and _digest(library) == meta["file_digest"]:
            # the key includes the pipeline version: metadata written before it was recorded has this one
            return Artifact(**{"pipeline_version": PIPELINE_VERSION, **meta, "path": str(library), "cached": True})
    except (ValueError, KeyError, TypeError, OSError):
        log.warning("rebuilding: unreadable artifact metadata %s", meta_path)
    return None


def _publish(built: Path, folder: Path) -> Artifact | None:
    """Move the folder ``built`` (library and metadata) to ``folder`` in one rename. When another process
    published the same key first, its artifact stands (returned) and ours is dropped; a stale or broken folder
    is moved aside first. None: ours is the one published."""
    for _ in range(3):
        try:
            built.rename(folder)
            return None
        except OSError:  # the folder exists: another builder's, or a stale one
            if (theirs := _cached(folder)) is not None:
                shutil.rmtree(built, ignore_errors=True)
                return replace(theirs, cached=False)
            stale = Path(tempfile.mkdtemp(prefix=f"{folder.name}.stale-", dir=folder.parent))
            try:
                folder.rename(stale / "old")
            except OSError:
                pass  # gone already, or replaced meanwhile: try again
            shutil.rmtree(stale, ignore_errors=True)
    raise BuildError(f"could not publish the artifact {folder}: it keeps being replaced",
                     f"check what else writes into {folder.parent}")


def _compile_tuned(model: ModelSource, target: tvm.target.Target, tuning: TuningSet, system_lib: bool,
                   weight_prepack: bool, layout: str):
    """Compile with MetaSchedule records; returns (executable, functions that got a record, all functions,
    functions whose record came from another task of the same anchor block, the records applied: their indexes in
    ``tuning.records``).

    The records are applied to exactly the module the tasks were extracted from (the "zero"
    pipeline's output, with the device's weight prepacking and layout), then, with prepacking, the repacking of the
    weights is folded (``fold_weight_prepack``), and the module built with the default pipeline, which
    does not fuse again. (TVM 0.27's ``compile_relax`` re-runs fusion on that module, and then no record
    applies: measured here on onnx:squeezenet, 30 tasks with records, 277 ms vs 9.1 ms.)"""
    from tvm import relax

    from farm.compile.frontends import fold_weight_prepack, float32_lanes, prepack_calls, tuning_module
    from farm.compile.schedules import apply_records

    mod = tuning_module(model, weight_prepack, layout, float32_lanes(target))
    applied, tuned, anchored, used = apply_records(mod, target, tuning)
    if weight_prepack:
        applied = fold_weight_prepack(applied, target)
        if left := prepack_calls(applied):  # a weight that is not a constant: repacked at every call
            log.warning("%s: main still repacks weights at every call (%s)", model.name, ", ".join(left))
    functions = [gv for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    executable = relax.build(applied, target, system_lib=True) if system_lib else tvm.compile(applied, target)
    return executable, tuned, len(functions), anchored, used


def main_calls(library: str) -> list[str]:
    """The functions ``main`` of an exported library calls, in order, read from its VM bytecode: what a tuned compile
    left in the hot path (``*_prepacked`` kernels, and no ``*_weight_prepack`` while weights are constants)."""
    from tvm import relax

    text = relax.VMExecutable(tvm.runtime.load_module(library)).as_text()
    body = text.split("@main:", 1)[1].split("\n@", 1)[0]
    return [line.split()[1] for line in body.splitlines() if line.strip().startswith("call ")]


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
