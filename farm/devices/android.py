"""``android`` devices: phones reached through an adb server, with adbutils.

``farm serve`` brings a phone up like this:

1. connect it (``serial = "HOST:PORT"`` is a network phone: farm runs ``adb connect``);
2. push the RPC server bundle (``farm-rpc-server`` and its libraries) to ``device_dir``,
   skipping files whose size and mtime already match;
3. ``adb reverse tcp:T tcp:T`` for the tracker port T, so the phone reaches the tracker at its
   own 127.0.0.1:T, and ``adb forward tcp:P tcp:P`` for the phone's ``server_port`` P, so the address the
   tracker hands out (127.0.0.1:P on this host) reaches the phone. When the tracker runs on another lab host,
   T is a relay's on this host's loopback (``devices/relay.py``, recorded with role "relay"), and the relay
   offers P on this host's address, which the tracker then hands out. Each phone needs its own ``server_port``;
4. start the server with ``setsid nohup`` on the phone, registered under the device's key, with the
   GPU driver's kernel cache in ``device_dir`` (``--kernel-cache``: cleared for cold first runs),
   and record its PID with a ``python -m farm.devices.adb_shell`` prefix, so ``farm down``, the watchdog
   (``farm serve --watch``) and ``is_running`` act on the phone.

The default bundle is farm's aarch64 build against glibc (``devices/board.py``, with TVM's OpenCL runtime:
``opencl_runtime.board_with_opencl``): it runs
on the stand-in phone under qemu (``launcher``) and on aarch64 Linux. The stand-in's GPU is Debian's arm64
POCL: ``launcher = ["qemu-aarch64", "-L", SYSROOT]`` with the sysroot ``python -m farm.devices.pocl_arm64``
prints (``pocl_arm64.py``). A real Android phone
needs a bionic build of the TVM runtime and server: set ``server_bundle`` to that folder
(docs/devices.md: "Android phones"). Fields: ``serial``, ``server_port`` (both required), ``adb``
(the adb server, default 127.0.0.1:$ANDROID_ADB_SERVER_PORT or 5037), ``device_dir``
(default /data/local/tmp/farm), ``launcher`` (a command prefix, e.g. qemu), ``server_bundle``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.devices.board import SERVER, ensure_board
from farm.devices.kind import PHONE_SOFTWARE, DeviceKind, Fail, Field, software_lines, thread_options
from farm.devices.opencl_runtime import board_with_opencl
from farm.errors import BuildError, DeviceError, InventoryError
from farm.records import Device, TrackerAddress, split_address
from farm.devices.relay import is_loopback, relay_marker, start_relay
from farm.procs.registry import ManagedProcess, load_records
from farm.procs.supervise import free_port, is_running, local_process, stop_process

NEEDS_SERIAL = 'add serial = "SERIAL" (from `farm phones`) and a server_port of its own, e.g. 5001'
DEFAULT_DIR = "/data/local/tmp/farm"
OPENCL_PATHS = ("/vendor/lib64/libOpenCL.so", "/system/vendor/lib64/libOpenCL.so", "/system/lib64/libOpenCL.so")
SOFTWARE_TIMEOUT_S = 2.0  # the measuring process stops waiting sooner (measure.manifest.SOFTWARE_BUDGET_S)
THERMAL = ('for z in /sys/class/thermal/thermal_zone*; do [ -r "$z/temp" ] && '
           'echo "$(cat "$z/type" 2>/dev/null) $(cat "$z/temp")"; done 2>/dev/null')


@dataclass(frozen=True)
class Phone:
    serial: str
    state: str
    model: str = ""
    abi: str = ""
    soc: str = ""
    android: str = ""
    opencl: bool = False
    battery_pct: int | None = None
    battery_temp_c: float | None = None


@contextlib.contextmanager
def adb_errors(what: str):
    """Translate adbutils' and the socket's errors into one DeviceError saying what was being done."""
    from adbutils.errors import AdbError

    try:
        yield
    except (AdbError, OSError) as exc:
        raise DeviceError(f"{what}: adb said {str(exc).strip() or exc.__class__.__name__}",
                          "check `adb devices -l` (the phone is attached and authorized) and the adb server") from exc


def adb_address(device: Device | None = None, given: str | None = None) -> tuple[str, int]:
    """The adb server: ``given`` (--adb), else the device's ``adb`` field, else 127.0.0.1:$ANDROID_ADB_SERVER_PORT/5037."""
    text = str(given or (device.options.get("adb") if device else None)
               or f"127.0.0.1:{os.environ.get('ANDROID_ADB_SERVER_PORT', '5037')}")
    if (address := split_address(text)) is None:
        raise InventoryError(f"adb server address {text!r} is not HOST:PORT",
                             'write --adb 127.0.0.1:5037, or adb = "127.0.0.1:5037" on the device in devices.toml')
    return address


def client(address: tuple[str, int]):
    """An adbutils client of the adb server at ``address``, which must already run.

    Checked with a plain socket first: on a refused connection adbutils would run
    `adb start-server` itself, leaving a daemon nobody started on purpose."""
    import socket

    import adbutils

    try:
        socket.create_connection(address, timeout=3).close()
    except OSError as exc:
        raise DeviceError(f"no adb server answers at {address[0]}:{address[1]} ({exc.strerror or exc.__class__.__name__})",
                          "start one with `adb start-server` (Debian: apt-get install adb), or set adb = \"HOST:PORT\" "
                          "on the device / ANDROID_ADB_SERVER_PORT") from exc
    adb = adbutils.AdbClient(host=address[0], port=address[1], socket_timeout=30)
    with adb_errors(f"asking the adb server at {address[0]}:{address[1]}"):
        adb.server_version()
    return adb


def attach(adb, serial: str, timeout_s: float = 15.0):
    """The adbutils device for ``serial``, connecting network phones; raises DeviceError if it stays away."""
    states = {d.serial: d.get_state() for d in adb.device_list()}
    if ":" in serial and states.get(serial) != "device":  # network adb: (re)connect
        if serial in states:
            adb.disconnect(serial)
        adb.connect(serial, timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        state = {d.serial: d.get_state() for d in adb.device_list()}.get(serial, "absent")
        if state == "device":
            return adb.device(serial)
        if time.monotonic() > deadline:
            raise DeviceError(f"phone {serial} is {state} in adb",
                              "check `adb devices -l`: plug it in, allow USB debugging on the phone, "
                              "or for a network phone check its address and that adbd listens there")
        time.sleep(0.3)


def shell(phone, command: str, timeout_s: float = 30.0) -> str:
    return phone.shell(command, timeout=timeout_s)


def describe(phone) -> Phone:
    props = {name: shell(phone, f"getprop {name}").strip() for name in (
        "ro.product.model", "ro.product.cpu.abi", "ro.soc.model", "ro.board.platform", "ro.build.version.release")}
    opencl = bool(shell(phone, "ls " + " ".join(OPENCL_PATHS) + " 2>/dev/null").strip())
    battery = read_battery(phone)
    return Phone(phone.serial, "device", props["ro.product.model"], props["ro.product.cpu.abi"],
                 props["ro.soc.model"] or props["ro.board.platform"], props["ro.build.version.release"], opencl,
                 battery.get("battery_pct"), battery.get("battery_temp_c"))


def list_phones(address: tuple[str, int]) -> list[Phone]:
    adb = client(address)
    phones = []
    with adb_errors("listing the phones"):
        for entry in adb.device_list():
            state = entry.get_state()
            phones.append(describe(entry) if state == "device" else Phone(entry.serial, state))
    return phones


def read_battery(phone) -> dict[str, Any]:
    fields = dict(re.findall(r"^\s*([\w ]+):\s*(\S+)\s*$", shell(phone, "dumpsys battery"), re.M))
    out: dict[str, Any] = {}
    if fields.get("level", "").isdigit():
        out["battery_pct"] = int(fields["level"])
    if re.fullmatch(r"-?\d+", fields.get("temperature", "")):
        out["battery_temp_c"] = int(fields["temperature"]) / 10.0  # dumpsys reports tenths of a degree
    if fields.get("status", "").isdigit():
        out["charging"] = fields["status"] in ("2", "5")  # BATTERY_STATUS_CHARGING / FULL
    return out


def read_health(device: Device) -> dict[str, Any]:
    """Battery and thermal zones of the phone, for the measurement context and cooldown gates."""
    serial = str(device.options["serial"])
    with adb_errors(f"reading battery and temperatures of phone {serial}"):
        phone = attach(client(adb_address(device)), serial)
        health = read_battery(phone)
        zone_lines = shell(phone, THERMAL).splitlines()
    zones: dict[str, float] = {}
    for line in zone_lines:
        name, _, value = line.strip().rpartition(" ")
        if re.fullmatch(r"-?\d+", value):
            milli = int(value)
            zones[name or f"zone{len(zones)}"] = milli / 1000.0 if abs(milli) > 200 else float(milli)
    health["thermal"] = zones
    return health


def bundle_folder(device: Device) -> Path:
    if device.options.get("server_bundle"):
        folder = Path(str(device.options["server_bundle"])).expanduser()
        if not (folder / SERVER).exists():
            raise InventoryError(f"device {device.name!r}: server_bundle {folder} has no {SERVER}",
                                 "point server_bundle at a folder holding the phone's RPC server and its libraries")
        return folder
    return board_with_opencl(ensure_board().server.parent)


def push_bundle(phone, folder: Path, device_dir: str) -> int:
    """Push what differs; returns how many files were sent."""
    shell(phone, f"mkdir -p {shlex.quote(device_dir)}")
    sent = 0
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        remote = f"{device_dir}/{path.name}"
        local = path.stat()
        info = phone.sync.stat(remote)
        if info.size == local.st_size and int(info.mtime.timestamp()) == int(local.st_mtime):
            continue
        phone.sync.push(str(path), remote, mode=0o755 if path.name == SERVER else 0o644)
        sent += 1
    return sent


def _tracker_port(device: Device, tracker: TrackerAddress, state_dir: Path) -> tuple[int, list[ManagedProcess]]:
    """The port on this host's loopback where the phone's ``adb reverse`` reaches the tracker: the tracker's own
    when it runs here; else a relay's to it (``devices.relay``: the tracker on another lab host; the relay offers
    the phone's forwarded ``server_port`` on this host's address too, where the tracker sends clients), the
    device's running one when it has one (a watchdog's restart), else a new one, returned as a record to keep."""
    if is_loopback(tracker.host):
        return tracker.port, []
    server_port = int(device.options["server_port"])
    for record in load_records(state_dir):  # the device's relay, when it runs, if it relays to where it should
        if record.role == "relay" and record.name == device.name and is_running(record):
            if record.marker == relay_marker(record.port, tracker, server_port):
                return record.port, []
    port = free_port()
    log_path = Path(state_dir) / f"relay-{device.key}.log"
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    proc = start_relay(tracker, port, server_port, log_path)
    return port, [local_process("relay", device.name, device.key, proc.pid, port, str(log_path),
                                relay_marker(port, tracker, server_port))]


def _bring_up(device: Device, tracker: TrackerAddress, serial: str, state_dir: Path) -> list[ManagedProcess]:
    port = int(device.options["server_port"])
    address = adb_address(device)
    phone = attach(client(address), serial)
    device_dir = str(device.options.get("device_dir", DEFAULT_DIR))
    push_bundle(phone, bundle_folder(device), device_dir)
    tracker_port, relay = _tracker_port(device, tracker, state_dir)
    try:
        return [_start_server(device, phone, address, serial, port, tracker_port, device_dir), *relay]
    except BaseException:
        for record in relay:  # a relay started for a server that did not start: not left holding its ports
            stop_process(record)
        raise


def _start_server(device: Device, phone, address: tuple[str, int], serial: str, port: int, tracker_port: int,
                  device_dir: str) -> ManagedProcess:
    phone.reverse(f"tcp:{tracker_port}", f"tcp:{tracker_port}")
    phone.forward(f"tcp:{port}", f"tcp:{port}")
    launcher = " ".join(shlex.quote(str(part)) for part in device.options.get("launcher", []))
    log_path = f"{device_dir}/server-{device.key}.log"
    kernel_cache = f"{device_dir}/kernel-cache-{device.key}"  # the GPU driver's, emptied for a cold first run
    server = (f"{launcher} ./{SERVER} --tracker 127.0.0.1:{tracker_port} --key {shlex.quote(device.key)}"
              f" --host 127.0.0.1 --port {port} --kernel-cache {shlex.quote(kernel_cache)}"
              f" {' '.join(thread_options(device))}").strip()
    started = shell(phone, f"cd {shlex.quote(device_dir)} && (setsid nohup {server} > {shlex.quote(log_path)} 2>&1"
                           f" < /dev/null & echo $!)")
    pid = started.strip().splitlines()[-1:] or [""]
    if not pid[0].isdigit():
        raise DeviceError(f"could not start the RPC server on phone {serial}: {started.strip()[-300:]}",
                          f"run `adb -s {serial} shell` and try: cd {device_dir} && ./{SERVER} --help")
    time.sleep(0.3)
    alive = shell(phone, f"ps -o args= -p {pid[0]}")
    if SERVER not in alive:
        tail = shell(phone, f"tail -n 5 {shlex.quote(log_path)}").strip().replace("\n", " | ")
        raise DeviceError(f"the RPC server on phone {serial} exited at start: {tail}",
                          "a real phone needs a server built for Android (server_bundle); the stand-in needs launcher = qemu")
    remote = [sys.executable, "-m", "farm.devices.adb_shell", address[0], str(address[1]), serial]
    return ManagedProcess("server", device.name, device.key, int(pid[0]), port, f"{serial}:{log_path}", time.time(),
                          SERVER, json.dumps(remote))


class Android(DeviceKind):
    name = "android"
    summary = "an Android phone reached through an adb server (CPU, or its OpenCL GPU)"
    serve_help = ("push farm's RPC server over adb, reverse the tracker port, forward the server port, start it "
                  "(needs serial and server_port)")
    fields = {
        "serial": Field("text", 'serial = "R58M123ABC" or serial = "10.0.0.7:5555"', "the phone's adb serial (farm phones)"),
        "server_port": Field("port", "server_port = 5001", "a port of its own per phone, forwarded from this host to "
                             "the same port on the phone"),
        "adb": Field("address", 'adb = "127.0.0.1:5037"', "the adb server (default 127.0.0.1:$ANDROID_ADB_SERVER_PORT or 5037)"),
        "device_dir": Field("text", f'device_dir = "{DEFAULT_DIR}"',
                            f"where the server lives on the phone (default {DEFAULT_DIR})"),
        "launcher": Field("texts", 'launcher = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]',
                          "a command the server runs under (the emulated stand-in phone)"),
        "server_bundle": Field("text", 'server_bundle = "/path/to/android-arm64-bundle"',
                               "a folder with the phone's RPC server and its libraries (default: farm's aarch64 bundle)"),
    }
    example = ('key = "mate10"\ntarget = { kind = "opencl", device = "mali" }\n'
               'host = { kind = "llvm", mtriple = "aarch64-linux-android" }')

    def validate(self, raw: dict[str, Any], target: dict[str, Any], fail: Fail) -> None:
        """serial and server_port may be left out (then farm compiles for the phone but does not bring it up)."""
        super().validate(raw, target, fail)
        if "serial" in raw and "server_port" not in raw:
            raise fail("server_port", "is missing", f"add {self.fields['server_port'].example}: "
                       f"{self.fields['server_port'].help}")

    def validate_fleet(self, devices: list[Device], path: str) -> None:
        ports: dict[int, str] = {}
        for device in devices:
            if "server_port" not in device.options:
                continue
            other = ports.setdefault(int(device.options["server_port"]), device.name)
            if other != device.name:
                raise InventoryError(
                    f"{path}: devices {other!r} and {device.name!r} share server_port {device.options['server_port']}",
                    "give each phone a server_port of its own: farm forwards that port on this host to the phone")

    def export_toolchain(self, device: Device, triple: str) -> str | None:
        """Android triples link with the NDK's clang++ (``TVM_NDK_CC``), on any kind of device."""
        if "android" not in triple:
            return None
        ndk = os.environ.get("TVM_NDK_CC")
        if not ndk:
            raise BuildError(
                f"device {device.name!r} targets {triple} and no Android NDK compiler is configured",
                "install the Android NDK and set TVM_NDK_CC to its clang++ (e.g. aarch64-linux-android28-clang++), "
                "or set cc in devices.toml",
            )
        return ndk

    def unready(self, device: Device) -> str:
        return "" if "serial" in device.options else NEEDS_SERIAL

    def started_note(self, record: ManagedProcess) -> str:
        if record.role != "relay":
            return ""
        return (f"{record.name}: the tracker runs on another host: the phone reaches it through a relay on this host "
                f"(port {record.port}), and its RPC server is offered on this host's address to the lab's network "
                "(TVM RPC has no authentication: keep the lab's network private)")

    def read_health(self, device: Device) -> dict[str, Any]:
        return read_health(device) if "serial" in device.options else {}

    def software(self, device: Device) -> dict[str, Any]:
        """Its build fingerprint (an OTA update changes it), kernel, CPU governor and SoC, in one adb shell."""
        if "serial" not in device.options:
            return {}
        phone = attach(client(adb_address(device)), str(device.options["serial"]), timeout_s=SOFTWARE_TIMEOUT_S)
        return software_lines(shell(phone, PHONE_SOFTWARE, timeout_s=SOFTWARE_TIMEOUT_S))

    def bring_up(self, device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
        for name in ("serial", "server_port"):
            if name not in device.options:
                raise InventoryError(f"device {device.name!r} (kind android) has no {name}", NEEDS_SERIAL)
        serial = str(device.options["serial"])
        with adb_errors(f"bringing up phone {serial}"):
            return _bring_up(device, tracker, serial, state_dir)
