"""A run's manifest: everything that could move its numbers besides the code under test, as one flat JSON object of
named fields, stored once per distinct content (by its digest) and named by each run (#63). No TVM, no database.

Who fills which field (``FIELDS`` is the one list, in the order a reader reads it):

- farm, TVM, tvm-ffi: the measuring process (``measure.manifest.process_part``); farm's git commit from its
  checkout, or the one stamped into a wheel built from a copy without ``.git`` (``farm/_commit.txt``);
- what built the artifact (``Artifact.built_with``, read when it was compiled: TVM's build, LLVM, the exporting
  compiler, NDK, CUDA's compiler and version, and the tuning records applied: their digest, count, sessions);
- the device's software, read by its kind's plug-in at session time (``DeviceKind.software``): OS build, kernel,
  GPU driver, CPU governor, CPU model and microcode, and the server binary that ran the run;
- the reference runtime's version, for a reference runtime's runs.

A field a kind cannot read is absent (None): unknown, never guessed; ``changes`` never names an unknown as a change
(a device whose adb timed out one night has not changed its build).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping

import farm

# field -> its words; the order is the reader's. A change of any of them is a candidate cause of a finding.
FIELDS: dict[str, str] = {
    "farm.version": "farm", "farm.commit": "farm commit",
    "tvm.version": "TVM", "tvm.build": "TVM build", "tvm_ffi.version": "tvm-ffi", "llvm.version": "LLVM",
    "toolchain.compiler": "compiler", "toolchain.ndk": "NDK", "cuda.compiler": "CUDA compiler",
    "cuda.version": "CUDA",
    "records.digest": "tuning records", "records.count": "records applied", "records.sessions": "tuning sessions",
    "model.digest": "model",
    "reference.version": "reference runtime",
    "device.os_build": "OS build", "device.kernel": "kernel", "device.gpu_driver": "GPU driver",
    "device.governor": "CPU governor", "device.cpu_model": "CPU", "device.microcode": "microcode",
    "device.server": "server binary",
}
# What a finding's sentence says stayed the same when it names another cause ("TVM, model and records unchanged")
UNCHANGED_NAMED = (("TVM", ("tvm.version", "tvm.build")), ("model", ("model.digest",)),
                   ("records", ("records.digest",)))
# Fields whose values are digests: shown by their first characters
DIGESTS = frozenset({"farm.commit", "tvm.build", "records.digest", "model.digest", "device.server"})


COMMIT_FILE = "farm/_commit.txt"  # a wheel built from a copy without .git carries its commit here (tools/gpu_kit.py)
CHECKOUT = Path(farm.__file__).resolve().parent.parent


@functools.cache
def farm_version() -> str:
    """farm's version as installed (its distribution's metadata), else the package's own."""
    try:
        return metadata.version("farm")
    except metadata.PackageNotFoundError:
        return farm.__version__


@functools.cache
def farm_commit() -> str | None:
    """The git commit farm runs from: its checkout's HEAD ("+modified" when farm/ differs from it), else the commit
    stamped into its wheel (``COMMIT_FILE``); None: not known (a wheel built elsewhere)."""
    if (CHECKOUT / ".git").exists():
        try:
            head = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True,
                                  timeout=10)
            dirty = subprocess.run(["git", "-C", str(CHECKOUT), "diff", "--quiet", "HEAD", "--", "farm"],
                                   capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if head.returncode == 0:
            return head.stdout.strip() + ("+modified" if dirty.returncode == 1 else "")
    stamped = CHECKOUT / COMMIT_FILE
    try:
        return stamped.read_text().strip() or None
    except OSError:
        return None


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """The manifest's identity: sha256 of its canonical JSON (runs that share one store it once)."""
    return hashlib.sha256(json.dumps(dict(manifest), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def known(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's known fields only, in ``FIELDS``' order (unknown: None or absent); fields farm does not name
    follow, sorted."""
    ordered = [f for f in FIELDS if manifest.get(f) is not None]
    return {f: manifest[f] for f in ordered + sorted(set(manifest) - set(FIELDS)) if manifest.get(f) is not None}


@dataclass(frozen=True)
class Change:
    """One field that differs between two runs' manifests, both sides known."""

    field: str
    old: Any
    new: Any

    @property
    def words(self) -> str:
        """'OS build QP1A → RQ3A', 'farm commit 3f2a1c9 → 8d0e5b1'."""
        return f"{label(self.field)} {shown(self.field, self.old)} → {shown(self.field, self.new)}"


def label(field: str) -> str:
    return FIELDS.get(field, field)


def shown(field: str, value: Any) -> str:
    """A value as words: a digest field's long hex runs cut to 10 characters ("python-server-00016761e5",
    "330910ed4b+modified"), anything else as it is."""
    text = value if isinstance(value, str) else json.dumps(value)
    return re.sub(r"[0-9a-f]{16,}", lambda m: m.group(0)[:10], text) if field in DIGESTS else text


def changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """The fields known in both manifests whose values differ, in ``FIELDS``' order (an unknown side is no change)."""
    fields = [f for f in FIELDS if f in old or f in new] + sorted((set(old) | set(new)) - set(FIELDS))
    return [Change(f, old[f], new[f]) for f in fields
            if old.get(f) is not None and new.get(f) is not None and old[f] != new[f]]


def unchanged_words(pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> str:
    """'TVM, model and records unchanged' for the ``UNCHANGED_NAMED`` groups known on both sides and equal in every
    pair; '' when none is."""
    pairs = list(pairs)
    same = [name for name, fields in UNCHANGED_NAMED
            if pairs and all(any(o.get(f) is not None for f in fields) and all(o.get(f) == n.get(f) for f in fields)
                             for o, n in pairs)]
    if not same:
        return ""
    return (", ".join(same[:-1]) + " and " + same[-1] if len(same) > 1 else same[0]) + " unchanged"
