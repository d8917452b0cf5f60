"""``local`` devices: a TVM rpc_server on this host, started and owned by farm."""

from __future__ import annotations

from pathlib import Path

from farm.records import Device, TrackerAddress
from farm.rpc.processes import ManagedProcess, start_server


def bring_up(device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
    port = device.options.get("server_port")
    # A tracker on another host must reach the server: then bind every interface (the tracker
    # hands clients the address the server connected from).
    loopback = tracker.host.startswith("127.") or tracker.host in ("localhost", "::1")
    return [start_server(tracker, device.name, device.key, state_dir, host="127.0.0.1" if loopback else "0.0.0.0",
                         port=port)]
