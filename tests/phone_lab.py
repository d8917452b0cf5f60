"""The stand-in phone (tests/standin_phone.py) in a network namespace of its own with this host's own adb server
(``standin_phone``), its inventory table, and the whole lab path of a phone on another host (``phone_lab``): what
tests/test_android.py asserts and ``tools/bench_lab.py --phones`` measures, written once.

Needs root + iproute2 (namespaces), Debian's `adb`, qemu-user, the aarch64 g++ and PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from farm.procs.supervise import free_port
from tests.conftest import REPO, network_namespace, running_postgres, write_inventory

CPU_TARGET = 'target = { kind = "llvm", mtriple = "aarch64-linux-gnu" }\n'


def wait_until(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


@contextmanager
def standin_phone(work: Path) -> Iterator[tuple[str, str]]:
    """(serial, adb "HOST:PORT"): a stand-in phone in its own namespace, and our own adb server; logs in ``work``."""
    adb_port = free_port()
    env = {**os.environ, "ADB_MDNS": "0", "ANDROID_SDK_HOME": str(work / "adb-home")}
    started: list[subprocess.Popen] = []
    with network_namespace("farmph", 214) as (ns, _, phone_addr):
        try:
            with open(work / "phone.log", "wb") as log:
                started.append(subprocess.Popen(
                    ["ip", "netns", "exec", ns, sys.executable, str(REPO / "tests" / "standin_phone.py"),
                     "--listen", f"{phone_addr}:5555", "--system", str(work / "phone-system")],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
            with open(work / "adb.log", "wb") as log:
                started.append(subprocess.Popen(["adb", "-P", str(adb_port), "nodaemon", "server"], stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                                start_new_session=True))
            wait_until(lambda: "listening" in (work / "phone.log").read_text(), 60, "the stand-in phone")
            # a socket, not `adb devices`: the adb client would start a daemon of its own if it came first
            wait_until(lambda: port_open(adb_port), 60, "the adb server")
            yield f"{phone_addr}:5555", f"127.0.0.1:{adb_port}"
        finally:
            for proc in reversed(started):
                stop_group(proc)


def standin_phone_table(name: str, key: str, phone: tuple[str, str], device_dir, root: str = "/usr/aarch64-linux-gnu",
                        rest: str = CPU_TARGET) -> str:
    """devices.toml's [devices.NAME] for the stand-in phone: its server under qemu with ``root``'s libraries, its
    data in ``device_dir``; ``rest``: the target and any other fields."""
    serial, adb = phone
    return (f'\n[devices.{name}]\nkind = "android"\nkey = "{key}"\nserial = "{serial}"\nadb = "{adb}"\n'
            f'server_port = {free_port()}\ndevice_dir = "{device_dir}"\nlauncher = ["qemu-aarch64", "-L", "{root}"]\n'
            f"emulated = true\n{rest}")


@dataclass
class PhoneLab:
    """What ``phone_lab`` saw: each step's exit and output, the sweep's JSON, host B's worker log, the relay's
    record, and each step's seconds."""

    steps: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)
    sweep: dict = field(default_factory=dict)
    measured: str = ""
    relay: dict = field(default_factory=dict)
    tracker_port: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def failed(self) -> str:
        """The first step that failed, with its output's end; '' when none did."""
        for name, step in self.steps.items():
            if step.returncode != 0:
                return f"{name} exited {step.returncode}: {(step.stderr or '')[-3000:]}"
        return ""


def phone_lab(work: Path, phone: tuple[str, str], env: dict[str, str]) -> PhoneLab:
    """The whole lab path of a phone on another host (#30). Host A (a network namespace) runs the lab's tracker,
    queues a sweep and builds its artifacts (`farm worker --builds`); host B (this one) has the phone on its own
    adb, a local CPU device and the PostgreSQL, and no tracker. `farm serve` on B relays the phone to A's tracker;
    B's `farm worker` measures both cells of A's sweep with A's artifacts, read from the database; `farm down` on
    B stops the phone's server, then its relay. ``env``: this host's FARM_HOME (and anything else)."""
    lab = PhoneLab()
    with network_namespace("farmtr", 215) as (ns, host_addr, tracker_addr):
        tracker_port = lab.tracker_port = free_port()
        devices = standin_phone_table("phone", "far-phone", phone, work / "phone-data" / "farm",
                                      rest=CPU_TARGET + 'max_cooldown_s = 5\nlab_host = "labB"\n')
        devices += ('\n[devices.b-cpu]\nkind = "local"\nkey = "b-cpu"\nlab_host = "labB"\n'
                    'target = { kind = "llvm", num-cores = 1 }\n')
        inventory = write_inventory(work / "devices.toml", devices, tracker_port, tracker_addr)
        with running_postgres(f"127.0.0.1,{host_addr}", f"{tracker_addr}/32") as server:
            import psycopg

            with psycopg.connect(f"{server}/postgres", autocommit=True) as db:
                db.execute("CREATE DATABASE lab")
            here = {**os.environ, **env, "FARM_DEVICES": str(inventory), "FARM_DB": f"{server}/lab"}
            there = {**here, "FARM_HOME": str(work / "home-a"),
                     "FARM_DB": f"postgresql://farm@{host_addr}:{server.rsplit(':', 1)[1]}/lab"}

            def step(name: str, *args: str, on_a: bool = False, timeout: float = 300) -> bool:
                """One farm command on A or B, recorded; a timeout is a failed step (exit -1), never an exception."""
                start = time.monotonic()
                command = [*(["ip", "netns", "exec", ns] if on_a else []), sys.executable, "-m", "farm.cli", *args]
                try:
                    lab.steps[name] = subprocess.run(command, env=there if on_a else here, cwd=REPO,
                                                     capture_output=True, text=True, timeout=timeout)
                except subprocess.TimeoutExpired as exc:
                    lab.steps[name] = subprocess.CompletedProcess(command, -1, str(exc.stdout or ""),
                                                                  f"timed out after {timeout:g} s")
                lab.seconds[name] = round(time.monotonic() - start, 1)
                return lab.steps[name].returncode == 0

            worker = None
            try:
                if not step("tracker on A", "tracker", "start", "--host", tracker_addr, on_a=True):
                    return lab
                if not step("serve on B", "serve", "--json"):
                    return lab
                records = json.loads(Path(env["FARM_HOME"], "processes.json").read_text())
                lab.relay = next((r for r in records if r["role"] == "relay"), {})
                if not step("sweep queued on A", "sweep", "--model", "mlp", "--reference", "none", "--repeat", "3",
                            "--min-repeat-ms", "5", "--no-report", "--detach", "--json", on_a=True):
                    return lab
                sweep_id = json.loads(lab.steps["sweep queued on A"].stdout)["sweep_id"]
                if not step("builds on A", "worker", "--builds", "--until-empty", "--progress", on_a=True, timeout=600):
                    return lab
                start = time.monotonic()
                with open(work / "worker-b.log", "wb") as log:
                    worker = subprocess.Popen([sys.executable, "-m", "farm.cli", "worker", "--lab-host", "labB",
                                               "--progress"], env=here, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True)
                if step("sweep followed on A", "sweep", "--resume", str(sweep_id), "--no-report", "--json", on_a=True,
                        timeout=900):
                    lab.sweep = json.loads(lab.steps["sweep followed on A"].stdout)
                lab.seconds["cells measured on B"] = round(time.monotonic() - start, 1)
            finally:
                if worker is not None:
                    stop_group(worker)
                step("down on B", "down", "--json")
                step("down on A", "down", on_a=True)
                if (work / "worker-b.log").exists():
                    lab.measured = (work / "worker-b.log").read_text(errors="replace")
    return lab
