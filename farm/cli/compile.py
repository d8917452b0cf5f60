"""farm compile: compile a model for a device (or every device) and export it."""

from __future__ import annotations

import argparse
import dataclasses

from dataclasses import asdict
from typing import Any

from farm.errors import FarmError

from farm.cli.common import (MODEL_HELP, add_shape_option, add_variant_options, add_verb, emit_json, home_dir,
                             load_inventory_of, load_with_variant, print_table, tuning_sets)


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "compile", run, "compile a model for a device (or every device) and export it",
                 "Compiles with Relax for the device's target, exports in its format, caches by\n"
                 "model digest + target + export + toolchain + TVM version. Prints each artifact's\n"
                 "format, architecture and embedded device code (OpenCL, Metal, CUDA). A CUDA target's\n"
                 "device code is compiled here, to a cubin for its arch (NVRTC from PyPI, or the device's\n"
                 "cuda_toolkit): farm prints the arch, the CUDA that compiled it and the oldest driver that\n"
                 "loads it, read back from the library's bytes.")
    p.add_argument("--device", help="inventory device (default: every device, nothing is run)")
    p.add_argument("--model", required=True, help=MODEL_HELP)
    add_shape_option(p)
    p.add_argument("--export", choices=["so", "tar", "system-lib"],
                   help="override the devices' export format (e.g. tar: objects, no linker needed)")
    p.add_argument("--untuned", action="store_true", help="ignore the store's tuning records")
    add_variant_options(p)


def run(args: argparse.Namespace) -> int:
    from farm.compile import compile_model
    from farm.inventory import find_device

    inventory = load_inventory_of(args)
    devices = [find_device(inventory, args.device)] if args.device else list(inventory.devices.values())
    if args.export:
        devices = [dataclasses.replace(d, export=args.export) for d in devices]
    model = load_with_variant(args)
    tunings = tuning_sets(args.db, devices) if not args.untuned else {}
    out, failed = [], []
    for device in devices:
        try:
            artifact = compile_model(model, device, home_dir() / "cache", tunings.get(device.name))
        except FarmError as exc:
            if args.device:
                raise
            failed.append(exc)  # one device's failure does not stop the others
            out.append({"device": device.name, "model": model.name, "status": "failed", "error": exc.message, "hint": exc.hint})
            continue
        out.append({"device": device.name, "model": model.name, "status": "ok", **_artifact_row(artifact)})
    if args.json:
        emit_json(out)
    else:
        print_table(out, ["device", "model", "status", "format", "arch", "device_code", "cached", "path"])
        for row in out:
            if row.get("cuda"):
                print(f"{row['device']}: {row['cuda']['described']}")
    if failed:
        raise FarmError(f"{len(failed)} of {len(devices)} device(s) failed to compile: {failed[0].message}", failed[0].hint)
    return 0


def _artifact_row(artifact) -> dict[str, Any]:
    """An artifact as `farm compile` prints it: where, what format and architecture, what device code it embeds."""
    from farm.compile.artifacts import inspect_artifact

    info = inspect_artifact(artifact.path)
    return {"path": artifact.path, "format": artifact.export, "target": artifact.target, "toolchain": artifact.toolchain,
            "cached": artifact.cached, "build_s": round(artifact.build_s, 3), "cache_key": artifact.cache_key,
            "arch": ",".join(info.archs), "objects": [asdict(m) for m in info.members],
            "tuned_tasks": artifact.tuned_tasks, "anchor_tasks": artifact.anchor_tasks,
            "total_tasks": artifact.total_tasks, "device_code": ",".join(info.device_code),
            "cuda": {**asdict(info.cuda), "described": info.cuda.describe()} if info.cuda else None}
