"""Start TVM's own tracker and rpc_server as managed background processes (procs/: their supervision).

Each process gets its own process group (rpc_server forks workers that inherit stdout), a log file, and a record
in the state directory. Stopping kills only the process groups farm recorded, after checking the PID still runs
what farm started."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

from farm.errors import DeviceError, TrackerError
from farm.records import TrackerAddress
from farm.procs.registry import ManagedProcess, load_records
from farm.procs.supervise import (exit_status, free_port, is_running, local_process, log_tail, signal_name, spawn,
                                  stop_process, stopped_at_end)

log = logging.getLogger("farm.rpc.processes")  # the name its warnings have always carried


LOOPBACK = ("127.0.0.1", "localhost", "::1")
SERVER_MODULE = "farm.rpc.server"
TRACKER_MODULE = "farm.rpc.tracker_server"  # TVM's tracker with a backlog for a fleet's burst of requests


def start_tracker(host: str, port: int, state_dir: Path, timeout_s: float = 20.0,
                  allowed: dict[str, list[str]] | None = None) -> ManagedProcess:
    """Run ``python -m farm.rpc.tracker_server`` (TVM's tracker, listening with a full backlog) on exactly
    ``host:port`` and wait until it answers; with ``allowed`` (``devices.registrations.allowed_sources``), taking each
    key's registrations only from its sources."""
    if host not in LOOPBACK and allowed is None:
        log.warning("binding the tracker to %s: TVM RPC has no authentication, anyone who reaches it can run code "
                    "or register a server under a device's key ([tracker] lab_hosts limits who registers)", host)
    log_path = state_dir / "tracker.log"
    options: list[str] = []
    if allowed is not None:
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        (state_dir / "tracker-allow.json").write_text(json.dumps(allowed, indent=1))
        options = ["--allow", str(state_dir / "tracker-allow.json")]
    proc = spawn([sys.executable, "-m", TRACKER_MODULE, "--host", host, "--port", str(port), *options], log_path)
    record = local_process("tracker", "tracker", "", proc.pid, port, str(log_path), TRACKER_MODULE)
    from farm.rpc.tracker import wait_for_tracker  # here, not above: importing TVM takes seconds, and the
    # device kinds (which every verb's inventory reads) import this module for starting servers

    connect_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise TrackerError(
                f"the tracker exited at start (code {proc.returncode}): {log_tail(str(log_path))}",
                f"is port {port} taken? pick another with --port; log: {log_path}",
            )
        try:
            wait_for_tracker(TrackerAddress(connect_host, port), timeout_s=0.5)
            return record
        except TrackerError as exc:
            if time.monotonic() > deadline:
                stop_process(record)
                raise TrackerError(f"the tracker did not answer on {host}:{port} within {timeout_s:g} s",
                                   f"see {log_path}") from exc


def start_server(
    tracker: TrackerAddress, name: str, key: str, state_dir: Path, host: str = "127.0.0.1", port: int | None = None,
    options: tuple[str, ...] = (),
) -> ManagedProcess:
    """Run ``python -m farm.rpc.server`` (TVM's rpc_server that survives a client killed mid-transfer)
    registered under ``key``, on exactly ``port``; ``options`` go to it (``--load-library``, ``--kernel-cache``,
    ``--threads``).
    Does not wait for registration."""
    port = port or free_port(host)
    log_path = state_dir / f"server-{name}.log"
    proc = spawn([sys.executable, "-m", SERVER_MODULE, "--host", host, "--port", str(port), "--tracker", str(tracker),
                  "--key", key, *options], log_path)
    time.sleep(0.05)
    if proc.poll() is not None:
        raise DeviceError(f"rpc_server for {name!r} exited at start: {log_tail(str(log_path))}", f"see {log_path}")
    return local_process("server", name, key, proc.pid, port, str(log_path), SERVER_MODULE)


def exited_at_start(started: list[ManagedProcess], state_dir: Path | None = None) -> Callable[[set[str]], None]:
    """For ``wait_for_servers``: a DeviceError at once, with its log's last lines (a loader's "cannot open shared
    object file", a taken port), when a server of ``started`` on this host whose key is still missing has exited,
    instead of the registration timeout.

    With ``state_dir`` (the registry `farm down` stops servers from), a server another command stopped meanwhile is
    said to have been stopped, not to have failed (its log is empty: a user would look for a fault that is not
    there): killed by SIGTERM, what ``stop_process`` sends first; or, its record gone from the registry, killed by
    SIGKILL or ended with no status this process can read. A server that exited on its own, or was killed where no
    farm command stops it (no ``state_dir``: a demo's, a bench's), exited at start."""
    servers = [r for r in started if r.role == "server" and not r.remote]

    def check(missing: set[str]) -> None:
        exited = next((r for r in servers if r.key in missing and not is_running(r)), None)
        if exited is None:
            return
        ended = exit_status(exited.pid)  # None: not this process's child, or reaped already
        by = signal_name(ended) if ended is not None and ended < 0 else None
        if state_dir is not None and (by == "SIGTERM" or (ended is None or by == "SIGKILL")
                                      and exited not in load_records(state_dir)):
            how = f"by {by}" if by else "its record was dropped"
            raise DeviceError(f"the server for {exited.name} ({exited.key}) was stopped before it registered ({how})",
                              "another command stopped it (`farm down`, `farm serve --stop`, a kill); run `farm "
                              f"serve` again once that is done (its log: {exited.log_path})")
        raise DeviceError(f"the server for {exited.name} ({exited.key}) exited at start"
                          f"{f' (killed by {by})' if by else ''}: {log_tail(exited.log_path)}", f"its log: {exited.log_path}")
    return check


@contextlib.contextmanager
def private_farm(state_dir: Path, servers: dict[str, str], timeout_s: float = 60.0) -> Iterator[TrackerAddress]:
    """A tracker on a free loopback port plus one local rpc_server per ``{name: key}``, stopped on exit
    (``stopped_at_end``: on SIGTERM too).

    For tools and demos that must not touch anyone's tracker."""
    from farm.rpc.tracker import wait_for_servers

    port = free_port()
    tracker = TrackerAddress("127.0.0.1", port)
    with stopped_at_end() as started:
        started.start(start_tracker, tracker.host, port, state_dir)
        for name, key in servers.items():
            started.start(start_server, tracker, name, key, state_dir)
        counts: dict[str, int] = {}
        for key in servers.values():  # several servers may share a key (a fleet of one kind of device)
            counts[key] = counts.get(key, 0) + 1
        wait_for_servers(tracker, counts, timeout_s=timeout_s, give_up=exited_at_start(started))
        yield tracker
