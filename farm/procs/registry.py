"""The processes farm started, on record: ``ManagedProcess`` (with this host's boot and when it started in it),
and the registry (``processes.json`` in a state directory) that changes only through ``update_records``, under a
file lock."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
import time
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Iterator

from farm.errors import FarmError


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
