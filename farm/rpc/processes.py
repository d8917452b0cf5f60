"""Start and stop TVM's own tracker and rpc_server as managed background processes.

Each process gets its own process group (rpc_server forks workers that inherit
stdout), a log file, and a record in the state directory. Stopping kills only the
process groups farm recorded, after checking the PID still runs what farm started.
The records (``processes.json``) change only through ``update_records``, under a file lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil

from farm.errors import DeviceError, FarmError, TrackerError
from farm.records import TrackerAddress

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
SERVER_MODULE = "farm.rpc.server"
TRACKER_MODULE = "farm.rpc.tracker_server"  # TVM's tracker with a backlog for a fleet's burst of requests


@dataclass(frozen=True)
class ManagedProcess:
    role: str  # "tracker" | "server" | "watchdog" | "relay" (a phone's way to a tracker on another host)
    name: str  # device name for servers, "tracker" for the tracker
    key: str
    pid: int
    port: int
    log_path: str
    started_at: float
    marker: str = ""  # a string the process's command line must contain to be ours
    remote: str = ""  # JSON list: the ssh command that reaches the host it runs on ('' = this host)
    boot_id: str = ""  # this host's boot when a local process started ('' = a record written before farm kept it)
    since_boot: float = 0.0  # when it started, in seconds since that boot: a stepped wall clock does not move it

    def expected_marker(self) -> str:
        if self.marker:
            return self.marker
        return "tvm.exec.rpc_tracker" if self.role == "tracker" else "tvm.exec.rpc_server"


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


# What ``spawn`` started in this process, kept until its exit status is read (``_exit_status``, ``_reap``): a dropped
# Popen of a live child goes to Python's list of children the next Popen anywhere in this process reaps, which would
# lose the status (`farm serve` reads it to tell a server another command stopped from one that failed). Ended ones
# are reaped at each spawn and each round of a watchdog (``collect_ended``), which then leaves no zombies; the oldest
# ended ones are forgotten.
_CHILDREN: dict[int, subprocess.Popen] = {}
_ENDED_KEPT = 64


def collect_ended() -> None:
    """Reap what ``spawn`` started that has ended (its status kept for ``_exit_status``, the newest ``_ENDED_KEPT``)."""
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


def boot_id() -> str:
    """This host's boot (``/proc/sys/kernel/random/boot_id``; '' where there is none)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def start_since_boot(pid: int) -> float | None:
    """When ``pid`` started, in seconds since this host booted (``/proc/PID/stat``), or None when it is gone.

    A wall-clock start time (``psutil``'s ``create_time``: boot time + this) moves when the clock is stepped (NTP's
    first sync, a VM restored from a snapshot): a record written before a step would then no longer match its
    process, and ``stop_process`` would leave it running. This does not move."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime in ticks


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


def start_tracker(host: str, port: int, state_dir: Path, timeout_s: float = 20.0,
                  allowed: dict[str, list[str]] | None = None) -> ManagedProcess:
    """Run ``python -m farm.rpc.tracker_server`` (TVM's tracker, listening with a full backlog) on exactly
    ``host:port`` and wait until it answers; with ``allowed`` (``rpc.registrations.allowed_sources``), taking each
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
        ended = _exit_status(exited.pid)  # None: not this process's child, or reaped already
        by = _signal_name(ended) if ended is not None and ended < 0 else None
        if state_dir is not None and (by == "SIGTERM" or (ended is None or by == "SIGKILL")
                                      and exited not in load_records(state_dir)):
            how = f"by {by}" if by else "its record was dropped"
            raise DeviceError(f"the server for {exited.name} ({exited.key}) was stopped before it registered ({how})",
                              "another command stopped it (`farm down`, `farm serve --stop`, a kill); run `farm "
                              f"serve` again once that is done (its log: {exited.log_path})")
        raise DeviceError(f"the server for {exited.name} ({exited.key}) exited at start"
                          f"{f' (killed by {by})' if by else ''}: {log_tail(exited.log_path)}", f"its log: {exited.log_path}")
    return check


EXITING_S = 10.0  # how long an ended child may take to become waitable; a large one unmaps its memory first


def _exit_status(pid: int, wait_s: float = EXITING_S) -> int | None:
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


def _signal_name(returncode: int) -> str:
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


# -- state directory: what farm started, so another farm command can stop it ---------------
#
# The registry is read, changed and rewritten by commands that run at once: `farm serve --watch` (the watchdog),
# `farm serve`, `farm down`, `farm tracker`. A record lost to a concurrent rewrite is a server that `farm down` never
# stops, so every change goes through ``update_records``: it holds an exclusive ``flock`` on ``processes.lock`` while it
# reads, applies the change and replaces the file (a temp file of its own + ``os.replace``: readers never see half a
# file). The lock is held for that only, never across a bring-up (minutes for a phone): a command reads, brings up,
# then states its change as a function of the registry as it is then.

REGISTRY_LOCK_TIMEOUT_S = 30.0  # a holder reads, changes and writes a small file: milliseconds; 30 s means it hangs
REGISTRY_DELAY_ENV = "FARM_TEST_REGISTRY_DELAY_S"  # test hook: seconds to sleep between read and write in
# update_records, so a test of concurrent commands cannot pass by luck (tests/test_processes.py)


def state_file(state_dir: Path) -> Path:
    return state_dir / "processes.json"


def lock_file(state_dir: Path) -> Path:
    return state_dir / "processes.lock"


def load_records(state_dir: Path) -> list[ManagedProcess]:
    """The records as they are now (read-only: to change them, ``update_records``). A missing file is no records;
    a corrupt one is a FarmError, never read as empty: the servers it lists would be forgotten, still running."""
    path = state_file(state_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise _corrupt(path, "", f"it cannot be read ({exc})") from exc
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise _corrupt(path, text, f"it is not valid JSON ({exc})") from exc
    if not isinstance(items, list):
        raise _corrupt(path, text, f"it holds a JSON {type(items).__name__}, not a list of records")
    return [_record_of(path, text, n, item) for n, item in enumerate(items)]


_FIELD_TYPES = {f.name: {"str": (str,), "int": (int,), "float": (int, float)}[str(f.type)]
                for f in fields(ManagedProcess)}
_REQUIRED = {f.name for f in fields(ManagedProcess) if f.default is MISSING}


def _record_of(path: Path, text: str, n: int, item: object) -> ManagedProcess:
    if not isinstance(item, dict):
        raise _corrupt(path, text, f"record {n} is a JSON {type(item).__name__}, not an object")
    missing = sorted(_REQUIRED - item.keys())
    unknown = sorted(item.keys() - _FIELD_TYPES.keys())
    wrong = sorted(k for k, v in item.items() if k in _FIELD_TYPES
                   and (isinstance(v, bool) or not isinstance(v, _FIELD_TYPES[k])))
    if missing or unknown or wrong:
        what = "; ".join(f"{label} {', '.join(names)}" for label, names in
                         (("lacks", missing), ("has unknown fields", unknown), ("has wrongly typed", wrong)) if names)
        raise _corrupt(path, text, f"record {n} {what}")
    return ManagedProcess(**item)


def _corrupt(path: Path, text: str, what: str) -> FarmError:
    pids = sorted({int(p) for p in re.findall(r'"pid"\s*:\s*"?(\d+)', text)})
    listed = f"the pids it lists ({', '.join(map(str, pids))}) lead" if pids else "each server farm started leads"
    return FarmError(
        f"{path} is not a valid process registry: {what}",
        f"farm will not guess which processes it started, so it stops nothing; {listed} its own process group: "
        "find them with `ps -eo pid,pgid,cmd | grep -e farm -e tvm.exec`, stop each with `kill -- -PGID`, "
        f"then move {path} aside (remote servers: the same on their host)")


def update_records(state_dir: Path, change: Callable[[list[ManagedProcess]], list[ManagedProcess]]
                   ) -> list[ManagedProcess]:
    """Apply ``change`` to the records under the registry's lock and write its result; returns it.

    ``change`` gets the records as they are under the lock and must be quick and pure (no bring-up, no remote
    check): it is the one place a command says what it adds, drops or replaces. Raises FarmError when the registry is
    corrupt (nothing is written) or another command held the lock for over ``REGISTRY_LOCK_TIMEOUT_S``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with _locked(lock_file(state_dir)):
        records = load_records(state_dir)
        if delay_s := float(os.environ.get(REGISTRY_DELAY_ENV) or 0):
            time.sleep(delay_s)
        changed = list(change(list(records)))
        if changed != records:
            _write_atomically(state_file(state_dir), json.dumps([asdict(r) for r in changed], indent=2))
        return changed


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + REGISTRY_LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise FarmError(f"another farm command has held {path} for over {REGISTRY_LOCK_TIMEOUT_S:g} s",
                                    f"see which one with `fuser -v {path}`; end it if it hangs, then run this again") from None
                time.sleep(0.01)
        yield  # closing the descriptor releases the lock, also when the process dies
    finally:
        os.close(fd)


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # what the registry had before it was written through a temp file (mkstemp's is 0600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
