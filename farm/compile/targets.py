"""What farm compiles for and links with: a device's effective target (tags resolved, the device kind's rules), its
CPU fallback, TVM's ``Target``, and the toolchain that exports the library the device loads."""

from __future__ import annotations

import dataclasses
import json
import shutil
from typing import Any

import tvm
from tvm.target import codegen

from farm.devices import kind_of, kinds
from farm.errors import BuildError, message_line
from farm.records import Device, HostCPU, online_cpus, target_kind

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
    """The host CPU as LLVM names it (TVM 0.27 refuses ``mcpu=native``); None where TVM's runtime is loaded alone
    (no LLVM to ask: a device host that runs artifacts compiled elsewhere names its host target in the inventory)."""
    if tvm.get_global_func("target.llvm_get_system_cpu", allow_missing=True) is None:  # LLVM is the compiler's
        return None
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
    return kind_of(device).effective_target(device, target, HostCPU(host_cpu(), online_cpus()))


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


def export_library(module, path: str, toolchain: str, fpack_imports=None) -> None:
    """Write ``module`` (an executable, or a tuning candidate) to ``path`` as the device loads it, linked by
    ``toolchain`` (``toolchain_for``): Xcode's dylib for iOS, a cross compiler, or TVM's host cc (''). ``fpack_imports``:
    how its imported modules are packed into it (``tvm_private.pack_imports_with_cubin``), where not TVM's way."""
    packing = {"fpack_imports": fpack_imports} if fpack_imports is not None else {}
    if toolchain == "xcode":
        from tvm.support import xcode

        module.export_library(path, fcompile=xcode.create_dylib, arch="arm64", sdk="iphoneos", **packing)
    elif toolchain:
        from tvm.support import cc

        module.export_library(path, fcompile=cc.cross_compiler(toolchain), **packing)
    else:
        module.export_library(path, **packing)
