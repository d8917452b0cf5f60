"""The store's tuning records for a device (``tuning_set``: what sweep/cell.py's ``compile_cell`` and the tuning
sessions start from), and the one warning for records that no longer apply: from before farm set threads, without
weight prepacking, in the model's own layout, or timed with warm weights."""

from __future__ import annotations

import logging

from farm.compile import device_tuning_key, effective_target, key_before_threads, tuning_key
from farm.records import (Device, TuningSet, cold_weights, layout_setting, threads_setting,
                           weight_prepack_setting)
from farm.store import Store

log = logging.getLogger("farm.sweep.tuning")  # the name its warnings have always carried


def tuning_set(store: Store, device: Device, without_session: int | None = None) -> TuningSet:
    """The store's tuning records for ``device``'s effective target (what its artifacts compile in); with
    ``without_session``, as they were before that session (``Store.tuning_lines``)."""
    target = effective_target(device)
    key = device_tuning_key(device, target)
    workloads, records = store.tuning_lines(key, without_session)
    if not records:
        warn_records_that_do_not_apply(store, device, target)
    sessions = tuple(store.tuning_sessions(key, without_session))
    return TuningSet(key, tuple(workloads), tuple(records), sessions if len(sessions) == len(records) else ())


_TOLD: set[str] = set()  # devices whose records that no longer apply this process has explained


def warn_records_that_do_not_apply(store: Store, device: Device, target: dict) -> None:
    """One line, once per device and process, when a device with no records has some under an older key: made
    without weight prepacking (pipeline 2, or ``weight_prepack = false``: other workloads), in the model's own
    layout where the device's is NHWC (other workloads), timed with the weights in the caches (before farm flushed
    them on llvm targets, ``records.COLD_WEIGHTS_RULE``), or before farm set threads (measured on TVM's default
    thread count; the tuning key holds the threads since schema 14)."""
    if device.name in _TOLD:
        return
    threads = threads_setting(device, target)
    again = f"farm tune --device {device.name} tunes it again on {f'{threads} threads' if threads else 'its online CPUs'}"
    prepack, layout = weight_prepack_setting(device, target), layout_setting(device, target)
    # the other settings' keys (other workloads): how the records were made, and the devices.toml lines that use them
    other = [(tuning_key(target, threads, prepack), "in the model's own layout", 'layout = "model"'),
             (tuning_key(target, threads, False, layout=layout), "without weight prepacking", "weight_prepack = false"),
             (tuning_key(target, threads), "in the model's own layout without weight prepacking (pipeline 2)",
              'layout = "model" and weight_prepack = false')]
    own = device_tuning_key(device, target)
    made = next(((how, lines) for key, how, lines in other if key != own and store.ever_had_records(key)), None)
    if made is not None:
        log.warning("%s: its tuning records were made %s and do not apply with its settings (layout %s, weight "
                    "prepacking %s: other workloads); %s, or %s in devices.toml uses them", device.name, made[0],
                    layout, "on" if prepack else "off", again, made[1])
    elif cold_weights(target) and any(store.ever_had_records(tuning_key(target, threads, packed, layout=laid, cold=False))
                                      for packed, laid in ((prepack, layout), (prepack, "model"), (False, layout),
                                                           (False, "model"))):
        log.warning("%s: its tuning records were timed with their weights in the CPU's caches, as farm tuned before "
                    "it flushed them between runs (inside a model they come from memory) and no longer apply; %s",
                    device.name, again)
    elif store.ever_had_records(key_before_threads(target)):
        log.warning("%s: its tuning records were measured before farm set threads (TVM's default: half the CPUs on "
                    "x86) and no longer apply; %s", device.name, again)
    else:
        return
    _TOLD.add(device.name)

