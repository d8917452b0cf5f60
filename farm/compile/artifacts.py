"""What is inside an exported artifact: object formats, architectures, embedded device code.

Reads bytes only (no TVM): ELF and Mach-O headers of the library or of each member of a
tar, the markers TVM's device-code blobs carry (OpenCL/Metal/CUDA source), and a CUDA artifact's
cubins (their own ELF headers say their arch) with the note farm put beside them (``compile/cuda.py``:
the CUDA that compiled them, the oldest driver that loads them).
"""

from __future__ import annotations

import json
import re
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
EM_CUDA = 190  # an ELF's e_machine for NVIDIA GPU code (a cubin)
CUDA_NOTE = b"farm-cuda-device-code: "  # compile.cuda.NOTE_MARK (this module imports nothing of farm's)


@dataclass(frozen=True)
class CudaCode:
    """The CUDA code an artifact carries: cubins (compiled ahead, loadable without a compiler) or source (compiled
    by the runtime when it loads, through Python: TVM's own export)."""

    format: str  # "cubin" | "source"
    archs: tuple[str, ...]  # each cubin's arch, from its ELF header ("sm_62")
    cuda_version: str = ""  # from farm's note: the CUDA that compiled them ('' without a note)
    compiler: str = ""
    min_driver: str = ""

    def describe(self) -> str:
        if self.format == "source":
            return "CUDA source (compiled when it loads: needs Python and NVRTC there)"
        said = f"cubin {','.join(self.archs)}"
        if self.cuda_version:
            said += f", CUDA {self.cuda_version} ({self.compiler}), driver >= {self.min_driver}"
        return said


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
    cuda: CudaCode | None = None

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


def _device_code(data: bytes) -> tuple[set[str], CudaCode | None]:
    """The device code kinds ``data`` embeds, and its CUDA code: its packed modules unpacked and its cubins found once."""
    data = _unpacked(data)
    cuda = _cuda_code(data)
    found = {kind for kind, markers in DEVICE_CODE_MARKERS.items() if any(m in data for m in markers)}
    return found | ({"cuda"} if cuda else set()), cuda


def cubin_archs(data: bytes) -> list[str]:
    """The arch of every cubin embedded in ``data`` (an ELF whose machine is EM_CUDA), in order. The arch is in the
    cubin's e_flags: bits 0-7 up to ELF ABI version 7 (CUDA 12), bits 8-15 from version 8 (CUDA 13)."""
    archs, at = [], data.find(b"\x7fELF", 1)
    while at != -1:
        if len(data) >= at + 52 and data[at + 4] == 2 and data[at + 5] == 1:  # 64-bit, little-endian
            (machine,) = struct.unpack_from("<H", data, at + 18)
            (flags,) = struct.unpack_from("<I", data, at + 48)
            if machine == EM_CUDA:
                archs.append(f"sm_{(flags >> 8) & 0xFF if data[at + 8] >= 8 else flags & 0xFF}")
        at = data.find(b"\x7fELF", at + 1)
    return archs


def _unpacked(data: bytes) -> bytes:
    """A C file of packed modules (a tar export's ``devc.c``, compiled where the app is linked) as the bytes its
    array holds; any other data as it is."""
    if not data.lstrip().startswith((b"#ifdef", b"#include", b"const")) or b"const unsigned char" not in data:
        return data
    start, end = data.find(b"= {"), data.rfind(b"};")
    return bytes(int(h, 16) for h in re.findall(rb"0x([0-9a-f]{2})", data[start:end])) + data[end:]


def _cuda_code(data: bytes) -> CudaCode | None:
    """``data``'s CUDA code (``data`` unpacked: ``_unpacked``), None when it has none."""
    archs = cubin_archs(data)
    if not archs:
        return CudaCode("source", ()) if any(m in data for m in DEVICE_CODE_MARKERS["cuda"]) else None
    note: dict = {}
    if (at := data.find(CUDA_NOTE)) != -1:  # a flat JSON object: in a library as it is, in a C file escaped
        end = data.find(b"}", at)
        try:
            note = json.loads(data[at + len(CUDA_NOTE):end + 1].replace(b'\\"', b'"'))
        except ValueError:
            note = {}
    return CudaCode("cubin", tuple(archs), str(note.get("cuda_version", "")), str(note.get("compiler", "")),
                    str(note.get("min_driver", "")))


def inspect_artifact(path: str | Path) -> ArtifactInfo:
    path = Path(path)
    members, code, cuda = [], set(), None
    if tarfile.is_tarfile(path):
        with tarfile.open(path) as tar:
            for item in tar.getmembers():
                if item.isfile() and (member := tar.extractfile(item)) is not None:
                    data = member.read()
                    members.append(describe_binary(item.name, data))
                    kinds, member_cuda = _device_code(data)
                    code |= kinds
                    cuda = cuda or member_cuda
    else:
        data = path.read_bytes()
        members.append(describe_binary(path.name, data))
        code, cuda = _device_code(data)
    return ArtifactInfo(tuple(members), tuple(sorted(code)), cuda)
