"""``local`` devices: farm's RPC server on this host, started and owned by farm."""

from __future__ import annotations

import socket
from pathlib import Path

from farm.devices.kind import Field, ThisHost, thread_options
from farm.records import Device, TrackerAddress
from farm.procs.registry import ManagedProcess
from farm.rpc.launch import start_server

SERVER_PORT = Field("port", "server_port = 9095", "the server's port (default: a free one)")
SERVER_HOST = Field("text", 'server_host = "10.0.0.5"', "the one address the server binds (default: loopback for a "
                    "tracker on loopback, else this host's address on the route to the tracker); never every address")


class Local(ThisHost):
    name = "local"
    summary = "this host's CPU, served by farm's RPC server"
    serve_help = "farm's server here (`python -m farm.rpc.server`: TVM's rpc_server that survives a client killed mid-transfer)"
    fields = {"server_port": SERVER_PORT, "server_host": SERVER_HOST}
    example = 'key = "x86-local"\ntarget = { kind = "llvm" }'

    def bring_up(self, device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
        port = device.options.get("server_port")
        host = str(device.options.get("server_host") or address_towards(tracker))
        return [start_server(tracker, device.name, device.key, state_dir, host=host, port=port,
                             options=thread_options(device))]


def address_towards(tracker: TrackerAddress) -> str:
    """The one address a server of this host binds (#62: it bound every address once its tracker was on another
    host, so anyone on any of this host's networks could open a session and run code): loopback for a tracker on
    loopback, else this host's address on the route to the tracker, the one the tracker hands clients (it gives
    them the address a server connected from). No packet is sent: a UDP socket's connect only picks the route."""
    if tracker.host.startswith("127.") or tracker.host in ("localhost", "::1"):
        return "127.0.0.1"
    family = socket.AF_INET6 if ":" in tracker.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((tracker.host, tracker.port))
        return str(probe.getsockname()[0])
