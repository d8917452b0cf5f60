"""A sweep over a lab host's devices through the lab's queue (procrastinate on a real PostgreSQL): `farm worker`
processes measure the cells, `farm sweep` queues and follows them; a killed worker's cell runs again on another
worker of its host, and a job delivered again stores nothing new. Real tracker, real native RPC servers."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from farm.lab.jobs import RETRY_WITHIN_S
from tests.conftest import native_fleet, run_farm

DEVICES = 3


@pytest.fixture(scope="module")
def lab_host(tmp_path_factory):
    """A tracker and DEVICES native servers, each a device of lab host "lab1"; (folder, inventory path)."""
    work = tmp_path_factory.mktemp("lab")
    with native_fleet(work, {f"dev{i}": f"lab1-{i}" for i in range(DEVICES)}, lab_host="lab1"):
        yield work, work / "devices.toml"


class Workers:
    """`farm worker` processes, each in its own process group, logging to a file; stopped in `finally`."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder, self.env, self.procs = folder, env, []

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """A worker of lab host lab1 (or, with ``--builds`` in ``args``, a build worker)."""
        log = open(self.folder / f"worker-{len(self.procs)}.log", "wb")
        host = [] if "--builds" in args else ["--lab-host", "lab1"]
        proc = subprocess.Popen([sys.executable, "-m", "farm.cli", "worker", *host, "--progress", *args],
                                env={**os.environ, **self.env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def log(self, index: int) -> str:
        return (self.folder / f"worker-{index}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def workers(lab_host, postgres_db, tmp_path):
    work, inventory = lab_host
    env = {"FARM_DEVICES": str(inventory), "FARM_DB": postgres_db, "FARM_HOME": str(work / "home")}
    pool = Workers(tmp_path, env)
    try:
        yield pool
    finally:
        pool.stop()


def _runs(env: dict[str, str], sweep_id: int) -> list[dict]:
    from farm.store import Store

    with Store(env["FARM_DB"]) as store:
        return [{k: r[k] for k in ("id", "device", "model", "runtime", "status", "attempt")}
                for r in store.runs(sweep_id=sweep_id)]


def _cells(runs: list[dict]) -> dict[tuple[str, str, str], int]:
    counts: dict[tuple[str, str, str], int] = {}
    for run in runs:
        key = (run["device"], run["model"], run["runtime"])
        counts[key] = counts.get(key, 0) + 1
    return counts


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f} s"
        time.sleep(0.5)


def test_a_sweep_over_a_lab_host_is_measured_by_its_workers_each_cell_once(workers):
    for _ in range(2):
        workers.start("--slots", "1")
    proc = run_farm("sweep", "--model", "mlp", "--model", "convnet", "--reference", "none", "--repeat", "3",
                    "--no-report", "--json", env=workers.env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "done"
    assert sorted((c["device"], c["model"], c["status"], c["attempts"]) for c in out["cells"]) == sorted(
        (f"dev{i}", model, "ok", 1) for i in range(DEVICES) for model in ("mlp", "convnet"))
    runs = _runs(workers.env, out["sweep_id"])
    # one run per cell, nothing twice (a remote server's host runs no reference runtime: TVM's runs only)
    assert _cells(runs) == {(f"dev{i}", model, "tvm"): 1 for i in range(DEVICES) for model in ("mlp", "convnet")}
    assert all("· steady" in workers.log(i) for i in range(2)), "both workers measured cells"
    status = json.loads(run_farm("sweep", "--status", str(out["sweep_id"]), "--json", env=workers.env).stdout)
    assert status["status"] == "done" and status["jobs"] == {"lab1": {"succeeded": 2 * DEVICES}}
    # no build worker: each cell took its waiting build job over and compiled on its own host
    assert status["builds"] == {"cancelled": 2 * DEVICES}, status
    assert all("· compile:" in workers.log(i) for i in range(2))


def test_a_sweep_s_compiles_are_jobs_of_a_build_worker_read_by_the_measuring_host_from_the_lab_s_store(workers,
                                                                                                         tmp_path):
    """A build worker (its own cache, as on another host) compiles every cell's artifact and puts it in the lab's
    store; the host's worker compiles nothing: it reads each artifact by its key, checks its sha256 and measures."""
    from farm.store import Store

    queued = run_farm("sweep", "--model", "mlp", "--model", "convnet", "--reference", "none", "--tvm-only",
                      "--repeat", "3", "--no-report", "--detach", "--json", env=workers.env)
    assert queued.returncode == 0, queued.stderr
    sweep_id = json.loads(queued.stdout)["sweep_id"]
    builder = workers.start("--builds", "--until-empty", env={"FARM_HOME": str(tmp_path / "build-host")})
    assert builder.wait(timeout=600) == 0, workers.log(0)
    workers.start("--slots", "2", env={"FARM_HOME": str(tmp_path / "measuring-host")})
    followed = run_farm("sweep", "--resume", str(sweep_id), "--no-report", "--json", env=workers.env, timeout=600)
    assert followed.returncode == 0, followed.stderr[-3000:]
    assert json.loads(followed.stdout)["status"] == "done"
    with Store(workers.env["FARM_DB"]) as store:
        builds = store.sweep_builds(sweep_id)
        runs = {(r["device"], r["model"]): r for r in store.runs(sweep_id=sweep_id)}
        files = {key: store.artifact_file(key) for key in {b.cache_key for b in builds.values()}}
    cells = {(f"dev{i}", model) for i in range(DEVICES) for model in ("mlp", "convnet")}
    assert set(builds) == cells and all(b.error is None and b.builder.startswith("builds:") for b in builds.values())
    assert len(files) == 2 and all(f is not None for f in files.values()), "one artifact a model: the devices share a target"
    # ... built once each: the devices' builds of one model take one lock, and the later ones find it in the store
    assert workers.log(0).count("· compile: build job on builds:") == 2, workers.log(0)
    assert workers.log(0).count("in the lab's store already") == len(cells) - 2, workers.log(0)
    assert {cell: runs[cell]["artifact_key"] for cell in cells} == {cell: builds[cell].cache_key for cell in cells}
    assert {r["status"] for r in runs.values()} == {"ok"}
    measured = workers.log(1)
    assert "· compile:" not in measured, measured[-3000:]
    assert measured.count("· artifact: built by builds:") == len(cells), measured[-3000:]
    assert sorted(p.name for p in (tmp_path / "measuring-host" / "cache").iterdir()) == sorted(
        key[:24] for key in files), "each artifact installed once in the measuring host's cache, by its key"
    status = json.loads(run_farm("sweep", "--status", str(sweep_id), "--json", env=workers.env).stdout)
    assert status["builds"] == {"succeeded": len(cells)}, status


def test_a_killed_worker_s_cell_runs_again_on_its_host_and_a_redelivered_job_stores_nothing(workers):
    """kill -9 of a worker while it measures: its cell is queued again once the worker is silent, and another worker
    of the host measures it; the sweep ends done with one run per cell. Then a job put back as a worker killed
    after its result committed (and before the queue heard of it) leaves it: running again stores nothing."""
    first = workers.start("--slots", "1")
    queued = run_farm("sweep", "--model", "mlp", "--reference", "none", "--tvm-only", "--repeat", "20",
                      "--min-repeat-ms", "100", "--no-report", "--detach", "--json", env=workers.env)
    assert queued.returncode == 0, queued.stderr
    sweep_id = json.loads(queued.stdout)["sweep_id"]
    # the bound only ends a failing test: a worker imports TVM and compiles first, slow on a loaded 2-core machine
    _wait_for(lambda: "· steady" in workers.log(0), 300, "the first worker did not start measuring")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    workers.start("--slots", "1")
    followed = run_farm("sweep", "--resume", str(sweep_id), "--no-report", "--json", env=workers.env, timeout=600)
    assert followed.returncode == 0, followed.stderr[-3000:]
    assert json.loads(followed.stdout)["status"] == "done"
    runs = _runs(workers.env, sweep_id)
    assert _cells(runs) == {(f"dev{i}", "mlp", "tvm"): 1 for i in range(DEVICES)}
    assert {r["status"] for r in runs} == {"ok"}
    assert "stalled on a silent worker: queued again" in workers.log(1)

    import psycopg

    with psycopg.connect(workers.env["FARM_DB"], autocommit=True) as db:  # what a worker killed after commit leaves
        job = db.execute("SELECT id FROM procrastinate_jobs WHERE task_name = 'farm.cell' ORDER BY id LIMIT 1"
                         ).fetchone()[0]
        db.execute("UPDATE procrastinate_jobs SET status = 'doing', worker_id = NULL WHERE id = %s", (job,))
    # the queue's stated bound, with a minute's slack for a loaded machine (the job itself reads two rows)
    _wait_for(lambda: _job_status(workers.env["FARM_DB"], job) == "succeeded", RETRY_WITHIN_S + 60,
              "the stalled job did not run again")
    assert _runs(workers.env, sweep_id) == runs
    assert "dev0 · mlp · done before: stored already, nothing measured" in workers.log(1)


def _job_status(url: str, job: int) -> str:
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        return db.execute("SELECT status::text FROM procrastinate_jobs WHERE id = %s", (job,)).fetchone()[0]


def test_a_lab_host_with_no_worker_has_its_cells_stored_offline_after_the_wait_never_measured_elsewhere(workers,
                                                                                                       tmp_path):
    """Host lab2 has a device but no `farm worker` (one of its cells was running on a worker that died with the
    host): the sweep measures lab1's device, and after --host-wait lab2's cells, the stuck one put back first, are
    cancelled in the queue and stored offline with the reason; none of them runs on lab1's workers."""
    inventory = tmp_path / "devices.toml"
    inventory.write_text(Path(workers.env["FARM_DEVICES"]).read_text() +
                         '\n[devices.far]\nkind = "remote"\nkey = "lab2-0"\nlab_host = "lab2"\n'
                         'target = { kind = "llvm", num-cores = 1 }\n')
    env = {**workers.env, "FARM_DEVICES": str(inventory)}
    workers.env = env
    workers.start("--slots", "1")
    from farm.lab.queue import LabQueue

    # lab1's worker must be taking jobs before the short --host-wait starts (the bound only ends a failing test)
    _wait_for(lambda: LabQueue(env["FARM_DB"]).live_workers() >= 1, 300, "lab1's worker did not start")
    queued = run_farm("sweep", "--device", "dev0", "--device", "far", "--model", "mlp", "--model", "convnet",
                      "--reference", "none", "--repeat", "3", "--no-report", "--detach", "--json", env=env)
    assert queued.returncode == 0, queued.stderr
    sweep_id = json.loads(queued.stdout)["sweep_id"]
    import psycopg

    with psycopg.connect(env["FARM_DB"], autocommit=True) as db:  # lab2's first cell, running when its host died
        dead = db.execute("INSERT INTO procrastinate_workers (last_heartbeat) VALUES (NOW() - interval '1 hour') "
                          "RETURNING id").fetchone()[0]
        db.execute("UPDATE procrastinate_jobs SET status = 'doing', worker_id = %s WHERE id = (SELECT MIN(id) FROM "
                   "procrastinate_jobs WHERE queue_name = 'farm-host-lab2')", (dead,))
    proc = run_farm("sweep", "--resume", str(sweep_id), "--host-wait", "0.1", "--no-report", "--json", env=env,
                    timeout=600)
    # cells stored offline: the sweep is incomplete, exit 1, with them named (#50: it said "done" and exited 0)
    assert proc.returncode == 1, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "incomplete" and out["sweep_id"] == sweep_id
    # lab2's cells are to measure; lab1's may be too when its worker had not finished them yet (a loaded machine)
    resuming = [line for line in proc.stderr.splitlines()
                if line.startswith(f"sweep {sweep_id}: resuming: to measure: never measured: ")]
    assert len(resuming) == 1 and resuming[0].endswith("far × mlp, far × convnet"), proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-2:] == [
        f"error: sweep {sweep_id} is incomplete: 2 cell(s) not ok (offline: far × mlp, far × convnet)",
        f"hint: farm sweep --resume {sweep_id} measures the 2 never measured, offline or with retries left again"]
    assert sorted((c["device"], c["model"], c["status"]) for c in out["cells"]) == [
        ("dev0", "convnet", "ok"), ("dev0", "mlp", "ok"), ("far", "convnet", "failed"), ("far", "mlp", "failed")]
    assert "lab host lab2: no farm worker took its jobs for 0.1 min; 2 cell(s) stored offline" in proc.stderr
    from farm.store import Store

    runs = _runs(env, out["sweep_id"])
    assert _cells([r for r in runs if r["device"] == "dev0"]) == {("dev0", "mlp", "tvm"): 1, ("dev0", "convnet", "tvm"): 1}
    with Store(env["FARM_DB"]) as store:
        far = [r for r in store.runs(sweep_id=out["sweep_id"]) if r["device"] == "far"]
    assert sorted((r["model"], r["status"], r["failed_step"], r["attempt"]) for r in far) == [
        ("convnet", "failed", "offline", 0), ("mlp", "failed", "offline", 0)]
    assert all(r["reason"] == "lab host lab2 did not take its jobs for 0.1 min: no farm worker runs there, or every "
                              "one stopped" for r in far)
    assert "far" not in workers.log(0)
    status = json.loads(run_farm("sweep", "--status", str(out["sweep_id"]), "--json", env=env).stdout)
    # lab1's jobs all succeeded: two, or three when the resume queued a cell whose job ended meanwhile (it found the
    # cell done and stored nothing: one run per cell, above)
    assert status["jobs"]["lab2"] == {"cancelled": 2} and set(status["jobs"]["lab1"]) == {"succeeded"}
    # the lab's view, as `farm worker --status` and the dashboard show it: lab1's worker is alive, lab2 has none
    from farm.views.dashboard import collect_state
    from farm.inventory import load_inventory

    shown = collect_state(load_inventory(inventory), env["FARM_DB"])["lab"]
    rows = {row["lab host"]: row for row in shown["hosts"]}
    assert rows["lab2"]["cancelled"] == 2 and rows["lab2"]["waiting"] == rows["lab2"]["workers"] == 0
    assert rows["lab1"]["done"] >= 2 and shown["live_workers"] >= 1
    worker_status = json.loads(run_farm("worker", "--status", "--json", env=env).stdout)
    assert worker_status["live_workers"] >= 1 and {h["lab_host"] for h in worker_status["hosts"]} >= {"lab1", "lab2"}
    # a resume queues the offline cells again; lab2 is still gone, so they are stored offline again (attempt 0),
    # and the summary counts the cells the workers stored
    resumed = run_farm("sweep", "--resume", str(out["sweep_id"]), "--host-wait", "0.1", "--no-report", env=env,
                       timeout=600)
    assert resumed.returncode == 1, resumed.stderr[-3000:]
    assert "resuming: to measure: offline: far × mlp, far × convnet" in resumed.stderr
    assert f"sweep {out['sweep_id']}: 4 cell(s) measured, 2 failed" in resumed.stdout, resumed.stdout
    assert "lab host lab2: no farm worker took its jobs for 0.1 min; 2 cell(s) stored offline" in resumed.stderr


def test_a_queued_sweep_s_nightly_tuning_is_a_job_per_key_on_its_host_and_keys_tune_at_once(workers, tmp_path):
    """A sweep file's [tune] over lab hosts: after the cells and the review, each device key's tuning is a job on
    its host's queue; two workers take one key each, so both keys tune at the same time (both jobs started before
    either ended, from the queue's events), and the sweep reports each session."""
    for _ in range(2):
        workers.start("--slots", "1")
    night = tmp_path / "night.toml"
    night.write_text('devices = ["dev0", "dev1"]\nmodels = ["mlp"]\nreference = "none"\n'
                     "[bench]\nrepeat = 3\nmin_repeat_ms = 5\n[tune]\nminutes = 4\ntrials = 4\nmodels = 1\n")
    proc = run_farm("sweep", "--file", str(night), "--no-report", "--json", env=workers.env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "done"
    assert sorted((t["device"], t["model"]) for t in out["tuning"]) == [("dev0", "mlp"), ("dev1", "mlp")], out["tuning"]
    assert all(t["trials"] >= 1 and t["status"] in ("kept", "rejected", "no-new-records") for t in out["tuning"])
    assert "tune: 2 key(s) tuning at once on their hosts: dev0 (lab1), dev1 (lab1)" in proc.stderr
    import psycopg

    with psycopg.connect(workers.env["FARM_DB"], autocommit=True) as db:
        events = db.execute("SELECT j.args->>'device', e.type::text, e.at FROM procrastinate_events e "
                            "JOIN procrastinate_jobs j ON j.id = e.job_id WHERE j.task_name = 'farm.tune' "
                            "AND j.args->>'sweep_id' = %s", (str(out["sweep_id"]),)).fetchall()
    started = {device: at for device, kind, at in events if kind == "started"}
    ended = {device: at for device, kind, at in events if kind == "succeeded"}
    assert set(started) == set(ended) == {"dev0", "dev1"}
    assert max(started.values()) < min(ended.values()), "the two keys' tuning jobs did not overlap"
    logs = workers.log(0) + workers.log(1)
    assert "tune: dev0: tuning for 4 min" in logs and "tune: dev1: tuning for 4 min" in logs
    from farm.store import Store

    with Store(workers.env["FARM_DB"]) as store:  # each worker stored its key's night; the sweep reported them
        night = store.night_tunings(out["sweep_id"])
    sessions = _tune_sessions(workers.env["FARM_DB"])
    assert [(t["device"], t["model"], t["status"]) for t in night] == [
        (t["device"], t["model"], t["status"]) for t in sorted(out["tuning"], key=lambda t: t["device"])]
    with psycopg.connect(workers.env["FARM_DB"], autocommit=True) as db:  # a tuning job delivered again
        job = db.execute("SELECT id FROM procrastinate_jobs WHERE task_name = 'farm.tune' ORDER BY id LIMIT 1"
                         ).fetchone()[0]
        db.execute("UPDATE procrastinate_jobs SET status = 'doing', worker_id = NULL WHERE id = %s", (job,))
    _wait_for(lambda: _job_status(workers.env["FARM_DB"], job) == "succeeded", RETRY_WITHIN_S + 60,
              "the stalled tuning job did not run again")
    with Store(workers.env["FARM_DB"]) as store:  # it found its key's night stored: nothing tuned twice
        assert store.night_tunings(out["sweep_id"]) == night
    assert _tune_sessions(workers.env["FARM_DB"]) == sessions


def _tune_sessions(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        return db.execute("SELECT COUNT(*) FROM tune_sessions").fetchone()[0]


def test_a_frozen_worker_s_cell_is_measured_by_the_next_holder_and_its_late_result_refused(workers):
    """SIGSTOP of a worker while it measures (a paused VM, a swap storm), a second worker on its host: the job is
    handed over once the first is silent, the second waits for the device's lease to lapse and for the frozen
    session, and measures; the first wakes, finishes, and its result is refused with a log line. One run, ok: no
    false "no free device" failure, and the sweep ends done without a manual resume (#50)."""
    frozen = workers.start("--slots", "1")
    queued = run_farm("sweep", "--device", "dev0", "--model", "mlp", "--reference", "none", "--tvm-only",
                      "--repeat", "30", "--min-repeat-ms", "200", "--no-report", "--detach", "--json", env=workers.env)
    assert queued.returncode == 0, queued.stderr
    sweep_id = json.loads(queued.stdout)["sweep_id"]
    _wait_for(lambda: "dev0 · mlp · steady" in workers.log(0), 300, "the first worker did not start measuring")
    os.killpg(frozen.pid, signal.SIGSTOP)
    try:
        workers.start("--slots", "1")
        # its job is handed over once it is silent (RETRY_WITHIN_S), and taken once its lease lapses
        _wait_for(lambda: "took device dev0's lease from" in workers.log(1), RETRY_WITHIN_S + 120,
                  "the second worker did not take the frozen worker's device")
    finally:
        os.killpg(frozen.pid, signal.SIGCONT)
    followed = run_farm("sweep", "--resume", str(sweep_id), "--no-report", "--json", env=workers.env, timeout=900)
    assert followed.returncode == 0, followed.stderr[-3000:]
    assert json.loads(followed.stdout)["status"] == "done"
    runs = _runs(workers.env, sweep_id)
    assert [(r["device"], r["model"], r["status"], r["attempt"]) for r in runs] == [("dev0", "mlp", "ok", 1)]
    _wait_for(lambda: "its result is refused, not stored" in workers.log(0), 120, "the woken worker stored or said nothing")
    assert "lost device dev0's lease (epoch 1) while it measured; it is now " in workers.log(0)
    assert "no free device" not in workers.log(1)


def test_a_worker_holds_its_few_connections_whatever_its_slots_and_a_long_dead_worker_is_pruned(workers):
    """A worker of 3 slots measuring 3 devices at once holds at most POOL_CONNECTIONS connections (#50: one per
    running job passed PostgreSQL's default limit with 4 workers of 24 slots), counted from pg_stat_activity by
    each connection's application_name (farm:PID); and `farm worker --status` removes a worker silent for an hour."""
    import threading

    import psycopg

    from farm.lab.jobs import POOL_CONNECTIONS

    worker = workers.start("--slots", str(DEVICES))
    peak: dict[str, int] = {}
    stop = threading.Event()

    def count() -> None:
        with psycopg.connect(workers.env["FARM_DB"], autocommit=True) as db:
            while not stop.wait(0.1):
                for name, n in db.execute("SELECT application_name, COUNT(*) FROM pg_stat_activity "
                                          "WHERE application_name LIKE 'farm:%%' GROUP BY 1").fetchall():
                    peak[name] = max(peak.get(name, 0), n)

    counter = threading.Thread(target=count, daemon=True)
    counter.start()
    try:
        proc = run_farm("sweep", "--model", "mlp", "--model", "convnet", "--reference", "none", "--tvm-only",
                        "--repeat", "10", "--min-repeat-ms", "50", "--no-report", "--json", env=workers.env, timeout=600)
    finally:
        stop.set()
        counter.join()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "· steady" in workers.log(0) and workers.log(0).count("dev") >= DEVICES
    assert 1 <= peak.get(f"farm:{worker.pid}", 0) <= POOL_CONNECTIONS, peak
    with psycopg.connect(workers.env["FARM_DB"], autocommit=True) as db:
        dead = db.execute("INSERT INTO procrastinate_workers (last_heartbeat) VALUES (NOW() - interval '1 hour') "
                          "RETURNING id").fetchone()[0]
    assert run_farm("worker", "--status", env=workers.env).returncode == 0
    with psycopg.connect(workers.env["FARM_DB"], autocommit=True) as db:
        assert db.execute("SELECT COUNT(*) FROM procrastinate_workers WHERE id = %s", (dead,)).fetchone()[0] == 0
        assert db.execute("SELECT COUNT(*) FROM procrastinate_workers").fetchone()[0] >= 1  # the live one stays


def test_a_database_restart_under_running_cells_costs_seconds_not_the_cells_or_the_worker(tmp_path):
    """A private PostgreSQL shut down fast (AdminShutdown for every session, as `pg_ctl restart -m fast`) and started
    again while a worker's cells hold their devices: each cell is stored once when it ends, its job ends
    succeeded, and the worker lives on to take the next job (#50: every running cell failed for good, and a failed
    heartbeat or fetch ends procrastinate's worker). The cells are tools/bench_lab.py's simulated ones: a lease,
    3 s on the device, the run stored whole under it."""
    from farm.lab.jobs import CELL, Job, cell_lock
    from farm.lab.queue import LabQueue
    from farm.store import Store
    from tests.conftest import REPO, postgres_server_at

    with postgres_server_at() as server:
        url = f"{server.url}/postgres"
        lab = LabQueue(url)
        lab.install()
        with Store(url) as store:
            sweep = store.start_sweep({"devices": [], "models": ["mlp"]})
        with open(tmp_path / "worker.log", "wb") as log:
            worker = subprocess.Popen([sys.executable, str(REPO / "tools" / "bench_lab.py"), "--noop-worker", url,
                                       "--slots", "2", "--host", "h", "--cell-s", "3"], cwd=REPO, stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            def defer(*devices: str) -> None:
                LabQueue(url).defer([Job(CELL, "h", d, {"sweep_id": sweep, "device": d, "model": "mlp", "first": True},
                                         cell_lock(sweep, d, "mlp")) for d in devices])

            def statuses() -> list[str]:
                return sorted(LabQueue(url).task_statuses(sweep, CELL).values())

            defer("d0", "d1")
            _wait_for(lambda: statuses() == ["doing", "doing"], 120, "the worker did not take both cells")
            server.stop()
            server.start()
            _wait_for(lambda: statuses() == ["succeeded", "succeeded"], 120, "the cells did not end after the restart")
            defer("d2")
            _wait_for(lambda: statuses() == ["succeeded"] * 3, 120, "the worker took no job after the restart")
            assert worker.poll() is None
            with Store(url) as store:
                assert sorted(r["device"] for r in store.runs(sweep_id=sweep)) == ["d0", "d1", "d2"]
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
    log_text = (tmp_path / "worker.log").read_text()
    assert "lost the connection to" in log_text or "trying again" in log_text, log_text[-2000:]


def test_a_worker_against_an_unreachable_database_says_so_and_never_that_it_started(lab_host, tmp_path):
    """#50: it printed its start line, then the error. Now the queue and the tracker answer first, or one error."""
    from farm.procs.supervise import free_port

    _, inventory = lab_host
    url = f"postgresql://farm@127.0.0.1:{free_port()}/nowhere"  # nothing listens there
    proc = run_farm("worker", "--lab-host", "lab1", env={"FARM_DEVICES": str(inventory), "FARM_DB": url,
                                                         "FARM_HOME": str(tmp_path / "home")}, timeout=120)
    assert proc.returncode == 1
    assert "started" not in proc.stderr and "device(s) of lab host" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-2].startswith(f"error: cannot connect to the lab's queue at {url}: ") and lines[-1].startswith(
        "hint: check that the PostgreSQL server runs"), proc.stderr


POISON_MODEL = '''"""A model whose import kills the process that imports it on a lab host (a farm worker): a poison job."""
import os
import signal
import sys

if "worker" in sys.argv:
    os.kill(os.getpid(), signal.SIGKILL)


def build():
    import torch

    return torch.nn.Linear(4, 2)
'''


def test_a_model_that_kills_its_worker_is_stored_failed_after_max_deliveries_not_redelivered_forever(workers, tmp_path):
    """#61: a cell whose model kills the worker that loads it was put back every STALLED_S, forever, each time taking
    a worker down. After MAX_DELIVERIES, the worker that finds it stalled ends its job failed and stores the cell
    failed for good, saying why; the sweep settles. A worker is started after each death, as a lab's service
    manager does."""
    from farm.lab.jobs import MAX_DELIVERIES

    (tmp_path / "poison_model.py").write_text(POISON_MODEL)
    sweep_file = tmp_path / "sweep.toml"
    sweep_file.write_text('devices = ["dev0"]\nmodels = ["poison_model:build"]\nreference = "none"\n\n'
                          '[shapes."poison_model:build"]\ninput = [1, 4]\n')
    env = {**workers.env, "PYTHONPATH": str(tmp_path), "FARM_LAB_FACTORIES": "poison_model:*"}
    workers.env = env
    workers.start("--slots", "1")
    queued = run_farm("sweep", "--file", str(sweep_file), "--tvm-only", "--no-report", "--detach", "--json", env=env)
    assert queued.returncode == 0, queued.stderr[-3000:]
    sweep_id = json.loads(queued.stdout)["sweep_id"]
    # the bound only ends a failing test: each death is seen once its worker is silent for STALLED_S
    for death in range(MAX_DELIVERIES):
        _wait_for(lambda: workers.procs[-1].poll() is not None, 300, f"delivery {death + 1} did not kill its worker")
        assert workers.procs[-1].returncode == -signal.SIGKILL
        workers.start("--slots", "1")
    _wait_for(lambda: [r["status"] for r in _runs(env, sweep_id)] == ["failed"], RETRY_WITHIN_S + 120,
              "the poison cell was not stored failed")
    assert workers.procs[-1].poll() is None  # the worker that ended it lives
    followed = run_farm("sweep", "--resume", str(sweep_id), "--no-report", "--json", env=env, timeout=300)
    out = json.loads(followed.stdout)
    assert followed.returncode == 1 and out["status"] == "finished with failures", followed.stderr[-3000:]
    from farm.store import Store

    with Store(env["FARM_DB"]) as store:
        (run,) = store.runs(sweep_id=sweep_id)
    assert (run["failed_step"], run["reason"]) == (
        "worker died", f"the worker died {MAX_DELIVERIES} times measuring it: its process ended (a crash, or the host "
                       "out of memory) in the model's import, its compile or its runtime")
    assert _job_status(env["FARM_DB"], _cell_job(env["FARM_DB"])) == "failed"
    assert f"its worker died {MAX_DELIVERIES} times under it: ended failed" in workers.log(len(workers.procs) - 1)


def _cell_job(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        return db.execute("SELECT id FROM procrastinate_jobs WHERE task_name = 'farm.cell' ORDER BY id DESC LIMIT 1"
                          ).fetchone()[0]


def test_a_dead_build_worker_s_job_is_taken_over_on_the_cell_s_own_connection(postgres_db):
    """#61: with the build worker dead, each cell that settled its build opened a procrastinate pool of its own to
    put the job back (one per slot, past the worker's POOL_CONNECTIONS). Now procrastinate's retry runs on the
    call's connection; the job is put back, then taken over by the cell."""
    import psycopg

    from farm.lab.jobs import BUILD, BuildState, Job, build_queueing_lock
    from farm.lab.queue import LabQueue

    lab = LabQueue(postgres_db)
    lab.defer([Job(BUILD, "", "dev0", {"sweep_id": 7, "device": "dev0", "model": "mlp"}, build_queueing_lock(7, "dev0", "mlp"),
                   "group")])
    with psycopg.connect(postgres_db, autocommit=True) as db:  # what a build worker killed while it built leaves
        db.execute("UPDATE procrastinate_jobs SET status = 'doing', worker_id = NULL WHERE task_name = %s", (BUILD,))

    def no_pool(*_args, **_kwargs):
        raise AssertionError("settle_build opened a procrastinate pool of its own")

    lab.app.open = no_pool  # type: ignore[method-assign]
    assert lab.settle_build(7, "dev0", "mlp") == BuildState.TAKEN
    with psycopg.connect(postgres_db, autocommit=True) as db:
        assert db.execute("SELECT status::text, attempts FROM procrastinate_jobs WHERE task_name = %s",
                          (BUILD,)).fetchone() == ("cancelled", 1)


def test_a_worker_starting_after_an_outage_prunes_only_the_long_dead_not_the_ones_that_lost_the_database(postgres_db):
    """#61: a worker that started in an outage's wake pruned every worker silent for STALLED_S; those were alive
    and waiting for the database, and their next fetch failed on the foreign key and ended them. Now a worker
    prunes at its start only those silent for PRUNE_S."""
    import psycopg

    from farm.lab.jobs import PRUNE_S, STALLED_S
    from farm.lab.queue import LabQueue

    lab = LabQueue(postgres_db)
    lab.install()
    with psycopg.connect(postgres_db, autocommit=True) as db:
        waiting, dead = (db.execute("INSERT INTO procrastinate_workers (last_heartbeat) VALUES "
                                    "(NOW() - make_interval(secs => %s)) RETURNING id", (age,)).fetchone()[0]
                         for age in (STALLED_S + 25, PRUNE_S + 60))
    lab.serve(["farm-host-nobody"], {}, 1, "starting", wait=False)  # no job: it starts, prunes and ends
    with psycopg.connect(postgres_db, autocommit=True) as db:
        left = {row[0] for row in db.execute("SELECT id FROM procrastinate_workers").fetchall()}
    assert waiting in left and dead not in left, left


def test_a_worker_judges_others_stalled_only_once_every_live_worker_could_have_beaten():
    """#61: after an outage, a worker's stall check re-queued the running jobs of live workers that had not yet
    beaten again. Literal clocks in, verdicts out."""
    from farm.lab.jobs import HEARTBEAT_S, STALLED_S, stall_check_due

    never = float("-inf")
    assert stall_check_due(1000.0, 0.0, never)
    assert not stall_check_due(STALLED_S - 1, 0.0, never)  # it just started: the others' beats may be on the way
    assert stall_check_due(STALLED_S, 0.0, never)
    back = 500.0  # its last failed call to the database
    assert not stall_check_due(back + STALLED_S, 0.0, back)
    assert stall_check_due(back + STALLED_S + HEARTBEAT_S, 0.0, back)


def test_a_fetch_whose_answer_was_lost_runs_the_job_it_took_not_another(postgres_db):
    """#61: a fetch that committed (its job marked running for the worker) and lost its answer with the connection
    was run again and took a second job; the first stayed "doing" on a live worker for good, holding its device's
    lock. The lost answer is played by procrastinate's own fetch, run for real, followed by the error a dropped
    connection raises; the fetch run again returns the job it took."""
    import asyncio

    import psycopg

    from farm.lab.jobs import CELL, Job, cell_lock
    from farm.lab.queue import LabQueue

    lab = LabQueue(postgres_db)
    lab.defer([Job(CELL, "lab9", f"dev{i}", {"sweep_id": 9, "device": f"dev{i}", "model": "mlp", "first": True},
                   cell_lock(9, f"dev{i}", "mlp")) for i in range(2)])
    manager = lab.app.job_manager
    real_fetch, lost = manager.fetch_job, []

    async def fetch_then_lose_the_answer(*args, **kwargs):
        job = await real_fetch(*args, **kwargs)
        if not lost:
            lost.append(job.id)
            raise lab._procrastinate.exceptions.ConnectorException() from psycopg.OperationalError("server closed")
        return job

    manager.fetch_job = fetch_then_lose_the_answer
    lab._outlast_restarts()

    async def fetch() -> tuple[int, int]:
        async with lab.app.open_async():
            worker_id = await manager.register_worker()
            job = await manager.fetch_job(queues=["farm-host-lab9"], worker_id=worker_id)
            return job.id, worker_id

    fetched, worker_id = asyncio.run(fetch())
    assert fetched == lost[0]  # the job it took, not a second one
    with psycopg.connect(postgres_db, autocommit=True) as db:
        doing = db.execute("SELECT id FROM procrastinate_jobs WHERE status = 'doing' AND worker_id = %s",
                           (worker_id,)).fetchall()
    assert doing == [(fetched,)]


def test_a_confirmation_rerun_holds_a_lab_device_s_lease_while_it_measures(postgres_db, tmp_path):
    """#61: --confirm reruns from the follower's host measured a lab's devices beside their workers' cells. The
    rerun's hold (``sweep.leases.device_holds``) is the device's lease where a lab's workers share it; a device of
    no lab host, or a SQLite database, holds nothing."""
    from farm.inventory import parse_inventory
    from farm.store import Store
    from farm.lab.leases import device_holds

    devices = parse_inventory('[devices.lab]\nkind = "remote"\nkey = "l"\ntarget = { kind = "llvm" }\nlab_host = "h"\n'
                              '[devices.here]\nkind = "remote"\nkey = "h"\ntarget = { kind = "llvm" }\n').devices
    with Store(postgres_db) as store:
        hold = device_holds(postgres_db, store, "farm sweep 3 --confirm")
        with hold(devices["lab"]):
            assert store.lease_holder("lab")[0] == "farm sweep 3 --confirm (lab)"
            assert store.take_lease("lab", "a worker's cell", 30.0) is None  # the workers' cells wait for it
        assert store.lease_holder("lab") is None
        with hold(devices["here"]):
            assert store.lease_holder("here") is None
    with Store(tmp_path / "r.db") as local, device_holds(str(tmp_path / "r.db"), local, "x")(devices["lab"]):
        assert local.lease_holder("lab") is None


def test_an_answer_after_a_silent_gap_ends_an_outage_as_a_failure_would():
    """#61: in a 25 s outage a worker's calls waited in procrastinate's pool instead of failing, so nothing told
    its stall check the database had been away. An answer after SILENT_GAP_S without any now does."""
    import time

    from farm.lab.jobs import SILENT_GAP_S
    from farm.lab.queue import LabQueue

    lab = LabQueue("postgresql://farm@127.0.0.1:1/nowhere")  # never connected: the worker's clocks only
    now = time.monotonic()
    lab._answered_s, lab._unreachable_s = now - 1.0, float("-inf")
    lab._note_answer()
    assert lab._unreachable_s == float("-inf")  # answers a beat apart: no outage
    lab._answered_s = time.monotonic() - SILENT_GAP_S - 1.0
    lab._note_answer()
    assert lab._unreachable_s >= now  # the gap's end counts as the last time it could not reach the database


def test_a_library_in_the_lab_s_store_is_run_only_when_the_lab_key_signed_it(postgres_db, tmp_path, monkeypatch):
    """#62: a library's sha256 sat beside it in the same row, so whoever could write the lab's database could have
    every host run its code. A host now loads a stored library only when its signature verifies with the lab key in
    the host's own file; a row written without the key (its bytes and sha256 consistent) is refused, and the cell
    compiles on its own host."""
    from farm.compile import artifact_file, compile_model
    from farm.inventory import parse_inventory
    from farm.models import load_model
    from farm.records import BenchConfig, TrackerAddress
    from farm.signing import KEY_ENV, sign
    from farm.store import Store
    from farm.sweep.cell import CellContext
    from farm.lab.worker import LabWorker

    devices = parse_inventory('[devices.d]\nkind = "local"\nkey = "d"\ntarget = { kind = "llvm", mcpu = "x86-64" }\n'
                              'lab_host = "h"\n').devices
    mlp = load_model("mlp")
    built = compile_model(mlp, devices["d"], tmp_path / "builder")
    meta, data = artifact_file(built)
    worker = LabWorker(postgres_db, devices, TrackerAddress("127.0.0.1", 1), tmp_path / "measurer")
    with Store(postgres_db) as store:
        sweep = store.start_sweep({"devices": ["d"], "models": ["mlp"]})
        ctx = CellContext(TrackerAddress("127.0.0.1", 1), tmp_path / "measurer", BenchConfig(), tuned=False,
                          sweep_id=sweep)
        store.put_artifact_file(built.cache_key, built.file_digest, {**meta, "builder": "mallory"}, data)  # no key
        store.record_sweep_build(sweep, "d", "mlp", "mallory", cache_key=built.cache_key)
        refused = worker._stored_build(ctx, store, devices["d"], mlp, True)
        assert refused == "its artifact is refused: it carries no signature of the lab's key"
        assert not (tmp_path / "measurer").exists()
        assert store.artifact_file_head(built.cache_key) is None  # dropped: the next build stores a signed one
        signed = sign(open(os.environ[KEY_ENV], "rb").read().strip(), {**meta, "builder": "b"})
        store.put_artifact_file(built.cache_key, built.file_digest, signed, data)  # as a build worker with the key
        installed = worker._stored_build(ctx, store, devices["d"], mlp, True)
        assert Path(installed.path).read_bytes() == data
        monkeypatch.setenv(KEY_ENV, str(tmp_path / "no-such.key"))  # a host without the key runs none of it
        assert worker._stored_build(ctx, store, devices["d"], mlp, True).startswith("its artifact is refused: this host "
                                                                                   "has no lab key")



def test_a_signature_verifies_only_with_the_key_that_made_it_and_only_for_what_it_signed():
    from farm.signing import sign, unsigned_reason

    key, meta = b"k" * 32, {"cache_key": "a" * 64, "file_digest": "b" * 64, "builder": "w1"}
    signed = sign(key, meta)
    assert unsigned_reason(key, signed) == ""
    assert unsigned_reason(b"x" * 32, signed).startswith("its signature does not verify")
    assert unsigned_reason(key, {**signed, "file_digest": "c" * 64}).startswith("its signature does not verify")
    assert unsigned_reason(None, signed).startswith("this host has no lab key")


def test_a_lab_spec_s_factory_model_runs_only_where_the_host_lists_it(tmp_path, monkeypatch):
    """#62: a spec's module:factory model was imported and called on every worker: whoever could write the lab's
    database ran code on every host. A worker now loads one only when its host's own FARM_LAB_FACTORIES lists it;
    else the cell is stored failed with the reason and a hint. A model file is data: loaded as before."""
    from farm.models import build_mlp
    from farm.records import SweepSpec, TrackerAddress
    from farm.lab.worker import FACTORIES_ENV, LabWorker

    (tmp_path / "lab_models.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(4, 2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(FACTORIES_ENV, raising=False)
    import onnx

    onnx.save(build_mlp(), str(tmp_path / "m.onnx"))
    factory, data = "lab_models:build", str(tmp_path / "m.onnx")
    spec = SweepSpec(("d",), (factory, data), None, shapes={factory: {"input": (1, 4)}})
    worker = LabWorker(str(tmp_path / "r.db"), {}, TrackerAddress("127.0.0.1", 1), tmp_path / "cache")
    _, problem = worker.model_or_problem(spec, factory)
    assert problem.startswith(f"the model does not load on this host: {factory} is a module:factory model")
    assert worker.host_setting(problem)  # stored as offline: a resume measures it once the host lists it
    assert worker.model_or_problem(spec, data)[1] == ""
    monkeypatch.setenv(FACTORIES_ENV, "other:*, lab_models:*")
    source, problem = worker.model_or_problem(spec, factory)
    assert problem == "" and source.name == "build"
