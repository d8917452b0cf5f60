"""``ios`` devices: iPhones join through TVM's RPC proxy.

iOS apps cannot listen for connections, so TVM's iOS RPC app connects *outward* to an RPC
proxy, which registers the app's key with the tracker and relays sessions. ``farm serve``
starts that proxy (``python -m tvm.exec.rpc_proxy``) at the device's ``proxy`` address
(default 127.0.0.1:9091); then, in the iOS RPC app, set the proxy host and port and the
device's key (docs/devices.md: "iPhones"). iOS forbids loading new dynamic libraries: export such
devices as ``system-lib`` and link the objects into the app.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from farm.devices.kind import DeviceKind, Field
from farm.errors import BuildError, DeviceError, InventoryError
from farm.records import Device, TrackerAddress, split_address
from farm.procs.registry import ManagedProcess
from farm.procs.supervise import free_port, local_process, log_tail, spawn

DEFAULT_PROXY = "127.0.0.1:9091"


def proxy_address(device: Device) -> tuple[str, int]:
    text = str(device.options.get("proxy", DEFAULT_PROXY))
    if (address := split_address(text)) is None:
        raise InventoryError(f"device {device.name!r}: proxy {text!r} is not HOST:PORT", 'write proxy = "127.0.0.1:9091"')
    return address


class IOS(DeviceKind):
    name = "ios"
    summary = "an iPhone running TVM's iOS RPC app, which connects out to an RPC proxy (export system-lib)"
    serve_help = "TVM's rpc_proxy for the phone's RPC app (set the proxy address and key in the app)"
    fields = {"proxy": Field("address", f'proxy = "{DEFAULT_PROXY}"', f"where the RPC proxy listens (default {DEFAULT_PROXY})")}
    registers_at_start = False  # the proxy registers the key once the phone's app connects
    example = ('key = "iphone"\ntarget = { kind = "metal" }\nhost = { kind = "llvm", mtriple = "arm64-apple-ios" }\n'
               'export = "system-lib"')

    def export_toolchain(self, device: Device, triple: str) -> str | None:
        """Apple triples link a dylib with Xcode, which only macOS has (and iOS loads none: system-lib)."""
        if not ("apple" in triple or "darwin" in triple or "ios" in triple):
            return None
        if sys.platform != "darwin":
            raise BuildError(
                f"device {device.name!r}: a dynamic library for {triple} needs macOS with Xcode",
                'iOS cannot load dynamic libraries anyway: use export = "system-lib" (objects to link into the app)',
            )
        return "xcode"

    def started_note(self, record: ManagedProcess) -> str:
        return (f"{record.name}: RPC proxy listening on port {record.port}; in the iOS RPC app set that proxy address "
                f"and key {record.key!r}")

    def bring_up(self, device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
        host, port = proxy_address(device)
        log_path = state_dir / f"proxy-{device.name}.log"
        proc = spawn([sys.executable, "-m", "tvm.exec.rpc_proxy", "--host", host, "--port", str(port),
                      "--port-end", str(port + 1), "--web-port", str(free_port(host)), "--tracker", str(tracker)], log_path)
        time.sleep(0.5)
        if proc.poll() is not None:
            raise DeviceError(f"the RPC proxy for {device.name!r} exited at start: {log_tail(str(log_path))}",
                              f"is {host}:{port} taken? set proxy = \"HOST:PORT\" on the device; log: {log_path}")
        return [local_process("server", device.name, device.key, proc.pid, port, str(log_path), "tvm.exec.rpc_proxy")]
