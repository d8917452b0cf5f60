"""What is inside an exported artifact: object formats, architectures, embedded device code.

Reads bytes only (no TVM): ELF and Mach-O headers of the library or of each member of a
tar, and the markers TVM's device-code blobs carry (OpenCL/Metal/CUDA source).
"""

from __future__ import annotations

import struct
import tarfile
from dataclasses import dataclass
from pathlib import Path

ELF_MACHINES = {0x3E: "x86-64", 0xB7: "aarch64", 0x28: "arm", 0x03: "x86"}
ELF_TYPES = {1: "relocatable", 2: "executable", 3: "shared object"}
MACHO_CPUS = {0x0100000C: "arm64", 0x01000007: "x86-64"}
MACHO_TYPES = {1: "object", 6: "dylib", 2: "executable"}
DEVICE_CODE_MARKERS = {
    "opencl": (b"__kernel void",),
    "metal": (b"metal_stdlib", b"using namespace metal"),
    "cuda": (b"__CUDACC_RTC__", b"extern \"C\" __global__", b".target sm_"),
}


@dataclass(frozen=True)
class Member:
    name: str
    format: str  # "ELF" | "Mach-O" | "other"
    kind: str  # relocatable, shared object, object, dylib, ...
    arch: str


@dataclass(frozen=True)
class ArtifactInfo:
    members: tuple[Member, ...]
    device_code: tuple[str, ...]  # "opencl", "metal", "cuda" found embedded

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(sorted({m.arch for m in self.members if m.format != "other"}))


def describe_binary(name: str, data: bytes) -> Member:
    if data[:4] == b"\x7fELF":
        little = data[5] == 1
        fmt = "<HH" if little else ">HH"
        e_type, e_machine = struct.unpack_from(fmt, data, 16)
        return Member(name, "ELF", ELF_TYPES.get(e_type, f"type {e_type}"),
                      ELF_MACHINES.get(e_machine, f"machine {e_machine:#x}"))
    if data[:4] in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe"):
        cputype, _, filetype = struct.unpack_from("<iii", data, 4)
        return Member(name, "Mach-O", MACHO_TYPES.get(filetype, f"type {filetype}"),
                      MACHO_CPUS.get(cputype & 0xFFFFFFFF, f"cpu {cputype:#x}"))
    return Member(name, "other", "", "")


def _device_code(data: bytes) -> set[str]:
    return {kind for kind, markers in DEVICE_CODE_MARKERS.items() if any(m in data for m in markers)}


def inspect_artifact(path: str | Path) -> ArtifactInfo:
    path = Path(path)
    members, code = [], set()
    if tarfile.is_tarfile(path):
        with tarfile.open(path) as tar:
            for item in tar.getmembers():
                if item.isfile() and (member := tar.extractfile(item)) is not None:
                    data = member.read()
                    members.append(describe_binary(item.name, data))
                    code |= _device_code(data)
    else:
        data = path.read_bytes()
        members.append(describe_binary(path.name, data))
        code |= _device_code(data)
    return ArtifactInfo(tuple(members), tuple(sorted(code)))
