"""Cooldown gates: wait while the device is too hot or its battery too low, bounded, and say what was waited."""

from farm.devices.health import cool_down, gate_problem
from farm.errors import DeviceError
from farm.records import Device


def phone(**options) -> Device:
    return Device(name="p", kind="android", key="p", target={"kind": "llvm"}, cooldown_s=2.0, options=options)


def readings(*healths):
    """A device whose successive readings are ``healths`` (the last one repeats)."""
    seen = list(healths)
    return lambda device: seen.pop(0) if len(seen) > 1 else seen[0]


def test_gate_waits_until_cool_and_records_the_wait():
    slept = []
    hot, cool = {"thermal": {"cpu": 51.0}, "battery_pct": 80}, {"thermal": {"cpu": 39.5}, "battery_pct": 80}
    out = cool_down(phone(max_temp_c=40), first=False, read=readings(hot, hot, cool), sleep=slept.append)
    assert slept[0] == 2.0 and len(slept) == 3  # the fixed cooldown, then two polls while hot
    assert out["gate"] == "passed" and out["cooldown_s"] == 2.0 and out["health"] == cool


def test_gate_gives_up_after_max_cooldown_and_says_why():
    out = cool_down(phone(max_temp_c=40, max_cooldown_s=0), first=True,
                    read=readings({"battery_temp_c": 47.0}), sleep=lambda s: None)
    assert out["gate"] == "timed out" and "47.0 °C > max_temp_c 40" in out["reason"]
    assert out["cooldown_s"] == 0.0  # no fixed cooldown before a device's first cell


def test_low_battery_blocks_unless_charging():
    device = phone(min_battery_pct=30)
    assert gate_problem(device, {"battery_pct": 12}) == "battery 12 % < min_battery_pct 30"
    assert gate_problem(device, {"battery_pct": 12, "charging": True}) == ""
    assert gate_problem(device, {}) == ""  # nothing known: nothing to hold on


def test_unreadable_device_is_measured_and_marked():
    def broken(device):
        raise DeviceError("phone X is offline in adb", "plug it in")

    assert cool_down(phone(max_temp_c=40), first=True, read=broken, sleep=lambda s: None)["gate"] == "unreadable"
    assert cool_down(phone(), first=True, read=broken, sleep=lambda s: None)["gate"] == "none"
