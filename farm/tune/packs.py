"""Records packs: a target's tuning records carried from one farm to another (``farm tune --export / --import``).

A pack is MetaSchedule's JSON database files (any MetaSchedule reads them), the cost model (``costmodel``'s .npz:
plain arrays and xgboost's own model file) and a manifest naming the target, the TVM version and what is inside.
It is data only, never code: the cost model is read and checked as data before it is kept.
"""

from __future__ import annotations

import json
from pathlib import Path

from farm.compile import TVM_VERSION, device_tuning_key, effective_target
from farm.records import cold_weights, layout_setting, threads_setting, weight_prepack_setting
from farm.tune.costmodel import FORMAT, load_cost_model, new_cost_model
from farm.errors import FarmError
from farm.records import Device, TuningSet, utc_now
from farm.store import Store
from farm.tune.tuning_set import tuning_set
from farm.tune.database import sync, write_database_files

PACK_MANIFEST = "farm-pack.json"  # a records pack: what it was tuned for, what it holds (data only, never code)
PACK_FORMAT = 1


def export_database(store: Store, device: Device, out_dir: Path) -> TuningSet:
    """Write the store's records for ``device`` as a pack in ``out_dir``; returns them."""
    target = effective_target(device)
    key = device_tuning_key(device, target)
    tuning = tuning_set(store, device)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_database_files(out_dir, tuning)
    saved = store.cost_model(key)
    if saved is not None:
        (out_dir / "cost_model.npz").write_bytes(saved.body)
    manifest = {"format": PACK_FORMAT, "tuning_key": key, "target": target, "tvm_version": TVM_VERSION,
                "threads": threads_setting(device, target), "weight_prepack": weight_prepack_setting(device, target),
                "layout": layout_setting(device, target), "cold_weights": cold_weights(target),
                "workloads": len(tuning.workloads), "records": len(tuning.records),
                "cost_model": {"file": "cost_model.npz", "format": saved.format, "samples": saved.samples} if saved else None,
                "exported_from": device.name, "exported_at": utc_now()}
    (out_dir / PACK_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return tuning


def import_database(store: Store, device: Device, in_dir: Path) -> int:
    """Merge a pack or a plain MetaSchedule JSON database folder (from another farm) into the store; returns new
    records. A pack for another target or TVM version is refused: its records would not apply. Its cost model
    is read as data (no pickle) and kept when the store has none for the target, or a smaller one."""
    in_dir = Path(in_dir)
    if not (in_dir / "database_workload.json").exists():
        raise FarmError(f"{in_dir} has no database_workload.json", "point --import at a MetaSchedule database folder")
    target = effective_target(device)
    key = device_tuning_key(device, target)
    manifest_path = in_dir / PACK_MANIFEST
    if manifest_path.exists():
        manifest = _read_manifest(manifest_path, in_dir, device, target)
        model_file = in_dir / ((manifest.get("cost_model") or {}).get("file") or "cost_model.npz")
        if model_file.exists():
            blob = model_file.read_bytes()
            samples = load_cost_model(new_cost_model(1), blob)  # read and checked as data before it is kept
            ours = store.cost_model(key)
            if ours is None or ours.samples < samples:
                store.save_cost_model(key, blob, FORMAT, samples, None)
    return sync(in_dir, store, key, None)


def _read_manifest(manifest_path: Path, in_dir: Path, device: Device, target: dict) -> dict:
    """The pack's manifest, refused unless it was tuned for ``target`` with this TVM version, the device's threads,
    weight prepacking and layout, and its candidates timed as this farm times them for the target (cold weights)."""
    try:
        manifest = json.loads(manifest_path.read_text())
        theirs = (manifest["target"], manifest["tvm_version"])
    except (ValueError, KeyError, TypeError) as exc:
        raise FarmError(f"{manifest_path} is not a farm pack manifest ({exc})",
                        "export the pack again with farm tune --export DIR") from exc
    if theirs[1] != TVM_VERSION:
        raise FarmError(f"{in_dir} was tuned with TVM {theirs[1]}; this farm runs TVM {TVM_VERSION}",
                        "import it into a farm with that TVM, or tune here: records do not carry across versions")
    if manifest.get("threads") != threads_setting(device, target):
        raise FarmError(f"{in_dir} was tuned on {manifest.get('threads') or 'an unstated number of'} threads, not "
                        f"{device.name!r}'s {threads_setting(device, target)}",
                        "records ranked on another thread count do not apply: import it for a device with that "
                        "threads setting, or tune here")
    prepack = weight_prepack_setting(device, target)
    if manifest.get("weight_prepack", False) != prepack:  # a pack from before the setting was made without it
        raise FarmError(f"{in_dir} was tuned {'without' if prepack else 'with'} weight prepacking, {device.name!r} "
                        f"{'has' if prepack else 'does not have'} it",
                        "its records are other workloads: import it for a device with that weight_prepack setting, "
                        "or tune here")
    layout = layout_setting(device, target)
    if manifest.get("layout", "model") != layout:  # a pack from before the setting has the model's own
        raise FarmError(f"{in_dir} was tuned with layout {manifest.get('layout', 'model')!r}, {device.name!r} has "
                        f"{layout!r}", "its records are other workloads: import it for a device with that layout "
                        "setting, or tune here")
    if theirs[0] != target:
        raise FarmError(f"{in_dir} was tuned for target {json.dumps(theirs[0], sort_keys=True)}, not "
                        f"{device.name!r}'s {json.dumps(target, sort_keys=True)}",
                        "import it for a device with that target (farm devices shows each device's target)")
    if manifest.get("cold_weights", False) != cold_weights(target):  # same target: a pack from before farm flushed
        raise FarmError(f"{in_dir}'s records were timed with their weights in the CPU's caches, as farm tuned before it "
                        "flushed them between runs (records.COLD_WEIGHTS_RULE)",
                        "records timed warm rank otherwise and no longer apply: tune here")
    return manifest
