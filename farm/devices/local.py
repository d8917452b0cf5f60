"""``local`` devices: farm's RPC server on this host, started and owned by farm."""

from __future__ import annotations

from pathlib import Path

from farm.devices.kind import Field, ThisHost, thread_options
from farm.records import Device, TrackerAddress
from farm.rpc.processes import ManagedProcess, start_server

SERVER_PORT = Field("port", "server_port = 9095", "the server's port (default: a free one)")


class Local(ThisHost):
    name = "local"
    summary = "this host's CPU, served by farm's RPC server"
    serve_help = "farm's server here (`python -m farm.rpc.server`: TVM's rpc_server that survives a client killed mid-transfer)"
    fields = {"server_port": SERVER_PORT}
    example = 'key = "x86-local"\ntarget = { kind = "llvm" }'

    def bring_up(self, device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
        port = device.options.get("server_port")
        # A tracker on another host must reach the server: then bind every interface (the tracker
        # hands clients the address the server connected from).
        loopback = tracker.host.startswith("127.") or tracker.host in ("localhost", "::1")
        return [start_server(tracker, device.name, device.key, state_dir, host="127.0.0.1" if loopback else "0.0.0.0",
                             port=port, options=thread_options(device))]
