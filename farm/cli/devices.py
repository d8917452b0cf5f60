"""farm devices: the inventory merged with the tracker's live view; --probe checks each device; --kinds lists kinds."""

from __future__ import annotations

import argparse
import sys
import time

from typing import Any

from farm.cli.common import add_verb, emit_json, load_inventory_of, positive_float, print_table


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    from farm.devices import kinds

    p = add_verb(subparsers, common, "devices", run,
                 "inventory merged with the tracker's live summary; --probe checks each device",
                 "Each device's state: online (a free server), busy (servers, none free), missing (no server).\n"
                 "--probe opens a no-op session on every device at once (bounded by --timeout): online, busy,\n"
                 "missing or unreachable with the reason and when it was last seen online; probes are stored.\n"
                 "--kinds lists the device kinds instead (no tracker needed): their fields and what this host lacks.\n\n"
                 "Device kinds (kind = ... in devices.toml):\n" +
                 "".join(f"  {k.name}: {k.summary}" + (f" [fields: {', '.join(k.fields)}]" if k.fields else "") + "\n"
                         for k in kinds().values()))
    p.add_argument("--probe", action="store_true", help="health-check every device with a no-op session")
    p.add_argument("--timeout", type=positive_float, default=3.0, help="seconds per probe (default 3)")
    p.add_argument("--kinds", action="store_true", help="list the device kinds: summary, fields, what this host lacks")


def run(args: argparse.Namespace) -> int:
    from farm.devices.cuda import runtime_refusal
    from farm.records import describe_target
    from farm.rpc.tracker import KeyStatus, key_state, query_summary

    if args.kinds:
        return _print_kinds(args.json)
    inventory = load_inventory_of(args)
    summary = query_summary(inventory.tracker)
    rows = []
    for name, device in inventory.devices.items():
        status = summary.keys.get(device.key, KeyStatus(device.key, 0, 0, 0))
        rows.append({"device": name, "kind": device.kind, "key": device.key, "target": describe_target(device.target),
                     "export": device.export, "emulated": device.emulated, "state": key_state(status),
                     "servers": status.servers, "free": status.free, "pending": status.pending,
                     "cannot_run": (refused := runtime_refusal(device)) and refused[0]})
    known = {d.key for d in inventory.devices.values()}
    extra = sorted(k for k in summary.keys if k not in known and summary.keys[k].servers)
    columns = ["device", "kind", "key", "target", "state", "servers", "free", "pending"]
    if args.probe:
        _probe(inventory, summary, rows, args.timeout, args.db)
        columns = ["device", "kind", "key", "state", "probe_ms", "last_seen_s_ago", "reason"]
    if args.json:
        emit_json({"tracker": str(inventory.tracker), "devices": rows, "unknown_keys": extra})
    else:
        print(f"tracker {inventory.tracker}")
        print_table(rows, columns)
        if extra:
            print(f"keys registered but not in {inventory.path}: {', '.join(extra)}")
        for row in rows:
            if row["cannot_run"]:
                print(f"cannot run: {row['cannot_run']}")
    return 0


def _probe(inventory, summary, rows: list[dict[str, Any]], timeout_s: float, db: str) -> None:
    """Probe every device at once, store the probes, and put each one's state into its row."""
    # TVM's RPC client is all a probe needs, but tvm_ffi imports torch whenever it is installed (1.1 s of the
    # 3.3 s TVM takes to import here); this process never needs torch, so it is marked absent first
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
    from farm.rpc.probe import probe_all
    from farm.store import Store

    probes = {p.device: p for p in probe_all(inventory.tracker, list(inventory.devices.values()), summary, timeout_s)}
    with Store(db) as store:
        store.record_probes(list(probes.values()))
        seen = store.last_online()
    now = time.time()
    for row in rows:
        p = probes[row["device"]]
        row.update(state=p.state, reason=p.reason, probe_ms=None if p.latency_s is None else round(p.latency_s * 1000, 1),
                   last_seen_s_ago=None if row["device"] not in seen else round(now - seen[row["device"]], 1))


def _print_kinds(as_json: bool) -> int:
    from farm.devices import kinds
    from farm.devices.kind import COMMON

    rows: list[dict[str, Any]] = [
        {"kind": k.name, "summary": k.summary, "serve": k.serve_help, "missing_here": k.prerequisites(),
         "fields": {name: {"type": f.type, "example": f.example, "help": f.help} for name, f in k.fields.items()},
         "example": f"[devices.NAME]\nkind = \"{k.name}\"\n{k.example}"} for k in kinds().values()]
    common = {name: {"type": f.type, "example": f.example, "help": f.help} for name, f in COMMON.items()}
    if as_json:
        emit_json({"kinds": rows, "every_kind": common})
        return 0
    print("every kind:")
    for name, field in common.items():
        print(f"  {name}: {field['help']} (e.g. {field['example']})")
    for row in rows:
        print(f"{row['kind']}: {row['summary']}")
        print(f"  farm serve: {row['serve']}")
        if row["missing_here"]:
            print(f"  this host lacks: {row['missing_here']}")
        for name, field in row["fields"].items():
            print(f"  {name}: {field['help']} (e.g. {field['example']})")
    return 0
