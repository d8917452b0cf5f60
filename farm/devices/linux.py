"""``linux`` devices (Jetson, boards): bring TVM's rpc_server up over SSH.

``farm serve`` runs ``REMOTE_PYTHON -m tvm.exec.rpc_server`` on the board through ssh, in its
own session (setsid) with its output in a log file there, registered with the tracker under
the device's key; ``farm down`` kills that process group over ssh. Artifacts travel over the
RPC session itself (upload), so nothing else is copied. The board needs Python with
apache-tvm (the aarch64 wheel) and cloudpickle; ssh must log in without a password (a key).

Fields: ``ssh = "user@host:port"`` (port optional), ``ssh_key`` (identity file, optional),
``remote_python`` (default ``python3``), ``server_port`` (default 9090), ``ssh_options`` (extra
ssh arguments, e.g. ``["-o", "UserKnownHostsFile=/path"]``).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from farm.devices.kind import BOARD_SOFTWARE, DeviceKind, Field, software_lines
from farm.errors import DeviceError, InventoryError
from farm.records import Device, TrackerAddress, threads_setting
from farm.procs.registry import ManagedProcess


def ssh_command(device: Device) -> tuple[list[str], str]:
    """The ssh prefix that reaches the board, and the board's host name."""
    target = device.options.get("ssh")
    if not target:
        raise InventoryError(f"device {device.name!r} (kind linux) has no ssh address",
                             'add ssh = "user@host" (or "user@host:port") to the device in devices.toml')
    user_host, _, port = str(target).partition(":")
    host = user_host.rpartition("@")[2]
    command = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=10"]
    if port:
        command += ["-p", port]
    if device.options.get("ssh_key"):
        command += ["-i", str(Path(str(device.options["ssh_key"])).expanduser())]
    command += [str(option) for option in device.options.get("ssh_options", [])]
    return command + [user_host], host


class Linux(DeviceKind):
    name = "linux"
    summary = "a Linux board (Jetson, Raspberry Pi) with Python and apache-tvm, reached over ssh"
    threads_by_env = True
    serve_help = "TVM's rpc_server on the board over ssh (setsid, log on the board); farm down kills it over ssh"
    fields = {
        "ssh": Field("text", 'ssh = "user@host" (or "user@host:port")', "how ssh reaches the board (a key, no password)"),
        "ssh_key": Field("text", 'ssh_key = "~/.ssh/id_ed25519"', "the identity file (default: ssh's own)"),
        "ssh_options": Field("texts", 'ssh_options = ["-o", "UserKnownHostsFile=/path"]', "extra ssh arguments"),
        "remote_python": Field("text", 'remote_python = "/opt/venv/bin/python"', "the board's Python with apache-tvm "
                               "(default python3)"),
        "server_port": Field("port", "server_port = 9090", "the server's port on the board (default 9090)"),
        "server_host": Field("text", 'server_host = "192.168.1.20"', "the one address the board's server binds "
                             "(default: the board's address on the route to the tracker); never every address"),
    }
    example = 'key = "tx2"\ntarget = { kind = "cuda", arch = "sm_62" }\nhost = { kind = "llvm", mtriple = "aarch64-linux-gnu" }'

    def prerequisites(self) -> str:
        return "" if shutil.which("ssh") else "install an ssh client (apt-get install openssh-client)"

    def registers_from(self, device: Device) -> tuple[str, ...]:
        """The board itself: its ssh host (the address its server claims, ``--custom-addr``) and its server_host."""
        if not device.options.get("ssh"):
            return ()
        return tuple(dict.fromkeys(str(n) for n in (ssh_command(device)[1], device.options.get("server_host")) if n))

    def unready(self, device: Device) -> str:
        return "" if device.options.get("ssh") else 'add ssh = "user@host" to bring the board up with farm serve'

    def software(self, device: Device) -> dict[str, Any]:
        """Its kernel, distribution, CPU governor, CPU and GPU driver (nvidia-smi, or a Jetson's L4T release), in one
        ssh round trip."""
        if not device.options.get("ssh"):
            return {}
        ssh, _ = ssh_command(device)
        done = subprocess.run([*ssh, BOARD_SOFTWARE], capture_output=True, text=True, timeout=5,
                              stdin=subprocess.DEVNULL)
        return software_lines(done.stdout) if done.returncode == 0 else {}

    def bring_up(self, device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
        ssh, host = ssh_command(device)
        python = str(device.options.get("remote_python", "python3"))
        port = int(device.options.get("server_port", 9090))
        log = f"/tmp/farm-rpc-{device.key}.log"
        threads = threads_setting(device)  # TVM's stock server: the thread count goes in through its environment
        env = f"env TVM_NUM_THREADS={threads or '$(nproc)'} "  # nproc: the board's online CPUs (THREADS_RULE)
        # the board's one address, never every one (#62): server_host, else its address on the route to the tracker,
        # read on the board (its own name may resolve to 127.0.1.1 there, as on Ubuntu and L4T)
        route = (f"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                 f"s.connect(({tracker.host!r}, {tracker.port})); print(s.getsockname()[0])")
        bind = shlex.quote(str(device.options["server_host"])) if device.options.get("server_host") else \
            f"$({shlex.quote(python)} -c {shlex.quote(route)})"
        server = (f"{env}{shlex.quote(python)} -m tvm.exec.rpc_server --tracker {tracker} --key {shlex.quote(device.key)}"
                  f" --host {bind} --port {port} --port-end {port + 1} --custom-addr {shlex.quote(host)}")
        remote = f"setsid nohup {server} > {log} 2>&1 < /dev/null & echo $!"
        try:
            done = subprocess.run([*ssh, remote], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise DeviceError(f"ssh to {device.name!r} ({host}) timed out",
                              "check the ssh address and that the board is up") from exc
        if done.returncode != 0 or not done.stdout.strip().isdigit():
            reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise DeviceError(f"could not start the rpc_server on {device.name!r} over ssh: {reason}",
                              "check: ssh works without a password (ssh_key), and remote_python has apache-tvm")
        return [ManagedProcess("server", device.name, device.key, int(done.stdout.strip()), port,
                               f"{host}:{log}", time.time(), "tvm.exec.rpc_server", json.dumps(ssh))]
