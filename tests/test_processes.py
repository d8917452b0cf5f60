"""The process registry ($FARM_HOME/processes.json) under farm commands that run at once.

A record lost to a concurrent rewrite is a server `farm down` never stops; a registry farm cannot read is refused,
never read as empty (that too would forget every server in it). The concurrency test runs with a delay between
each command's read and write of the registry (``FARM_TEST_REGISTRY_DELAY_S``), so it cannot pass by luck.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from farm.errors import FarmError
from farm.records import TrackerAddress
from farm.procs.registry import ManagedProcess
from farm.procs.supervise import free_port, stop_process
from farm.rpc.launch import start_tracker
from tests.conftest import run_farm, unreachable_phone, write_inventory

DELAY_ENV = "FARM_TEST_REGISTRY_DELAY_S"  # processes.REGISTRY_DELAY_ENV, spelled out: this test also runs on code
# from before the hook, where the delay was put into load_records by hand to show the records it lost
ROUNDS = 10  # each a serve and a down of both loops, overlapping (DELAY_S): a lost record shows in a few
DELAY_S = 0.2  # between a command's read and its write: far longer than a write, so unlocked writers overlap


def local_devices(*names: str) -> str:
    return "".join(f'\n[devices.{n}]\nkind = "local"\nkey = "reg-{n}"\ntarget = {{ kind = "llvm" }}\n' for n in names)


@pytest.fixture(scope="module")
def tracker(tmp_path_factory) -> TrackerAddress:
    """A private tracker, not in any registry the tests touch (so `farm down` leaves it)."""
    port = free_port()
    record = start_tracker("127.0.0.1", port, tmp_path_factory.mktemp("tracker"))
    try:
        yield TrackerAddress("127.0.0.1", port)
    finally:
        stop_process(record)


def server_groups(tracker: TrackerAddress) -> set[int]:
    """The process groups of farm's servers registering with ``tracker`` (a server and its forked workers share one;
    farm starts each server as its group's leader, so the group is the pid farm records)."""
    groups = set()
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if proc.info["status"] != psutil.STATUS_ZOMBIE and "farm.rpc.server" in cmdline and str(tracker) in cmdline:
                groups.add(os.getpgid(proc.pid))
        except (ProcessLookupError, psutil.Error):
            continue
    return groups


def recorded_servers(home: Path) -> set[int]:
    path = home / "processes.json"
    return {r["pid"] for r in json.loads(path.read_text()) if r["role"] == "server"} if path.exists() else set()


def still_serving(pid: int, tracker: TrackerAddress) -> bool:
    """Whether ``pid`` runs one of farm's servers for ``tracker`` still (not a zombie, not a reused pid)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and str(tracker) in proc.cmdline()
    except psutil.Error:
        return False


# the watchdog: farm's `watch` loop in a process of its own, over device w only. It is not recorded as `farm serve
# --watch` would record it, so the loops' `farm down` leaves it watching (and restarting w) the whole time
WATCHDOG = """
import signal, sys, threading
from pathlib import Path
from farm.devices import watch
from farm.inventory import load_inventory
inventory = load_inventory(sys.argv[1])
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
print("watching", flush=True)
restarts = watch({"w": inventory.devices["w"]}, inventory.tracker, Path(sys.argv[2]), 0.2, stop,
                 on_event=lambda text: print(text, flush=True))
print(f"restarts {restarts}", flush=True)
"""


def test_watchdog_serve_and_down_at_once_lose_no_server(tracker, tmp_path, farm_env):
    """A watchdog restarts w while two loops run `farm serve` then `farm down` ROUNDS times each, from processes of
    their own (one serves a and w, so the watchdog has a w to watch after each down; the other serves b). Every
    server still running at the end is recorded, and the last `farm down` leaves none running."""
    inventory = write_inventory(tmp_path / "devices.toml", local_devices("w", "a", "b"), tracker.port)
    home = Path(farm_env["FARM_HOME"])
    env = {**farm_env, "FARM_DEVICES": str(inventory), DELAY_ENV: str(DELAY_S)}
    watch_log = tmp_path / "watch.log"
    watchdog = None
    seen: set[int] = set()  # every server pid the test saw, recorded or running

    def serve(*devices: str) -> None:
        # --wait 0: the registry, not registration, is under test (a server takes seconds to import TVM and register);
        # its record is written before the wait, which then fails with exit 1 and this line alone; or, when the
        # other loop's `farm down` stopped the new server during that wait, a line that says so
        proc = run_farm("serve", *[f"--device={d}" for d in devices], "--wait", "0", env=env, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 0 or (proc.returncode == 1 and len(lines) == 2 and (
            (lines[0].startswith("error: servers for ") and "did not register" in lines[0])
            or (lines[0].startswith("error: the server for ") and "was stopped before it registered" in lines[0]))), \
            proc.stderr

    def down() -> None:
        proc = run_farm("down", "--json", env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        seen.update(r["pid"] for r in json.loads(proc.stdout)["stopped"] if r["role"] == "server")

    def loop(*devices: str) -> None:
        for _ in range(ROUNDS):
            serve(*devices)
            seen.update(recorded_servers(home))
            down()

    try:
        serve("w")
        with open(watch_log, "wb") as log:
            watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG, str(inventory), str(home)], stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **env},
                                        start_new_session=True)
        with ThreadPoolExecutor(2) as pool:
            for done in [pool.submit(loop, "a", "w"), pool.submit(loop, "b")]:
                done.result()
        watchdog.send_signal(signal.SIGTERM)  # it ends after the restart it may be making, recorded
        assert watchdog.wait(timeout=60) == 0, watch_log.read_text()
        running, recorded = server_groups(tracker), recorded_servers(home)
        seen |= running | recorded
        down()
        left = server_groups(tracker)
        events = watch_log.read_text()
        counts = (f"{len(running)} server(s) running after the loops, {len(running - recorded)} of them unrecorded; "
                  f"{len(left)} left running after the last `farm down`; {len(seen)} servers seen; watchdog: "
                  f"{events.count('; restarted as pid')} restart(s) recorded, {events.count('its restart, pid')} "
                  "stopped as `farm down` had dropped their record")
        print(counts)
        assert not running - recorded and not left, counts
        assert not [pid for pid in seen if still_serving(pid, tracker)], counts
    finally:
        if watchdog is not None and watchdog.poll() is None:
            os.killpg(watchdog.pid, signal.SIGKILL)
            watchdog.wait()
        for group in server_groups(tracker):  # what a failed run left: servers of this test's private tracker
            os.killpg(group, signal.SIGKILL)


def test_a_server_another_command_stopped_is_said_stopped_not_failed(tracker, tmp_path):
    """The race the test above runs into: `farm serve` waits for its new server while a `farm down` stops it. The
    wait ends with "was stopped before it registered", named by SIGTERM when this process started the server, else
    by its record gone from the registry. A server that ended on its own (an exit code, another signal, a record
    dropped after it died) or one in no registry still "exited at start", with its log."""
    from farm.errors import DeviceError
    from farm.procs.registry import update_records
    from farm.procs.supervise import local_process, spawn
    from farm.rpc.launch import exited_at_start, start_server

    def started(name: str) -> ManagedProcess:
        record = start_server(tracker, name, f"race-{name}", tmp_path)
        update_records(tmp_path, lambda current: current + [record])
        return record

    def ended(record: ManagedProcess, sig: int) -> ManagedProcess:
        os.killpg(record.pid, sig)
        deadline = time.monotonic() + 60
        while psutil.Process(record.pid).status() != psutil.STATUS_ZOMBIE:  # ended, not reaped: this is its parent
            assert time.monotonic() < deadline, f"{record.name} did not end on {sig}"
            time.sleep(0.02)
        return record

    def dropped(record: ManagedProcess) -> ManagedProcess:
        update_records(tmp_path, lambda current: [r for r in current if r != record])
        return record

    def give_up(record: ManagedProcess, registry: Path | None = tmp_path) -> str:
        with pytest.raises(DeviceError) as raised:
            exited_at_start([record], registry)({record.key})
        return raised.value.message

    said = give_up(ended(started("killed"), signal.SIGTERM))
    assert said == "the server for killed (race-killed) was stopped before it registered (by SIGTERM)", said
    gone = started("reaped")
    assert stop_process(gone)  # reaps it, as a `farm down` of this process would: no status left to read
    assert give_up(dropped(gone)).endswith("was stopped before it registered (its record was dropped)")
    said = give_up(ended(started("crashed"), signal.SIGUSR1))
    assert said.startswith("the server for crashed (race-crashed) exited at start (killed by SIGUSR1): "), said
    failed = ended(started("failed"), signal.SIGTERM)  # the same SIGTERM, where no farm command stops servers
    assert give_up(dropped(failed), None).startswith("the server for failed (race-failed) exited at start (killed by "
                                                     "SIGTERM): ")
    log = tmp_path / "server-bad.log"  # a server that fails on its own once started: an error line, exit code 1
    proc = spawn([sys.executable, "-c", "import sys, time; time.sleep(0.3); sys.exit('bad: no such library')"], log)
    bad = local_process("server", "bad", "race-bad", proc.pid, 0, str(log), "farm.rpc.server")
    update_records(tmp_path, lambda current: current + [bad])
    deadline = time.monotonic() + 60
    while psutil.Process(bad.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the failing server did not exit"
        time.sleep(0.02)
    said = give_up(dropped(bad))  # its record dropped after it died (a watchdog's restart, another serve's clean-up)
    assert said.startswith("the server for bad (race-bad) exited at start: ") and "no such library" in said, said
    # the race CI met: `farm down`'s SIGTERM has emptied the server's command line, so it is no longer running, but
    # the kernel is still freeing its memory: it cannot be waited for yet, and its record is still there (down drops
    # it once the group is gone). Here a child whose command line never had the marker ends by SIGTERM 0.5 s later
    log = tmp_path / "server-exiting.log"
    proc = spawn([sys.executable, "-c", "import os, signal, time; time.sleep(0.5); os.kill(os.getpid(), signal.SIGTERM)"],
                 log)
    exiting = local_process("server", "exiting", "race-exiting", proc.pid, 0, str(log), "farm.rpc.server")
    update_records(tmp_path, lambda current: current + [exiting])
    said = give_up(exiting)
    assert said == "the server for exiting (race-exiting) was stopped before it registered (by SIGTERM)", said


def test_concurrent_updates_keep_every_record(tmp_path):
    """Four processes each add 25 records through update_records, with a delay between read and write: all 100 are
    there, and no temporary file is left beside the registry."""
    add = (
        "import sys\nfrom pathlib import Path\nfrom farm.procs.registry import ManagedProcess, update_records\n"
        "for n in range(25):\n"
        "    record = ManagedProcess('server', f'{sys.argv[2]}-{n}', 'k', 1000 + n, 0, '', 0.0)\n"
        "    update_records(Path(sys.argv[1]), lambda current: current + [record])\n")
    procs = [subprocess.Popen([sys.executable, "-c", add, str(tmp_path), f"p{i}"],
                              env={**os.environ, DELAY_ENV: "0.002"}) for i in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    from farm.procs.registry import load_records

    assert sorted(r.name for r in load_records(tmp_path)) == sorted(f"p{i}-{n}" for i in range(4) for n in range(25))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["processes.json", "processes.lock"]


RECORD = {"role": "server", "name": "cpu-a", "key": "k", "pid": 4242, "port": 9000, "log_path": "/x.log",
          "started_at": 1.0, "marker": "farm.rpc.server", "remote": ""}

CORRUPT = {
    "truncated": (json.dumps([RECORD])[:-20], "it is not valid JSON (Unterminated string"),
    "not a list": (json.dumps({"servers": [RECORD]}), "it holds a JSON dict, not a list of records"),
    "not an object": (json.dumps([RECORD, 7]), "record 1 is a JSON int, not an object"),
    "missing pid": (json.dumps([{k: v for k, v in RECORD.items() if k != "pid"}]), "record 0 lacks pid"),
    "pid a string": (json.dumps([{**RECORD, "pid": "4242"}]), "record 0 has wrongly typed pid"),
    "unknown field": (json.dumps([{**RECORD, "host": "x"}]), "record 0 has unknown fields host"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_a_corrupt_registry_is_refused_not_read_as_empty(case, tmp_path):
    from farm.procs.registry import load_records, update_records

    text, what = CORRUPT[case]
    path = tmp_path / "processes.json"
    path.write_text(text)
    for attempt in (lambda: load_records(tmp_path), lambda: update_records(tmp_path, lambda current: [])):
        with pytest.raises(FarmError) as caught:
            attempt()
        assert caught.value.message.startswith(f"{path} is not a valid process registry: {what}")
        assert "ps -eo pid,pgid,cmd" in caught.value.hint and "kill -- -PGID" in caught.value.hint
        assert (case == "missing pid") != ("the pids it lists (4242)" in caught.value.hint)
    assert path.read_text() == text  # nothing written over it


def test_a_missing_registry_is_empty(tmp_path):
    from farm.procs.registry import load_records, update_records

    assert load_records(tmp_path / "never") == []
    record = ManagedProcess(**RECORD)
    assert update_records(tmp_path / "new", lambda current: current + [record]) == [record]
    assert load_records(tmp_path / "new") == [record]


def test_farm_down_on_a_corrupt_registry_stops_nothing_and_says_so(tmp_path, farm_env):
    home = Path(farm_env["FARM_HOME"])
    home.mkdir()
    path = home / "processes.json"
    path.write_text('[{"role": "server", "name": "cpu-a", "pid": 4242,')
    down = run_farm("down", env=farm_env)
    assert down.returncode == 1
    lines = down.stderr.strip().splitlines()
    assert len(lines) == 2, down.stderr
    assert lines[0].startswith(f"error: {path} is not a valid process registry: it is not valid JSON")
    assert lines[1].startswith("hint: farm will not guess which processes it started, so it stops nothing; "
                               "the pids it lists (4242) lead its own process group")
    assert path.read_text() == '[{"role": "server", "name": "cpu-a", "pid": 4242,'


def test_serve_keeps_a_server_whose_host_did_not_answer(tracker, tmp_path, farm_env):
    """A phone's server whose adb server is gone (state unknown) is neither forgotten nor started twice by
    `farm serve`: processes.py promises nobody restarts or forgets it."""
    inventory, remote = unreachable_phone(tmp_path / "devices.toml", "reg-phone", tracker.port)
    home = Path(farm_env["FARM_HOME"])
    home.mkdir()
    record = {**RECORD, "name": "phone", "key": "reg-phone", "marker": "farm-rpc-server", "remote": remote,
              "started_at": time.time()}
    (home / "processes.json").write_text(json.dumps([record]))
    serve = run_farm("--devices", str(inventory), "serve", "--device", "phone", "--json", env=farm_env)
    assert serve.returncode == 0, serve.stderr
    assert "phone: could not check server pid 4242 (its host did not answer); not starting another" in serve.stderr
    assert json.loads((home / "processes.json").read_text()) == [record]


def test_a_clock_stepped_after_the_start_does_not_hide_a_server_from_farm_down(tmp_path, farm_env):
    """The wall clock is stepped after farm recorded a tracker (NTP's first sync, a VM restored from a snapshot:
    this machine's /dev nodes carry a clock from days before its boot). ``farm tracker stop`` still stops it."""
    inventory = write_inventory(tmp_path / "devices.toml", "", free_port())
    started = run_farm("--devices", str(inventory), "--json", "tracker", "start", env=farm_env)
    assert started.returncode == 0, started.stderr
    pid = json.loads(started.stdout)["pid"]
    registry = Path(farm_env["FARM_HOME"]) / "processes.json"
    try:
        records = json.loads(registry.read_text())
        for record in records:  # as the record reads after the clock moved an hour forward
            record["started_at"] -= 3600
        registry.write_text(json.dumps(records))
        status = run_farm("--devices", str(inventory), "--json", "tracker", "status", env=farm_env)
        assert json.loads(status.stdout)["managed_pid"] == pid, status.stderr
        stopped = run_farm("--devices", str(inventory), "tracker", "stop", env=farm_env)
        assert stopped.stdout.strip() == f"tracker stopped (pid {pid})", stopped.stderr
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        if psutil.pid_exists(pid):  # only where the test failed: the group farm started, by its recorded pid
            os.killpg(pid, signal.SIGKILL)


def test_a_record_of_another_boot_or_an_older_farm(tmp_path):
    """Same PID and command line, another boot: not ours. A record an older farm wrote (no boot id) is still told
    by its wall-clock start."""
    from dataclasses import replace

    from farm.procs.supervise import is_running

    record = start_tracker("127.0.0.1", free_port(), tmp_path)
    try:
        assert record.boot_id and record.since_boot > 0 and is_running(record)
        assert not is_running(replace(record, boot_id="another-boot"))
        assert not is_running(replace(record, since_boot=record.since_boot + 5))  # the PID reused by a later process
        assert is_running(replace(record, boot_id="", since_boot=0.0))
        assert not is_running(replace(record, boot_id="", since_boot=0.0, started_at=record.started_at - 3600))
    finally:
        assert stop_process(record)


# a bench or the demo: a private tracker and server (each leading a process group of its own), then a long wait
PRIVATE_FARM = """
import signal, sys, time, psutil
from pathlib import Path
from farm.rpc.launch import private_farm
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as in a terminal, even where the tests run under nohup
with private_farm(Path(sys.argv[1]), {"ended": "ended-by-a-signal"}):
    Path(sys.argv[2]).write_text(" ".join(str(child.pid) for child in psutil.Process().children()))
    time.sleep(600)
"""

# a start ended midway: the tracker spawned, its record not yet returned (a start waits seconds for its process)
ENDED_MIDWAY = """
import os, signal, sys, time
from pathlib import Path
from farm.procs.supervise import free_port, local_process, spawn, stopped_at_end
from farm.rpc.launch import TRACKER_MODULE
def start_while_ended():
    port = free_port()
    proc = spawn([sys.executable, "-m", TRACKER_MODULE, "--host", "127.0.0.1", "--port", str(port)],
                 Path(sys.argv[1]) / "tracker.log")
    Path(sys.argv[2]).write_text(str(proc.pid))
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)  # the start's wait for its process to answer
    return local_process("tracker", "tracker", "", proc.pid, port, str(Path(sys.argv[1]) / "tracker.log"),
                         TRACKER_MODULE)
with stopped_at_end() as started:
    started.start(start_while_ended)
    print("went on after the signal", flush=True)
"""


def _ended_by(script: str, ending: signal.Signals, tmp_path: Path, signal_it: bool,
              roles: list[str] | None = None) -> None:
    """Run ``script`` (argv: a state dir, a file for the pids it started), send it ``ending`` once the pids are
    written (``signal_it``; else it signals itself), then check it exited as that signal's shell status and that
    nothing it started still runs. ``roles``: the modules the started pids must run, checked before the signal."""
    pids, out = tmp_path / "pids", tmp_path / "out"
    with open(out, "w") as stdout:
        proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(pids)], stdout=stdout,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while not (pids.exists() and pids.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        children = [psutil.Process(int(pid)) for pid in pids.read_text().split()]
        if roles is not None:
            got = sorted(" ".join(child.cmdline()).split(" -m ")[1].split()[0] for child in children)
            assert got == roles, got
        if signal_it:
            proc.send_signal(ending)
        assert proc.wait(timeout=60) == 128 + ending, out.read_text()
        assert "went on" not in out.read_text()
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"still running after the command ended: {alive}"
    finally:
        if proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                children += psutil.Process(proc.pid).children()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for child in children:  # only where the test failed: the groups the command started, led by these pids
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                    os.killpg(child.pid, signal.SIGKILL)


@pytest.mark.parametrize("ending", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_command_ended_by_a_signal_stops_the_tracker_and_server_it_started(ending, tmp_path):
    """`kill PID` (a CI job's timeout) or a closed terminal ends a bench or the demo. The tracker and server it
    started lead process groups of their own, so the signal never reaches them: the command stops them on its way
    out, and exits as that signal's shell status (128 + its number)."""
    _ended_by(PRIVATE_FARM, ending, tmp_path, signal_it=True, roles=["farm.rpc.server", "farm.rpc.tracker_server"])


def test_a_signal_during_a_start_stops_what_that_start_spawned(tmp_path):
    """SIGTERM between a tracker's spawn and its record (its start waits for it to answer): the start finishes, the
    tracker is listed, and then the command ends and stops it, instead of ending with it running and unlisted."""
    _ended_by(ENDED_MIDWAY, signal.SIGTERM, tmp_path, signal_it=False)
