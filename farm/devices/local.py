"""``local`` devices: a TVM rpc_server on this host, started and owned by farm."""

from __future__ import annotations

from pathlib import Path

from farm.records import Device, TrackerAddress
from farm.rpc.processes import ManagedProcess, start_server


def bring_up(device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
    port = device.options.get("server_port")
    return [start_server(tracker, device.name, device.key, state_dir, port=port)]
