"""A cell's compile with the store's tuning records for its device (``tuning_set``, ``compile_cell``), and the
one warning for records from before farm set threads."""

from __future__ import annotations

import logging
from pathlib import Path

from farm.compile import compile_model, device_tuning_key, effective_target, key_before_threads
from farm.records import Artifact, Device, ModelSource, TuningSet, threads_setting
from farm.store import Store

log = logging.getLogger(__name__)


def tuning_set(store: Store, device: Device, without_session: int | None = None) -> TuningSet:
    """The store's tuning records for ``device``'s effective target (what its artifacts compile in); with
    ``without_session``, as they were before that session (``Store.tuning_lines``)."""
    target = effective_target(device)
    key = device_tuning_key(device, target)
    workloads, records = store.tuning_lines(key, without_session)
    if not records:
        warn_records_before_threads(store, device, target)
    return TuningSet(key, tuple(workloads), tuple(records))


_TOLD: set[str] = set()  # devices whose records from before threads this process has explained


def warn_records_before_threads(store: Store, device: Device, target: dict) -> None:
    """One line, once per device and process, when its only records are from before farm set threads: they were
    measured on TVM's default thread count and no longer apply (the tuning key holds the threads since schema 14)."""
    if device.name in _TOLD or not store.ever_had_records(key_before_threads(target)):
        return
    _TOLD.add(device.name)
    threads = threads_setting(device, target)
    log.warning("%s: its tuning records were measured before farm set threads (TVM's default: half the CPUs on x86) "
                "and no longer apply; farm tune --device %s tunes it again on %s", device.name, device.name,
                f"{threads} threads" if threads else "its online CPUs")


def compile_cell(device: Device, model: ModelSource, store: Store, cache_dir: Path, tuned: bool = True) -> Artifact:
    """The cell's artifact, with the store's tuning records for the device unless ``tuned`` is False."""
    tuning = tuning_set(store, device) if tuned else None
    return compile_model(model, device, cache_dir, tuning)
