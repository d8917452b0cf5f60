"""devices.toml: load and validate the inventory. No TVM here (every verb reads it).

The fields every device has are checked here; a kind's own fields, and the rules between its
devices, are its kind's (``farm.devices.kinds()``). Every error names the file, the line where it
can tell, the device and the field, and says what to write instead.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Any

from farm.devices import kinds
from farm.devices.kind import COMMON as KIND_COMMON
from farm.errors import InventoryError
from farm.records import (CPU_TARGETS, EXPORT_FORMATS, TAG_KINDS, TARGET_KINDS, Device, Inventory, TrackerAddress,
                           tag_kind, target_kind)

DEFAULT_TRACKER = TrackerAddress("127.0.0.1", 9190)
NAME = r"[A-Za-z0-9_.\-]+"  # what a device, its tracker key and its lab host may be called

COMMON_FIELDS = {
    "kind", "key", "target", "host", "export", "cooldown_s", "session_timeout_s",
    "emulated", "tags", "cc", "runner_timeout_s", "max_temp_c", "min_battery_pct", "max_cooldown_s", "fallback",
    "lab_host",
    *KIND_COMMON,
}
FALLBACKS = ("cpu",)
GATE_FIELDS = ("max_temp_c", "min_battery_pct", "max_cooldown_s")
# The common fields a device keeps in its options (farm tune, the sweep's gates and fallback read them there)
OPTION_FIELDS = ("cc", "runner_timeout_s", "search_population", "fallback", "cuda_toolkit", "cuda_driver", *GATE_FIELDS)
EXAMPLE = '''[devices.x86-local]
kind = "local"
key = "x86-local"
target = { kind = "llvm" }
export = "so"'''


def load_inventory(path: str | Path) -> Inventory:
    """Read and validate ``path``; raise InventoryError saying what to fix."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise InventoryError(
            f"{path}: no such inventory file",
            "pass --devices PATH or set FARM_DEVICES; `farm demo` needs no inventory",
        ) from exc
    except UnicodeDecodeError as exc:
        raise InventoryError(f"{path}: not a TOML file (not UTF-8 text)", "pass the inventory: --devices devices.toml") from exc
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read: {exc.strerror}", "check the file's permissions") from exc
    return parse_inventory(text, str(path))


def parse_inventory(text: str, path: str = "devices.toml") -> Inventory:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(
            f"{path}: not valid TOML: {exc}",
            "fix the syntax at that line; each device is a [devices.NAME] table",
        ) from exc
    unknown = set(data) - {"tracker", "devices", "store", "dashboard", "notify"}
    if unknown:
        raise InventoryError(
            f"{path}: unknown top-level table {sorted(unknown)[0]!r}",
            "only [tracker], [store], [dashboard], [notify] and [devices.NAME] tables are allowed",
        )
    dashboard = _parse_strings(data.get("dashboard", {}), path, "dashboard", ("url", "token_file"),
                               'write [dashboard] url = "http://farm.lab:8080/" and token_file = "~/.farm/triage-token"')
    notify = _parse_strings(data.get("notify", {}), path, "notify", ("url",),
                            'write [notify] url = "https://chat.example/hooks/farm"')
    db = _parse_store(data.get("store", {}), path)
    tracker = _parse_tracker(data.get("tracker", {}), path)
    raw_devices = data.get("devices", {})
    if not isinstance(raw_devices, dict):
        raise InventoryError(f"{path}: 'devices' must be tables", "write one [devices.NAME] table per device")
    devices = {}
    for name, raw in raw_devices.items():
        where = _where(path, text, name)
        devices[name] = _parse_device(name, raw, where)
    by_kind: dict[str, list[Device]] = {}
    for device in devices.values():
        by_kind.setdefault(device.kind, []).append(device)
    for kind, members in by_kind.items():
        kinds()[kind].validate_fleet(members, path)
    keys: dict[str, str] = {}
    for device in devices.values():
        other = keys.get(device.key)
        if other is not None and devices[other].target != device.target:
            raise InventoryError(
                f"{_where(path, text, device.name)}: device {device.name!r} reuses key {device.key!r} "
                f"of {other!r} with a different target",
                "a key names one kind of device: give each target its own key",
            )
        keys[device.key] = device.name
    lab_hosts = _parse_lab_hosts(data.get("tracker", {}), devices, path)
    return Inventory(path=path, tracker=tracker, devices=devices, db=db, lab_hosts=lab_hosts,
                     dashboard_url=dashboard.get("url"), triage_token_file=dashboard.get("token_file"),
                     notify_url=notify.get("url"))


def _parse_lab_hosts(raw: Any, devices: dict[str, Device], path: str) -> dict[str, str] | None:
    """[tracker] lab_hosts = { lab1 = "10.0.0.5" }: where each lab host's servers register from; every device's
    lab_host must be named (else its servers would be refused)."""
    hosts = raw.get("lab_hosts") if isinstance(raw, dict) else None
    if hosts is None:
        return None
    if not isinstance(hosts, dict) or not all(isinstance(a, str) and a for a in hosts.values()):
        raise InventoryError(f"{path}: [tracker] lab_hosts must be a table of addresses",
                             'write lab_hosts = { lab1 = "10.0.0.5", lab2 = "10.0.0.6" }')
    missing = sorted({str(d.lab_host) for d in devices.values() if d.lab_host and d.lab_host not in hosts})
    if missing:
        raise InventoryError(f"{path}: [tracker] lab_hosts names no address for lab host(s) {', '.join(missing)}",
                             f'add {missing[0]} = "ADDRESS" (the address its servers reach the tracker from)')
    return dict(hosts)


def find_device(inventory: Inventory, name: str) -> Device:
    try:
        return inventory.devices[name]
    except KeyError as exc:
        known = ", ".join(sorted(inventory.devices)) or "none"
        raise InventoryError(
            f"unknown device {name!r} in {inventory.path}",
            f"known devices: {known}; see `farm devices`",
        ) from exc


def _where(path: str, text: str, name: str) -> str:
    pattern = re.compile(r"^[ \t]*\[[ \t]*devices[ \t]*\.[ \t]*[\"']?" + re.escape(name) + r"[\"']?\s*\]", re.M)
    match = pattern.search(text)
    if match is None:
        return path
    return f"{path}:{text.count(chr(10), 0, match.start()) + 1}"


def _parse_strings(raw: Any, path: str, table: str, fields: tuple[str, ...], hint: str) -> dict[str, str]:
    """A table of a few string fields ([dashboard], [notify]), each checked."""
    if not isinstance(raw, dict) or set(raw) - set(fields):
        raise InventoryError(f"{path}: [{table}] takes {', '.join(fields)}", hint)
    if any(not isinstance(v, str) or not v for v in raw.values()):
        raise InventoryError(f"{path}: [{table}]'s fields are strings", hint)
    return dict(raw)


def _parse_store(raw: Any, path: str) -> str | None:
    hint = 'write [store] db = "postgresql://farm@dbhost:5432/farm" (or a file path); --db and FARM_DB override it'
    if not isinstance(raw, dict) or set(raw) - {"db"}:
        raise InventoryError(f"{path}: [store] takes one field, db", hint)
    db = raw.get("db")
    if db is not None and (not isinstance(db, str) or not db):
        raise InventoryError(f"{path}: [store] db must be a string", hint)
    return db


def _parse_tracker(raw: Any, path: str) -> TrackerAddress:
    if not isinstance(raw, dict):
        raise InventoryError(f"{path}: [tracker] must be a table", 'write [tracker] host = "127.0.0.1" port = 9190')
    host = raw.get("host", DEFAULT_TRACKER.host)
    port = raw.get("port", DEFAULT_TRACKER.port)
    if not isinstance(host, str) or not host:
        raise InventoryError(f"{path}: [tracker] host must be a string", 'write host = "127.0.0.1"')
    if not isinstance(port, int) or not 0 < port < 65536:
        raise InventoryError(f"{path}: [tracker] port must be an integer 1-65535", "write port = 9190")
    return TrackerAddress(host, port)


def _parse_device(name: str, raw: Any, where: str) -> Device:
    def fail(field: str, problem: str, hint: str) -> InventoryError:
        return InventoryError(f"{where}: device {name!r}: {field} {problem}", hint)

    if not isinstance(raw, dict):
        raise fail("entry", "must be a table", f"write it as:\n{EXAMPLE}")
    if not re.fullmatch(NAME, name):
        # a ':' in a name collided with a model's in a lab job's key ('cell:SWEEP:DEVICE:MODEL'), and the second job
        # was silently not queued (#62); '@' marks a CPU fallback (NAME@cpu); '/' and spaces break paths and URLs
        raise InventoryError(f"{where}: device name {name!r} is not allowed",
                             "use letters, digits, '-', '_' or '.' in a device name ([devices.mate10-gpu])")
    known = kinds()
    kind = raw.get("kind")
    if kind is None:
        raise fail("kind", "is missing", f"add kind = one of {', '.join(known)}")
    if kind not in known:
        raise fail("kind", f"{kind!r} is unknown", f"write kind = one of {', '.join(known)}")
    plugin = known[kind]
    unknown = set(raw) - COMMON_FIELDS - set(plugin.fields)
    if unknown:
        allowed = ", ".join(sorted(COMMON_FIELDS | set(plugin.fields)))
        raise fail(f"field {sorted(unknown)[0]!r}", f"is not known for kind {kind!r}", f"allowed fields: {allowed}")
    key = raw.get("key")
    if key is None:
        raise fail("key", "is missing", f'add key = "{name}" (the key its rpc_server registers under)')
    if not isinstance(key, str) or not re.fullmatch(NAME, key):
        raise fail("key", f"{key!r} is not a valid tracker key", "use letters, digits, '-', '_' or '.'")
    target = _parse_target(raw.get("target"), fail, "target")
    host = _parse_target(raw["host"], fail, "host") if "host" in raw else None
    if host is not None and target_kind(host) not in CPU_TARGETS:
        raise fail("host", f"kind {target_kind(host)!r} cannot be a host", 'use host = { kind = "llvm", mtriple = "..." }')
    export = raw.get("export", "so")
    if export not in EXPORT_FORMATS:
        raise fail("export", f"{export!r} is unknown", f"write export = one of {', '.join(EXPORT_FORMATS)}")
    cooldown_s = _number(raw.get("cooldown_s", 0.0), fail, "cooldown_s")
    session_timeout_s = _number(raw.get("session_timeout_s", 600.0), fail, "session_timeout_s")
    if not 0 < session_timeout_s < math.inf:  # 0 ends every session at once; inf holds a dead one's lease for ever
        raise fail("session_timeout_s", f"{raw['session_timeout_s']!r} must be a positive, finite number of seconds",
                   "write session_timeout_s = 600 (how long the server keeps one session; the lab's lease design "
                   "waits that long for a frozen holder's session)")
    emulated = raw.get("emulated", plugin.always_emulated)
    if not isinstance(emulated, bool):
        raise fail("emulated", "must be true or false", "write emulated = true for devices run under qemu")
    if plugin.always_emulated and not emulated:
        raise fail("emulated", f"cannot be false for a {kind} device", f"leave emulated out: {kind} devices are emulated")
    tags = raw.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise fail("tags", "must be a list of strings", 'write tags = ["phone", "mali"]')
    if "runner_timeout_s" in raw:
        _number(raw["runner_timeout_s"], fail, "runner_timeout_s")
    for gate in GATE_FIELDS:
        if gate in raw:
            _gate_number(raw[gate], fail, gate)
    for field, spec in KIND_COMMON.items():
        if field in raw and (problem := spec.problem(raw[field])):
            raise fail(field, f"{raw[field]!r} {problem}", f"write {spec.example}, or leave it out: {spec.help}")
    _check_target_fields(raw, target, fail)
    plugin.validate(raw, target, fail)
    lab_host = raw.get("lab_host")
    if lab_host is not None and (not isinstance(lab_host, str) or not re.fullmatch(NAME, lab_host)):
        raise fail("lab_host", f"{lab_host!r} is not a lab host name",
                   'write lab_host = "lab2" (letters, digits, \'-\', \'_\' or \'.\'): `farm worker --lab-host lab2` '
                   "on that host serves it")
    options = {k: raw[k] for k in raw if k in plugin.fields or k in OPTION_FIELDS}
    return Device(
        name=name, kind=kind, key=key, target=target, host=host, export=export,
        cooldown_s=cooldown_s, session_timeout_s=session_timeout_s, emulated=emulated,
        tags=tuple(tags), options=options, threads=raw.get("threads"), weight_prepack=raw.get("weight_prepack"),
        layout=raw.get("layout"),
        lab_host=lab_host,
    )


def _check_target_fields(raw: dict[str, Any], target: dict[str, Any], fail) -> None:
    """The fields that only some targets take: each refused, with why, on a target it does not fit."""
    of_target = target_kind(target)  # the target's kind (llvm, cuda, ...), not a device kind
    if raw.get("weight_prepack") and of_target != "llvm":  # records.weight_prepack_setting: nothing to rewrite
        raise fail("weight_prepack", f"needs an llvm target, not {of_target!r}",
                   "leave it out: MetaSchedule rewrites weight layouts only for CPU (llvm) code")
    if "cuda_toolkit" in raw and of_target != "cuda":
        raise fail("cuda_toolkit", f"needs a CUDA target, not {of_target!r}",
                   "leave it out: it names the nvcc that compiles a CUDA target's device code")
    if "cuda_driver" in raw:
        if of_target != "cuda":
            raise fail("cuda_driver", f"needs a CUDA target, not {of_target!r}",
                       "leave it out: it is the CUDA version of an NVIDIA device's driver")
        if not re.fullmatch(r"\d+\.\d+", str(raw["cuda_driver"])):
            raise fail("cuda_driver", f"{raw['cuda_driver']!r} is not a CUDA version",
                       'write the driver\'s CUDA version as nvidia-smi prints it, e.g. cuda_driver = "12.6"')
    if "fallback" in raw:
        if raw["fallback"] not in FALLBACKS:
            raise fail("fallback", f"{raw['fallback']!r} is unknown",
                       'write fallback = "cpu": when the GPU fails a model, farm measures it on the device\'s CPU')
        if of_target in CPU_TARGETS:
            raise fail("fallback", "needs a GPU target", "a CPU device has nothing to fall back to: remove fallback")


def _parse_target(raw: Any, fail, field: str) -> dict[str, Any]:
    if raw is None:
        raise fail(field, "is missing", 'add target = { kind = "llvm" } (a table, as TVM 0.27 takes targets)')
    if isinstance(raw, str):
        raise fail(
            field, f"{raw!r} is a string",
            f'TVM 0.27 refuses string targets: write {field} = {{ kind = "{raw.split()[0]}" }} with options as fields',
        )
    if not isinstance(raw, dict):
        raise fail(field, "must be a table", f'write {field} = {{ kind = "llvm" }}')
    if "tag" in raw and "kind" not in raw:
        if not isinstance(raw["tag"], str) or "/" not in raw["tag"]:
            raise fail(f"{field}.tag", f"{raw['tag']!r} is not a TVM target tag",
                       'write e.g. target = { tag = "nvidia/jetson-orin-nano" }')
        if tag_kind(raw["tag"]) is None:
            families = ", ".join(family + "*" for family in TAG_KINDS)
            raise fail(f"{field}.tag", f"{raw['tag']!r} is not a tag of a target kind farm measures",
                       f"farm reads TVM's tags of {families}; or write {field} as a table: {field} = {{ kind = \"llvm\", ... }}")
        return dict(raw)
    given = raw.get("kind")
    if given not in TARGET_KINDS:
        raise fail(f"{field}.kind", f"{given!r} is not a TVM target kind", f"use one of {', '.join(TARGET_KINDS)}")
    for option, value in raw.items():
        if not _is_target_value(value):
            raise fail(f"{field}.{option}", "must be a string, number, boolean or list of them", "check the value")
    if raw.get("mcpu") == "native":
        raise fail(f"{field}.mcpu", "'native' is refused by TVM 0.27's LLVM",
                   "leave mcpu out: farm detects the host CPU for local devices")
    return dict(raw)


def _is_target_value(value: Any) -> bool:
    if isinstance(value, (str, int, float, bool)):
        return True
    return isinstance(value, list) and all(isinstance(v, (str, int, float, bool)) for v in value)


def _gate_number(value: Any, fail, field: str) -> None:
    examples = {"max_temp_c": "max_temp_c = 40 (wait before each cell until the device is at most 40 °C)",
                "min_battery_pct": "min_battery_pct = 30 (wait while the battery is below 30 %)",
                "max_cooldown_s": "max_cooldown_s = 600 (the longest a gate may wait)"}
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise fail(field, f"{value!r} must be a number >= 0", f"write {examples[field]}")


def _number(value: Any, fail, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:  # nan is not >= 0
        raise fail(field, f"{value!r} must be a number of seconds >= 0", f"write {field} = 30")
    return float(value)
