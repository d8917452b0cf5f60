"""Bring-up per device kind: plug-ins chosen by the ``kind`` devices.toml names.

A plug-in's ``bring_up(device, tracker, state_dir)`` starts whatever makes the device's
RPC server register with the tracker and returns the processes farm now owns.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from farm.devices import android, emulated, ios, linux, local, opencl, remote
from farm.errors import DeviceError, FarmError
from farm.records import Device, TrackerAddress
from farm.rpc.processes import ManagedProcess, is_running, load_records, save_records

BringUp = Callable[[Device, TrackerAddress, Path], list[ManagedProcess]]

PLUGINS: dict[str, BringUp] = {"local": local.bring_up, "remote": remote.bring_up, "qemu": emulated.bring_up,
                             "ios": ios.bring_up, "linux": linux.bring_up, "android": android.bring_up,
                             "opencl": opencl.bring_up}


def bring_up(device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
    plugin = PLUGINS.get(device.kind)
    if plugin is None:
        raise DeviceError(
            f"farm cannot bring up {device.kind!r} devices yet ({device.name!r})",
            f"start a TVM rpc_server for it yourself, registered under key {device.key!r} at {tracker} "
            "(README: 'Devices farm does not start'); farm bench and farm devices then use it",
        )
    return plugin(device, tracker, state_dir)


def can_bring_up(device: Device) -> bool:
    """Whether ``farm serve`` (without --device) starts something for it: a linux board only with an ssh
    address, a phone only with a serial."""
    needs = {"linux": "ssh", "android": "serial"}.get(device.kind)
    return device.kind in PLUGINS and (needs is None or needs in device.options)


def watch(devices: dict[str, Device], tracker: TrackerAddress, state_dir: Path, interval_s: float,
          stop: threading.Event, on_event: Callable[[str], None]) -> int:
    """Restart the servers farm started for ``devices`` whenever one dies, until ``stop`` is set.

    Reads the pid records afresh each round (so `farm down` or another `farm serve` is seen) and
    returns how many restarts it made."""
    restarts = 0
    while not stop.is_set():
        records = load_records(state_dir)
        dead = [r for r in records if r.role == "server" and r.name in devices and not is_running(r)]
        for record in dead:
            if stop.is_set():
                break
            try:
                fresh = bring_up(devices[record.name], tracker, state_dir)
            except FarmError as exc:
                on_event(f"{record.name}: server pid {record.pid} is gone; restart failed: {exc.message} ({exc.hint})")
                continue
            restarts += 1
            current = [r for r in load_records(state_dir) if r != record]
            save_records(state_dir, current + fresh)
            on_event(f"{record.name}: server pid {record.pid} was gone; restarted as pid {fresh[0].pid}")
        stop.wait(interval_s)
    return restarts
