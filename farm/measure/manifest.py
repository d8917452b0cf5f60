"""A run's manifest as the measuring process reads it (``farm.manifest`` says what each field is): this process's
farm and TVM, what built the artifact (``Artifact.built_with``), the device's software from its kind's plug-in
(``DeviceKind.software``, bounded by ``SOFTWARE_BUDGET_S``), then, in the session, the server's build and the GPU
driver (``session_part``)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import tvm
import tvm_ffi

from farm.devices import kind_of
from farm.manifest import farm_commit, farm_version
from farm.records import Artifact, Device

log = logging.getLogger(__name__)
farm_commit()  # read when farm is imported: a long-running worker after a `git pull` still runs the code it loaded

# The device's software is read within this (adb or ssh round trips): a kind that takes longer leaves those fields
# unknown, so the manifest never adds more than about a second to a cell (docs/benchmarks.md, "What changed")
SOFTWARE_BUDGET_S = 0.8


def process_part() -> dict[str, Any]:
    """farm and TVM as this process runs them."""
    return {"farm.version": farm_version(), "farm.commit": farm_commit(), "tvm.version": tvm.__version__,
            "tvm_ffi.version": tvm_ffi.__version__}


def run_manifest(device: Device, artifact: Artifact | None, model_digest: str = "",
                 reference_version: str | None = None) -> dict[str, Any]:
    """The manifest of a run of ``artifact`` (None: a reference runtime's run, of ``reference_version``) on
    ``device``, before its session: unknown fields are None."""
    started = time.perf_counter()
    manifest: dict[str, Any] = {**process_part(), "model.digest": artifact.model_digest if artifact else model_digest}
    if artifact is not None:
        manifest.update(artifact.built_with)
    if reference_version is not None:
        manifest["reference.version"] = reference_version
    manifest.update(read_software(device))
    log.debug("manifest of %s read in %.3f s", device.name, time.perf_counter() - started)
    return manifest


def read_software(device: Device, budget_s: float = SOFTWARE_BUDGET_S) -> dict[str, Any]:
    """``DeviceKind.software`` within ``budget_s``: what it has not read by then is unknown (the thread is left to
    finish on its own; its answer is dropped)."""
    found: dict[str, Any] = {}

    def read() -> None:
        try:
            found.update(kind_of(device).software(device))
        except Exception as exc:  # a phone that went away, an ssh that failed: unknown, never a failed run
            log.info("%s: its software could not be read: %s", device.name, exc)

    reader = threading.Thread(target=read, name=f"farm-software-{device.name}", daemon=True)
    reader.start()
    reader.join(budget_s)
    if reader.is_alive():
        log.info("%s: its software was not read within %.1f s: unknown this run", device.name, budget_s)
        return {}
    return {f"device.{k}": v for k, v in found.items() if v not in (None, "")}


def session_part(helpers: dict[str, Any], dev: Any, device_type: str) -> dict[str, Any]:
    """What the session tells: the server's build (``farm.ServerBuild``) and, on a GPU, its driver's version."""
    part: dict[str, Any] = {}
    if "farm.ServerBuild" in helpers:
        try:
            build = str(helpers["farm.ServerBuild"]())
        except Exception:  # the server's own error: its build unknown, never the run's fate
            build = ""
        if build:
            part["device.server"] = build
    if device_type != "cpu":
        try:
            driver = dev.driver_version
        except Exception:  # a runtime that does not say: unknown
            driver = None
        if driver:
            part["device.gpu_driver"] = str(driver)
    return part
