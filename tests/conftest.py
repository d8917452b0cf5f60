"""Shared fixtures: a real TVM tracker and real rpc_servers on 127.0.0.1, free ports.

Processes are started in their own process groups and stopped by the groups
recorded here, in ``finally``; readiness is polled from the tracker's summary.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from farm.records import TrackerAddress
from farm.procs.registry import ManagedProcess
from farm.procs.supervise import free_port, stop_process
from farm.rpc.launch import start_server, start_tracker
from farm.rpc.tracker import wait_for_servers
from farm.tvm_private import import_tvm_without_torch

REPO = Path(__file__).resolve().parent.parent

# A user's own farm: the settings farm reads from the environment when a command names none (README: lab hosts
# `export FARM_DB=postgresql://...`). Exported in the shell that runs pytest, they reached every farm command a test
# ran without its own (run_farm passes os.environ on): test_postgres's check that the inventory's [store] db
# is read "when neither --db nor FARM_DB names one" then read the user's FARM_DB instead, and failed in every run
# of that shell, and `farm demo` wrote to the user's database. The tests start from none of them.
USER_SETTINGS = ("FARM_DEVICES", "FARM_DB", "FARM_HOME")


# The lab key every test lab host shares (farm/signing.py): one file of fixed content, so the hosts of a test (its
# processes, a namespace's) verify each other's signed libraries as a lab's hosts do
TEST_LAB_KEY = b"farm-tests-lab-key-5e1f0c2d9a7b"


def pytest_configure(config):
    import tempfile

    from farm.signing import KEY_ENV

    for name in USER_SETTINGS:
        os.environ.pop(name, None)
    key = Path(tempfile.gettempdir()) / "farm-tests-lab.key"
    if not key.exists() or key.read_bytes() != TEST_LAB_KEY:
        key.write_bytes(TEST_LAB_KEY)
        key.chmod(0o644)  # the namespaces' processes run as this user; the PostgreSQL server never reads it
    os.environ[KEY_ENV] = str(key)
    # as farm's own processes do (cli.main, the servers): TVM imported without PyTorch, in this process and in the
    # worker processes TVM starts from it (MetaSchedule's, for the tests that tune in-process): ~1.5 s of CPU each
    import_tvm_without_torch()


# The session's own servers run TVM on one thread (devices.toml `threads = 1`, which their inventory says too): two
# pytest workers share the 2 cores of a CI machine, and TVM's thread pool spins while it waits for its threads, so
# servers on 2 threads beside another worker's builds and servers stalled each other (the suite took 33 min instead of
# ~15). tests/test_threads.py starts servers of its own on other counts; farm demo and the README's commands keep the
# defaults users get.
TEST_THREADS = 1

# The evolutionary search's population on the session's test devices (devices.toml's search_population): the tests
# check what a tuning session does, not how well it searches, and MetaSchedule's 512 costs ~60 s of CPU for each
# batch of a convnet conv on 2 cores (64: a quarter of a session's CPU; tests/test_tune.py checks it reaches the search).
TEST_POPULATION = 64


def settings_inventory(setting: str, on: str = "on", off: str = "off") -> str:
    """Devices for a CPU setting's tests (no server): ``on``, a local llvm device on the defaults; ``off``, the same
    with ``setting`` (a devices.toml line); ``gpu``, an OpenCL device with an llvm host. Each test file names its
    own: a warning said once per device name and process stays said for the next file in the same worker."""
    local = '\nkind = "local"\nkey = "k"\ntarget = { kind = "llvm" }\nthreads = 2\n'
    return (f"[devices.{on}]{local}[devices.{off}]{local}{setting}\n"
            '[devices.gpu]\nkind = "opencl"\nkey = "g"\ntarget = { kind = "opencl" }\nhost = { kind = "llvm" }\n')


def assert_records_kept_apart(store, tuned, other, caplog, said: str, hint: str) -> None:
    """A record stored under ``tuned``'s tuning key applies to it and never to ``other`` (a device of
    ``settings_inventory`` on the defaults: layout NHWC, weight prepacking on), whose store lookups warn once, in a
    line that holds ``said`` and ``hint`` and names ``other``'s settings."""
    import logging

    from farm.compile import device_tuning_key
    from farm.sweep import tuning_set

    store.add_tuning_lines(device_tuning_key(tuned), ['{"w": 1}'], [(0, f'[0, "{said}"]', 1e-3)], None)
    assert len(tuning_set(store, tuned).records) == 1
    with caplog.at_level(logging.WARNING, logger="farm.sweep"):
        for _ in range(3):
            assert tuning_set(store, other).records == ()  # never mixed
    lines = [r.getMessage() for r in caplog.records if said in r.getMessage()]
    assert len(lines) == 1 and hint in lines[0], lines
    assert "(layout NHWC, weight prepacking on: other workloads)" in lines[0], lines


# Test files that run longest start first: tools/test.sh runs pytest-xdist with --dist loadfile (one file per worker
# at a time) and --no-loadscope-reorder, so files are handed out in this collection order; by default xdist orders
# them by their number of tests instead, which put the one-test README and docs walks last, alone, as the tail.
LONGEST_FIRST = ("test_docs_commands.py", "test_lab.py", "test_tune_sessions.py", "test_tune.py", "test_emulated.py",
                 "test_demo.py", "test_processes.py", "test_opencl.py", "test_nightly.py", "test_android.py",
                 "test_readme.py")  # test_lab.py: 194 s alone here (#50's faults: a frozen worker, a restart)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's tests keep their order


@dataclass
class Farm:
    tracker: TrackerAddress
    state_dir: Path
    processes: list[ManagedProcess]

    def inventory_text(self, extra: str = "") -> str:
        return f"""
[tracker]
host = "127.0.0.1"
port = {self.tracker.port}

[devices.cpu-a]
kind = "local"
key = "test-a"
target = {{ kind = "llvm" }}
threads = {TEST_THREADS}
search_population = {TEST_POPULATION}

[devices.cpu-b]
kind = "local"
key = "test-b"
target = {{ kind = "llvm", mcpu = "x86-64" }}
threads = {TEST_THREADS}
search_population = {TEST_POPULATION}

[devices.ghost]
kind = "remote"
key = "test-nobody-serves-this"
target = {{ kind = "llvm" }}
{extra}"""


@pytest.fixture(scope="session")
def farm_net(tmp_path_factory) -> Farm:
    """A tracker and two local rpc_servers (keys test-a, test-b) for the whole session."""
    state = tmp_path_factory.mktemp("farm-net")
    port = free_port()
    tracker = TrackerAddress("127.0.0.1", port)
    started: list[ManagedProcess] = []
    try:
        started.append(start_tracker("127.0.0.1", port, state))
        threads = ("--threads", str(TEST_THREADS))  # as cpu-a and cpu-b's inventory entries say
        started.append(start_server(tracker, "cpu-a", "test-a", state, options=threads))
        started.append(start_server(tracker, "cpu-b", "test-b", state, options=threads))
        wait_for_servers(tracker, {"test-a": 1, "test-b": 1}, timeout_s=120)
        yield Farm(tracker, state, started)
    finally:
        for record in reversed(started):
            stop_process(record)


@pytest.fixture
def inventory_file(farm_net, tmp_path) -> Path:
    return farm_workspace(farm_net, tmp_path)[0]


def farm_workspace(farm_net: Farm, folder: Path) -> tuple[Path, dict[str, str]]:
    """``inventory_file`` and ``farm_env`` in ``folder``: for a module-scoped fixture whose one expensive run
    several tests check (the run's own assertions, and its report in Chromium)."""
    path = folder / "devices.toml"
    path.write_text(farm_net.inventory_text())
    return path, env_in(folder)


def write_inventory(path: Path, devices: str, port: int, host: str = "127.0.0.1") -> Path:
    """An inventory file: a [tracker] at host:port, then the given [devices.*] tables."""
    path.write_text(f'[tracker]\nhost = "{host}"\nport = {port}\n{devices}')
    return path


@contextlib.contextmanager
def stock_remote_device(farm: Farm, path: Path, name: str, key: str):
    """An inventory at ``path``: the session's devices and ``name``, a ``remote`` device served by a stock TVM
    rpc_server (no farm helpers) registered under ``key``; the server is killed after."""
    import signal

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(port),
         "--port-end", str(port + 1), "--tracker", str(farm.tracker), "--key", key],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        path.write_text(farm.inventory_text(f'\n[devices.{name}]\nkind = "remote"\nkey = "{key}"\n'
                                            f'target = {{ kind = "llvm" }}\n'))
        wait_for_servers(farm.tracker, {key: 1}, timeout_s=120)
        yield path
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def unreachable_phone(path: Path, key: str, tracker_port: int) -> tuple[Path, str]:
    """An inventory of one phone behind an adb port where nothing listens (its adb server is gone), and the adb
    shell prefix a server record on it carries: its state can only be "unknown"."""
    import json
    import sys

    from farm.procs.supervise import free_port

    adb_port = free_port()
    inventory = write_inventory(path, f"""
[devices.phone]
kind = "android"
key = "{key}"
serial = "stand-in:5555"
adb = "127.0.0.1:{adb_port}"
server_port = {free_port()}
target = {{ kind = "llvm", mtriple = "aarch64-linux-gnu" }}
""", tracker_port)
    return inventory, json.dumps([sys.executable, "-m", "farm.devices.adb_shell", "127.0.0.1", str(adb_port), "stand-in:5555"])


@contextlib.contextmanager
def native_fleet(work: Path, devices: dict[str, str], lab_host: str | None = None):
    """A private tracker and one of farm's native RPC servers per device (name -> key), each a ``remote`` device of
    ``work/devices.toml`` (of ``lab_host`` when given), registered before it yields the tracker; stopped after."""
    from farm.devices.native import ensure_native_server, start_native_server
    from farm.records import TrackerAddress
    from farm.procs.supervise import stop_process
    from farm.rpc.launch import exited_at_start, start_tracker
    from farm.rpc.tracker import wait_for_servers

    server = ensure_native_server()
    port = free_port()
    started = [start_tracker("127.0.0.1", port, work)]
    tracker = TrackerAddress("127.0.0.1", port)
    try:
        lines = [f'[tracker]\nhost = "127.0.0.1"\nport = {port}\n']
        for name, key in devices.items():
            started.append(start_native_server(server, tracker, name, key, work))
            lines.append(f'[devices.{name}]\nkind = "remote"\nkey = "{key}"\n'
                         + (f'lab_host = "{lab_host}"\n' if lab_host else "")
                         + 'target = { kind = "llvm", num-cores = 1 }\n')
        (work / "devices.toml").write_text("\n".join(lines))
        wait_for_servers(tracker, {key: 1 for key in devices.values()}, timeout_s=120, give_up=exited_at_start(started))
        yield tracker, started
    finally:
        for record in reversed(started):
            stop_process(record)


@contextlib.contextmanager
def dashboard_server(inventory: Path, env: dict[str, str], *args: str):
    """`farm dashboard` for ``inventory`` on a free port of this host, as a user starts it: its base URL; stopped
    (its process group) after."""
    import signal

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "farm.cli", "--devices", str(inventory), "dashboard", "--port",
                               str(port), *args], cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert "farm dashboard on http://127.0.0.1:" in server.stdout.readline()
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)


def run_farm(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user or a cron job would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "farm.cli", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=timeout)


@pytest.fixture
def farm_env(tmp_path) -> dict[str, str]:
    """FARM_HOME and FARM_DB inside this test's tmp_path."""
    return env_in(tmp_path)


def env_in(folder: Path) -> dict[str, str]:
    return {"FARM_HOME": str(folder / "home"), "FARM_DB": str(folder / "results.db")}


# -- a real PostgreSQL server for the store's second backend -----------------------------------

def postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    return found[-1].parent if found else None


@pytest.fixture(scope="session")
def postgres_server():
    """``postgresql://farm@127.0.0.1:PORT``: Debian's PostgreSQL started for this test session, stopped after."""
    with running_postgres() as url:
        yield url


@contextlib.contextmanager
def running_postgres(listen: str = "127.0.0.1", clients: str = ""):
    """Debian's PostgreSQL on a free port of ``listen`` (addresses, comma-separated; the first is in the URL),
    trusting ``clients`` (a CIDR; loopback always); its ``postgresql://farm@ADDRESS:PORT`` URL, stopped after."""
    with postgres_server_at(listen, clients) as server:
        yield server.url


class PostgresServer:
    """A private PostgreSQL server that a test can stop and start again on the same data and port (a restart)."""

    def __init__(self, bin_dir: Path, base: Path, as_user: list[str], address: str, listen: str, port: int) -> None:
        self.bin_dir, self.base, self.as_user = bin_dir, base, as_user
        self.address, self.listen, self.port = address, listen, port
        self.url = f"postgresql://farm@{address}:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        import time

        with open(self.base / "server.log", "ab") as log:
            self.proc = subprocess.Popen(
                [*self.as_user, str(self.bin_dir / "postgres"), "-D", str(self.base / "data"), "-p", str(self.port),
                 "-k", str(self.base / "sockets"), "-c", f"listen_addresses={self.listen}", "-c", "fsync=off",
                 "-c", "max_connections=100"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while subprocess.run([str(self.bin_dir / "pg_isready"), "-h", self.address, "-p", str(self.port)],
                             capture_output=True).returncode != 0:
            assert self.proc.poll() is None, (self.base / "server.log").read_text()
            assert time.monotonic() < deadline, "PostgreSQL did not start within 120 s"
            time.sleep(0.2)

    def stop(self) -> None:
        """A fast shutdown (SIGINT: what ``pg_ctl stop -m fast`` sends): sessions are ended with AdminShutdown."""
        import signal

        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@contextlib.contextmanager
def postgres_server_at(listen: str = "127.0.0.1", clients: str = ""):
    """A started ``PostgresServer`` (``running_postgres``), stopped and removed after.

    As root the server runs as the ``postgres`` user (it refuses root); data, socket and log are in a temp dir."""
    import shutil
    import tempfile

    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip("needs PostgreSQL: apt-get install postgresql (bash tools/setup.sh --test)")
    # not under pytest's tmp dir: that is private to root, and the server runs as postgres
    base = Path(tempfile.mkdtemp(prefix="farm-pg-"))
    data, sockets = base / "data", base / "sockets"
    sockets.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(base, "postgres")
        shutil.chown(sockets, "postgres")
    init = subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "farm", "-E", "UTF8"],
                          capture_output=True, text=True)
    assert init.returncode == 0, init.stderr
    if clients:
        with open(data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {clients} trust\n")
    address = listen.split(",")[0]
    server = PostgresServer(bin_dir, base, as_user, address, listen, free_port(address))
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def postgres_db(postgres_server) -> str:
    """A fresh, empty database on the session's server; its URL."""
    import uuid

    import psycopg

    name = f"farm_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(f"{postgres_server}/postgres", autocommit=True) as db:
        db.execute(f"CREATE DATABASE {name}")
    return f"{postgres_server}/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_location(request, tmp_path) -> str:
    """The results database under test: a SQLite file, then a database on a real PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "r.db")
    return request.getfixturevalue("postgres_db")


# -- network namespaces: a second host, a phone ----------------------------------------------------

@contextlib.contextmanager
def network_namespace(prefix: str, second_octet: int):
    """(namespace, this host's address, its address): a namespace joined to this host by a veth pair,
    its loopback up; removed on exit. Needs root and iproute2."""
    import uuid

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    tag = uuid.uuid4().hex[:6]
    ns, here, there = f"{prefix}-{tag}", f"{prefix[:3]}{tag}a", f"{prefix[:3]}{tag}b"
    subnet = 100 + int(tag[:2], 16) % 100
    host_addr, ns_addr = f"10.{second_octet}.{subnet}.1", f"10.{second_octet}.{subnet}.2"
    ip("netns", "add", ns)
    try:
        ip("link", "add", here, "type", "veth", "peer", "name", there)
        ip("link", "set", there, "netns", ns)
        ip("addr", "add", f"{host_addr}/24", "dev", here)
        ip("link", "set", here, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"{ns_addr}/24", "dev", there)
        ip("netns", "exec", ns, "ip", "link", "set", there, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, host_addr, ns_addr
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# -- read-model records ------------------------------------------------------------------------------

def make_run(run_id: int, sweep_id: int | None, value: float, status: str = "ok", unstable: bool = False,
             tvm: str = "0.27.0", target: dict | None = None, device: str = "phone", model: str = "mlp",
             runtime: str = "tvm", runtime_version: str = ""):
    """A ``runs.Run`` as ``results.run_rows`` gives it, for tests of what reads runs: one steady median ``value``
    (a summary of 3 repeats), load 10 ms, first run 20 ms, no copies."""
    from farm.analysis.runs import Run
    from farm.analysis.series import context_of
    from farm.stats import Summary

    context = {"target": target or {"kind": "llvm"}, "pipeline_version": 2}
    steady = Summary(n=3, median=value, mean=value, p10=value, p90=value, min=value, max=value, cv=0.0, mad=0.0,
                     ci_low=value, ci_high=value, unstable=unstable)
    return Run(run_id=run_id, started_at="", device=device, key=device, model=model, model_digest="m",
               status=status, failed_step="", reason="", upload_s=None, load_s=0.01, first_run_s=0.02,
               load_warm_s=None, first_run_warm_s=None, steady_clock="wall", steady_number=1,
               steady_wall_number=None, fallback_of=None, check="skipped", max_abs_err=None, emulated=False,
               tuned=False, tuned_tasks=0, total_tasks=0, sweep_id=sweep_id, attempt=1, artifact_key=f"a{run_id}",
               tvm_version=tvm, farm_version="", runtime=runtime, runtime_version=runtime_version, context=context,
               series_context=context_of(context, tvm, runtime, runtime_version),
               steady=steady, steady_wall=None, copy_s=(), copy_bytes=())
