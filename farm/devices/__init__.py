"""Bring-up per device kind: plug-ins chosen by the ``kind`` devices.toml names.

A plug-in's ``bring_up(device, tracker, state_dir)`` starts whatever makes the device's
RPC server register with the tracker and returns the processes farm now owns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from farm.devices import emulated, ios, linux, local, remote
from farm.errors import DeviceError
from farm.records import Device, TrackerAddress
from farm.rpc.processes import ManagedProcess

BringUp = Callable[[Device, TrackerAddress, Path], list[ManagedProcess]]

PLUGINS: dict[str, BringUp] = {"local": local.bring_up, "remote": remote.bring_up, "qemu": emulated.bring_up,
                             "ios": ios.bring_up, "linux": linux.bring_up}


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
    """Whether ``farm serve`` (without --device) starts something for it: a linux board only with an ssh address."""
    return device.kind in PLUGINS and (device.kind != "linux" or "ssh" in device.options)
