"""``ios`` devices: iPhones join through TVM's RPC proxy.

iOS apps cannot listen for connections, so TVM's iOS RPC app connects *outward* to an RPC
proxy, which registers the app's key with the tracker and relays sessions. ``farm serve``
starts that proxy (``python -m tvm.exec.rpc_proxy``) at the device's ``proxy`` address
(default 127.0.0.1:9091); then, in the iOS RPC app, set the proxy host and port and the
device's key (README: "iPhones"). iOS forbids loading new dynamic libraries: export such
devices as ``system-lib`` and link the objects into the app.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from farm.errors import DeviceError, InventoryError
from farm.records import Device, TrackerAddress
from farm.rpc.processes import ManagedProcess, free_port, log_tail, spawn

DEFAULT_PROXY = "127.0.0.1:9091"


def proxy_address(device: Device) -> tuple[str, int]:
    text = str(device.options.get("proxy", DEFAULT_PROXY))
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise InventoryError(f"device {device.name!r}: proxy {text!r} is not HOST:PORT", 'write proxy = "127.0.0.1:9091"')
    return host, int(port)


def bring_up(device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
    host, port = proxy_address(device)
    log_path = state_dir / f"proxy-{device.name}.log"
    proc = spawn([sys.executable, "-m", "tvm.exec.rpc_proxy", "--host", host, "--port", str(port),
                  "--port-end", str(port + 1), "--web-port", str(free_port(host)), "--tracker", str(tracker)], log_path)
    time.sleep(0.5)
    if proc.poll() is not None:
        raise DeviceError(f"the RPC proxy for {device.name!r} exited at start: {log_tail(str(log_path))}",
                          f"is {host}:{port} taken? set proxy = \"HOST:PORT\" on the device; log: {log_path}")
    return [ManagedProcess("server", device.name, device.key, proc.pid, port, str(log_path), time.time(),
                           "tvm.exec.rpc_proxy")]
