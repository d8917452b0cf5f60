"""Device health (temperature, battery) and the cooldown before each measurement.

``read_health`` reads what the device can tell, as its kind knows how (a phone's battery and thermal
zones over adb, this host's sensors for devices on this host; other kinds report nothing). ``cool_down`` waits the
device's fixed ``cooldown_s`` and then, when the inventory sets gates, polls until the device
is at most ``max_temp_c`` and its battery at least ``min_battery_pct``, for at most
``max_cooldown_s`` (default 600 s). What it waited and saw goes into the measurement context,
so a number measured on a hot phone says so.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from farm.devices import kind_of
from farm.errors import FarmError
from farm.records import Device
from farm.stats import hottest

log = logging.getLogger(__name__)

POLL_S = 5.0
DEFAULT_MAX_WAIT_S = 600.0

Say = Callable[[str, str], None]


def read_health(device: Device) -> dict[str, Any]:
    """{"battery_pct", "battery_temp_c", "charging", "thermal": {zone: °C}}, whatever the device's kind can read."""
    return kind_of(device).read_health(device)


def health_after(device: Device) -> dict[str, Any]:
    """The reading after a measurement ({} when the device cannot be read)."""
    try:
        return read_health(device)
    except FarmError as exc:
        log.warning("%s: cannot read temperature/battery after measuring: %s", device.name, exc.message)
        return {}


def gate_problem(device: Device, health: dict[str, Any]) -> str:
    """Why the device may not be measured now ('' when it may)."""
    max_temp, min_battery = device.options.get("max_temp_c"), device.options.get("min_battery_pct")
    temperature = hottest(health)
    if max_temp is not None and temperature is not None and temperature > max_temp:
        return f"{temperature:.1f} °C > max_temp_c {max_temp:g}"
    battery = health.get("battery_pct")
    if min_battery is not None and battery is not None and battery < min_battery and not health.get("charging"):
        return f"battery {battery} % < min_battery_pct {min_battery:g}"
    return ""


def cool_down(device: Device, first: bool, say: Say | None = None, read: Callable[[Device], dict] = read_health,
              sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Wait before a measurement; returns {"cooldown_s", "gate", "gate_wait_s", "health"} for the context."""
    say = say or (lambda step, detail: None)
    waited_fixed = 0.0
    if not first and device.cooldown_s:
        say("cooldown", f"{device.cooldown_s:g} s")
        sleep(device.cooldown_s)
        waited_fixed = device.cooldown_s
    gated = any(device.options.get(g) is not None for g in ("max_temp_c", "min_battery_pct"))
    outcome: dict[str, Any] = {"cooldown_s": waited_fixed, "gate": "none", "gate_wait_s": 0.0, "health": {}}
    try:
        health = read(device)
    except FarmError as exc:
        log.warning("%s: cannot read temperature/battery: %s", device.name, exc.message)
        outcome["gate"] = "unreadable" if gated else "none"
        return outcome
    outcome["health"] = health
    if not gated:
        return outcome
    limit = float(device.options.get("max_cooldown_s", DEFAULT_MAX_WAIT_S))
    start = time.monotonic()
    while problem := gate_problem(device, health):
        waited = time.monotonic() - start
        if waited >= limit:
            log.warning("%s: measuring anyway after %.0f s: %s", device.name, waited, problem)
            outcome.update(gate="timed out", gate_wait_s=round(waited, 1), reason=problem, health=health)
            return outcome
        say("cooldown", f"waiting: {problem}")
        sleep(min(POLL_S, max(0.1, limit - waited)))
        try:
            health = read(device)
        except FarmError as exc:
            outcome.update(gate="unreadable", gate_wait_s=round(time.monotonic() - start, 1), reason=exc.message)
            return outcome
    outcome.update(gate="passed", gate_wait_s=round(time.monotonic() - start, 1), health=health)
    return outcome
