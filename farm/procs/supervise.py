"""Process supervision: start a process in its own group with a log (``spawn``, ``free_port``), tell whether a
recorded one still runs what farm started (``is_running``, ``process_state``), stop only those (``stop_process``:
its process group, after checking its PID), and stop what a command started when it ends, on SIGTERM too
(``stopped_at_end``). Used by the tracker's and servers' launch (rpc/launch.py) and by the device kinds."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil

from farm.errors import DeviceError
from farm.procs.registry import ManagedProcess, boot_id, start_since_boot

log = logging.getLogger("farm.rpc.processes")  # the name its warnings have always carried


_HANDED_OUT: set[int] = set()  # ports free_port gave this process: a server may not have bound its port yet
_HANDED_OUT_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, and one this process has not handed out before: servers started one after
    another bind their ports later, and the kernel may offer a just-released port again."""
    with _HANDED_OUT_LOCK:
        while True:
            with socket.socket() as sock:
                sock.bind((host, 0))
                port = sock.getsockname()[1]
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port


# What ``spawn`` started in this process, kept until its exit status is read (``exit_status``, ``_reap``): a dropped
# Popen of a live child goes to Python's list of children the next Popen anywhere in this process reaps, which would
# lose the status (`farm serve` reads it to tell a server another command stopped from one that failed). Ended ones
# are reaped at each spawn and each round of a watchdog (``collect_ended``), which then leaves no zombies; the oldest
# ended ones are forgotten.
_CHILDREN: dict[int, subprocess.Popen] = {}
_ENDED_KEPT = 64


def collect_ended() -> None:
    """Reap what ``spawn`` started that has ended (its status kept for ``exit_status``, the newest ``_ENDED_KEPT``)."""
    ended = [pid for pid, child in list(_CHILDREN.items()) if child.poll() is not None]
    for pid in ended[:max(0, len(ended) - _ENDED_KEPT)]:
        _CHILDREN.pop(pid, None)


def spawn(command: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``command`` in its own process group (session), output appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    collect_ended()
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, **(env or {})},
        )
    _CHILDREN[proc.pid] = proc
    return proc


def local_process(role: str, name: str, key: str, pid: int, port: int, log_path: str, marker: str,
                  started_at: float | None = None) -> ManagedProcess:
    """The record of a process farm started on this host, with what identifies it across clock steps."""
    return ManagedProcess(role, name, key, pid, port, log_path, time.time() if started_at is None else started_at,
                          marker, boot_id=boot_id(), since_boot=start_since_boot(pid) or 0.0)


def own_record(role: str, marker: str) -> ManagedProcess:
    """This process's record (the watchdog's), with its start time as ``is_running`` compares it."""
    return local_process(role, role, "", os.getpid(), 0, "", marker, psutil.Process().create_time())


def log_tail(path: str, lines: int = 5) -> str:
    try:
        return " | ".join(Path(path).read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _on_remote(record: ManagedProcess, command: str, timeout_s: float = 15.0) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run([*json.loads(record.remote), command], capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (subprocess.TimeoutExpired, OSError):
        return None


CHECKED = "farm-checked"  # echoed after a remote check: adb's raw shell has no exit code, only output


def process_state(record: ManagedProcess) -> str:
    """``running`` (the PID runs what farm started there), ``gone``, or ``unknown``: the remote host did not answer
    (ssh or adb failed, or timed out), so nobody can tell; a watchdog must not restart such a server."""
    if record.remote:
        done = _on_remote(record, f"ps -o args= -p {record.pid}; echo {CHECKED}")
        if done is None or CHECKED not in done.stdout:
            return "unknown"
        return "running" if record.expected_marker() in done.stdout else "gone"
    try:
        proc = psutil.Process(record.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return "gone"
        cmdline = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    return "running" if record.expected_marker() in cmdline and _same_start(record, proc) else "gone"


def _same_start(record: ManagedProcess, proc: psutil.Process) -> bool:
    """Whether ``proc`` is the process ``record`` was written for, not another that reuses its PID: the same boot
    and start (``start_since_boot``); a record without them (written by an older farm) by its wall-clock start."""
    if not record.boot_id:
        return abs(proc.create_time() - record.started_at) < 60
    started = start_since_boot(record.pid)
    return record.boot_id == boot_id() and started is not None and abs(started - record.since_boot) < 1.0


def is_running(record: ManagedProcess) -> bool:
    """True when the PID is alive and still runs the TVM module farm started there."""
    return process_state(record) == "running"


EXITING_S = 10.0  # how long an ended child may take to become waitable; a large one unmaps its memory first


def exit_status(pid: int, wait_s: float = EXITING_S) -> int | None:
    """How ``pid`` ended, as Popen's returncode has it (its exit code, or minus the signal that killed it), when
    ``spawn`` started it in this process and its status was not read yet (reading it); else None. Called once
    ``is_running`` said it is gone, which it says as soon as a killed process's command line is empty: while the
    kernel still frees its memory, before it can be waited for (under load, long enough for a `farm serve` to miss
    the SIGTERM of a concurrent `farm down`). So the child is waited for, up to ``wait_s``."""
    child = _CHILDREN.get(pid)
    if child is None:
        return None
    try:
        code = child.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return None
    _CHILDREN.pop(pid, None)
    return code


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:  # a real-time signal has no name
        return f"signal {-returncode}"


def stop_process(record: ManagedProcess, grace_s: float = 3.0) -> bool:
    """Kill the process group farm started; returns False when it was already gone.

    A remote one is killed through its recorded command prefix (ssh, adb) and checked afterwards: DeviceError when
    its host did not answer or it still runs, so the caller keeps its record for another try."""
    if record.remote:
        return _stop_remote(record, grace_s)
    if not is_running(record):
        return False
    try:
        pgid = os.getpgid(record.pid)
    except ProcessLookupError:
        return False
    if pgid != record.pid:  # started with start_new_session, so it leads its own group
        log.warning("pid %d is not the leader of its process group; not killing the group", record.pid)
        return False
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(record.pid)
        if not _group_alive(pgid):
            break
        time.sleep(0.05)
    else:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _reap(record.pid)
    return True


def _stop_remote(record: ManagedProcess, grace_s: float) -> bool:
    where = f"{record.name}'s host" if record.role == "server" else "its host"
    hint = f"check that {where} is reachable (`farm phones` for a phone, ssh for a board), then run `farm down` again"
    state = process_state(record)
    if state == "gone":
        return False
    if state == "unknown":
        raise DeviceError(f"could not reach {where} to stop {record.role} pid {record.pid}", hint)
    # started with setsid there: its PID is its process group. `kill -s SIG -- -PGID` is the POSIX form, the one
    # that works in dash and mksh too (dash refuses `kill -TERM -- -PGID`)
    _on_remote(record, f"kill -s TERM -- -{record.pid}; sleep {grace_s:g}; kill -s KILL -- -{record.pid} 2>/dev/null;"
                       " true", timeout_s=grace_s + 15)
    state = process_state(record)
    if state != "gone":
        raise DeviceError(f"{record.role} pid {record.pid} on {where} "
                          + ("did not answer after the kill" if state == "unknown" else "still runs after TERM and KILL"),
                          hint)
    return True


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs. Zombies do not count: a process whose parent is not farm (a
    watchdog started from a shell or a test) stays one until that parent reaps it."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def _reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is this process's child and has ended; the status is not kept."""
    if (child := _CHILDREN.get(pid)) is not None:
        reaped_before = child.returncode is not None  # then the pid may be another child's now: wait for it too
        if child.poll() is not None:
            _CHILDREN.pop(pid, None)
        if not reaped_before:
            return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # `kill PID`, a CI job's timeout; a closed terminal


class _Ending:
    """The ending signal ``stopped_at_end`` caught (0: none yet), and whether a start is under way (``Started.start``:
    the signal is raised once what it started is listed)."""

    signum = 0
    holding = False


def _ignore_ending() -> None:
    """The ending signals ``stopped_at_end`` handles, ignored from now (the stopping runs to its end); those it left
    alone (ignored already, or handled outside Python) stay as they were."""
    for ending in ENDING_SIGNALS:
        if signal.getsignal(ending) is _end_here:
            signal.signal(ending, signal.SIG_IGN)


def _end_here(signum: int, frame) -> None:
    _Ending.signum = _Ending.signum or signum
    if not _Ending.holding:
        _ignore_ending()  # another one while the SystemExit unwinds: the stopping still runs
        raise SystemExit(128 + signum)


class Started(list):
    """What a command started (``stopped_at_end``'s list)."""

    def start(self, begin: Callable[..., ManagedProcess | list[ManagedProcess]], *args: Any) -> None:
        """``begin(*args)`` (``start_tracker``, ``start_server``, ``devices.bring_up``), what it returns listed. A start
        waits seconds for its process: an ending signal meanwhile is raised once that process is listed, never
        between its spawn and its record (it would run on, unlisted)."""
        _Ending.holding = True
        try:
            got = begin(*args)
            self.extend(got if isinstance(got, list) else [got])
        finally:
            _Ending.holding = False
        if _Ending.signum:
            raise SystemExit(128 + _Ending.signum)


@contextlib.contextmanager
def stopped_at_end() -> Iterator[Started]:
    """A list for the processes a command starts and does not record (``Started.start``); each is stopped, last
    first, however the block ends. They lead process groups of their own, so a signal to the command's group never
    reaches them: while the block runs, SIGTERM and SIGHUP (unless ignored, as under nohup) end the command through
    SystemExit, in the main thread, so the stopping runs; meanwhile they are ignored. Ended so, it exits as that
    signal's shell status (128 + its number), even where TVM turned the SystemExit into an error on its way out of
    a callback (a tuning session's builder or runner)."""
    handlers: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():  # only the main thread may set a handler
        handlers = {s: signal.getsignal(s) for s in ENDING_SIGNALS  # None: set outside Python, left alone
                    if signal.getsignal(s) not in (signal.SIG_IGN, None)}
    _Ending.signum, _Ending.holding = 0, False
    started = Started()
    try:
        for ending in handlers:
            signal.signal(ending, _end_here)
        yield started
    finally:
        _ignore_ending()  # the stopping finishes, whatever signal comes meanwhile
        try:
            for record in reversed(started):
                stop_process(record)
        finally:
            for ending, handler in handlers.items():
                signal.signal(ending, handler)
        if _Ending.signum:
            raise SystemExit(128 + _Ending.signum)
