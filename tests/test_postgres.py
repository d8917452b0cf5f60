"""The PostgreSQL store end to end: several writers at once, and the CLI on a `postgresql://` --db.

A real Debian PostgreSQL server is started for the session (tests/conftest.py); nothing is mocked."""

import dataclasses
import json
import subprocess
import sys

import psycopg

from farm.store import SCHEMA_VERSION, Store
from tests.conftest import REPO, run_farm

WRITER = """
import sys
from farm.models import load_model
from farm.store import Store
from tests.test_store import DEVICE, _result

url, writer = sys.argv[1], int(sys.argv[2])
with Store(url) as store:  # all writers open the new, empty database at once: one of them migrates it
    for i in range(20):
        store.record_result(_result(samples=(writer + i / 100, 0.5, 0.25)), DEVICE, load_model("mlp"), None)
"""


def test_four_writers_at_once_lose_nothing(postgres_db):
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, postgres_db, str(w)], cwd=REPO, stderr=subprocess.PIPE,
                                text=True) for w in range(4)]
    errors = [p.communicate(timeout=120)[1] for p in writers]
    assert [p.returncode for p in writers] == [0, 0, 0, 0], errors
    with Store(postgres_db) as store:
        assert store.count("runs") == 80 and store.count("checks") == 80
        assert store.count("samples") == 80 * (3 + 2)  # 3 steady + 2 copy samples each
        firsts = sorted(store.samples(r["id"])[0] for r in store.runs())
    assert firsts == sorted(w + i / 100 for w in range(4) for i in range(20))
    with psycopg.connect(postgres_db) as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)


def test_cli_sweeps_reports_and_probes_on_postgres(farm_net, inventory_file, postgres_db, tmp_path):
    env = {"FARM_HOME": str(tmp_path / "home"), "FARM_DB": postgres_db}
    sweep = run_farm("--devices", str(inventory_file), "sweep", "--device", "cpu-a", "--device", "cpu-b",
                     "--model", "mlp", "--model", "convnet", "--repeat", "3", "--min-repeat-ms", "5", "--no-report",
                     "--json", env=env)
    assert sweep.returncode == 0, (sweep.stdout[-3000:], sweep.stderr[-3000:])
    cells = json.loads(sweep.stdout)["cells"]
    # two device workers wrote at once; a failed cell says its step and reason
    assert len(cells) >= 4 and all(c["status"] == "ok" for c in cells), \
        [(c["device"], c["model"], c["status"], c["failed_step"], c["reason"]) for c in cells]
    results = json.loads(run_farm("--devices", str(inventory_file), "results", "--json", env=env).stdout)
    assert {(r["device"], r["model"]) for r in results} >= {(d, m) for d in ("cpu-a", "cpu-b") for m in ("mlp", "convnet")}
    # every stored attempt, a retried one too: a first attempt that failed says its step and reason here
    assert all(r["steady_n"] == 3 for r in results), \
        [(r["device"], r["model"], r["attempt"], r["status"], r["failed_step"], r["reason"], r["steady_n"]) for r in results]
    report = tmp_path / "report.html"
    made = run_farm("--devices", str(inventory_file), "report", "--out", str(report), env=env)
    assert made.returncode == 0, made.stderr
    text = report.read_text()
    assert "postgresql://farm@127.0.0.1" in text and "convnet" in text, made.stderr[-3000:]
    # the inventory's [store] db names the same database when neither --db nor FARM_DB does
    shared = tmp_path / "shared.toml"
    shared.write_text(f'[store]\ndb = "{postgres_db}"\n' + inventory_file.read_text())
    via_inventory = run_farm("--devices", str(shared), "results", "--json", env={"FARM_HOME": env["FARM_HOME"]})
    assert via_inventory.returncode == 0, via_inventory.stderr
    assert len(json.loads(via_inventory.stdout)) == len(results), via_inventory.stderr[-3000:]
    probe = run_farm("--devices", str(inventory_file), "devices", "--probe", "--timeout", "3", "--json", env=env)
    assert probe.returncode == 0, probe.stderr
    with Store(postgres_db) as store:
        assert store.count("probes") == 3 and store.sweep()["status"] == "done", (probe.stdout, store.sweep())


def test_unreachable_postgres_is_one_clear_error(tmp_path):
    from farm.procs.supervise import free_port

    url = f"postgresql://farm:secret@127.0.0.1:{free_port()}/nowhere"
    proc = run_farm("results", "--json", env={"FARM_HOME": str(tmp_path), "FARM_DB": url})
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: cannot connect to results database postgresql://farm:***@127.0.0.1")
    assert lines[1].startswith("hint: check the URL") and "secret" not in proc.stderr


def test_a_write_waits_for_a_restarting_server_and_is_stored_once(caplog):
    """The server is shut down fast (its sessions end with AdminShutdown, as `pg_ctl restart -m fast` ends them)
    and comes back 2 s later: the write in between waits, reconnects and is stored, once; a read does the same."""
    import threading

    from farm.models import load_model
    from tests.conftest import postgres_server_at
    from tests.test_store import DEVICE, _result

    with postgres_server_at() as server:
        url = f"{server.url}/postgres"
        with Store(url) as store:
            store.record_result(_result(), DEVICE, load_model("mlp"), None, sweep_id=None)
            server.stop()
            restart = threading.Timer(2.0, server.start)
            restart.start()
            try:
                with caplog.at_level("WARNING", logger="farm.store.backends"):
                    run_id = store.record_result(_result(samples=(0.5, 0.25)), DEVICE, load_model("mlp"), None)
            finally:
                restart.join()
            assert store.samples(run_id) == [0.5, 0.25]
            assert store.count("runs") == 2 and store.count("checks") == 2
            server.stop()
            threading.Timer(1.0, server.start).start()
            assert len(store.runs()) == 2  # a read outside a transaction: run again on the new connection
    assert "lost the connection to" in caplog.text and "reconnected to" in caplog.text


def test_a_server_gone_longer_than_the_bound_is_one_store_error_with_a_hint(monkeypatch):
    from farm.errors import ConnectionLost
    from farm.models import load_model
    from farm.store import backends
    from tests.conftest import postgres_server_at
    from tests.test_store import DEVICE, _result

    monkeypatch.setattr(backends, "RECONNECT_S", 1.0)  # the bound itself (60 s) is too long for a test
    with postgres_server_at() as server:
        with Store(f"{server.url}/postgres") as store:
            server.stop()
            try:
                store.record_result(_result(), DEVICE, load_model("mlp"), None)
            except ConnectionLost as exc:
                error = exc
            else:
                raise AssertionError("a write with the server gone did not fail")
    assert error.message.startswith(f"lost the connection to {server.url}/postgres (")
    assert "could not reconnect within 1 s" in error.message
    assert "farm sweep --resume" in error.hint


def test_a_store_shared_by_threads_writes_each_cell_whole_on_one_connection(postgres_db):
    """A worker's jobs share one store (``shared_store``): 8 threads storing 10 cells each, each a TVM run and its
    reference run in one transaction, all stored, none torn, through this process's one connection."""
    import os
    import threading

    from farm.models import load_model
    from farm.records import RunToStore
    from farm.store import shared_store
    from tests.test_store import DEVICE, _result

    store, mlp = shared_store(postgres_db), load_model("mlp")
    assert shared_store(postgres_db) is store
    sweep = store.start_sweep({"devices": ["cpu"], "models": ["mlp"]})
    errors: list[BaseException] = []

    def write(thread: int) -> None:
        try:
            for i in range(10):
                tvm = dataclasses.replace(_result(samples=(thread + i / 100,)), model=f"m{thread}-{i}")
                reference = dataclasses.replace(tvm, runtime="onnxruntime")
                store.record_cell(RunToStore(tvm, DEVICE, mlp, None), reference=RunToStore(reference, DEVICE, mlp, None),
                                  sweep_id=sweep)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    runs = store.runs(sweep_id=sweep)
    assert len(runs) == 160 and {(r["model"], r["runtime"]) for r in runs} == {
        (f"m{t}-{i}", runtime) for t in range(8) for i in range(10) for runtime in ("tvm", "onnxruntime")}
    assert sorted(store.samples(r["id"])[0] for r in runs if r["runtime"] == "tvm") == sorted(
        t + i / 100 for t in range(8) for i in range(10))
    with psycopg.connect(postgres_db, autocommit=True) as db:  # to this database: an earlier test of this process
        # may keep a worker's shared store open on another database of the same server
        assert db.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = %s "
                          "AND datname = current_database()", (f"farm:{os.getpid()}",)).fetchone()[0] == 1


def test_threads_that_lost_one_shared_connection_wait_for_one_outage_not_one_each(monkeypatch, caplog):
    """#61: each thread waiting on the shared connection took a deadline of its own, in turn under its lock (24
    slots: ~25 minutes). Now the outage's deadline is shared: one reconnect tries until it, and the threads after
    it fail at once, each with one error. Counted by each thread's tries to connect, not by time."""
    import collections
    import threading

    from farm.errors import ConnectionLost
    from farm.models import load_model
    from farm.store import backends
    from tests.conftest import postgres_server_at
    from tests.test_store import DEVICE, _result

    monkeypatch.setattr(backends, "RECONNECT_S", 2.0)  # the bound itself (60 s) is too long for a test
    mlp, errors = load_model("mlp"), []
    with postgres_server_at() as server:
        with Store(f"{server.url}/postgres") as store:
            server.stop()
            tries: collections.Counter = collections.Counter()
            connect = psycopg.connect

            def counted(*args, **kwargs):
                tries[threading.get_ident()] += 1
                return connect(*args, **kwargs)

            monkeypatch.setattr(psycopg, "connect", counted)

            def write() -> None:
                try:
                    store.record_result(_result(), DEVICE, mlp, None)
                except ConnectionLost as exc:
                    errors.append(exc)

            with caplog.at_level("WARNING", logger="farm.store.backends"):
                threads = [threading.Thread(target=write) for _ in range(6)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
            reconnects = caplog.text.count("reconnecting")
            monkeypatch.setattr(psycopg, "connect", connect)
            server.start()
            store.record_result(_result(), DEVICE, mlp, None)  # the server back: the next write reconnects
            assert store.count("runs") == 1
    assert len(errors) == 6
    assert reconnects == 6
    counts = sorted(tries.values())  # the first thread tried until the outage's deadline, the others once each
    assert counts[:-1] == [1] * 5 and counts[-1] > 1, counts
    assert sum("could not reconnect within 2 s" in e.message for e in errors) == 6


def test_a_write_to_a_server_answering_read_only_waits_for_a_writable_one(caplog):
    """#61: a standby that answers read-only during a failover (SQLSTATE 25006) was taken for a failed write, at
    once. Now it is a lost connection: the write reconnects, waits for a writable server and is stored once. The
    standby is played by the server itself set read-only (default_transaction_read_only, reloaded), then set back."""
    import threading

    from farm.models import load_model
    from tests.conftest import postgres_server_at
    from tests.test_store import DEVICE, _result

    def read_only(on: bool) -> None:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SET default_transaction_read_only = off")
            admin.execute(f"ALTER SYSTEM SET default_transaction_read_only = {'on' if on else 'off'}")
            admin.execute("SELECT pg_reload_conf()")

    with postgres_server_at() as server:
        url = f"{server.url}/postgres"
        with Store(url) as store:
            read_only(True)
            back = threading.Timer(2.0, read_only, (False,))
            back.start()
            try:
                with caplog.at_level("WARNING", logger="farm.store.backends"):
                    run_id = store.record_result(_result(samples=(0.5,)), DEVICE, load_model("mlp"), None)
            finally:
                back.join()
            assert store.samples(run_id) == [0.5] and store.count("runs") == 1
    assert "read-only" in caplog.text and "reconnected to" in caplog.text


SECRET = "hunter2-never-printed"


def test_a_database_password_is_never_printed_by_any_verb(postgres_db, inventory_file, tmp_path):
    """#62: a URL's ?password= (and a password in its user part) was printed by farm compare, report, regressions,
    results, sweep and drift. The server trusts the test's user, so the password is carried and ignored."""
    from urllib.parse import urlsplit

    url = urlsplit(postgres_db)
    in_query = f"{postgres_db}?password={SECRET}"
    in_user = postgres_db.replace(f"//{url.username}@", f"//{url.username}:{SECRET}@")
    verbs = [("results", "--json"), ("compare", "1", "2"), ("report", "--sweep", "5", "--out", str(tmp_path / "r.html")),
             ("regressions", "--json"), ("drift", "--json"), ("sweep", "--resume", "9")]
    said = []
    for db in (in_query, in_user):
        for verb in verbs:
            done = run_farm("--devices", str(inventory_file), "--db", db, *verb)
            said.append((verb[0], done.returncode, done.stdout + done.stderr))
    assert all(SECRET not in text for _, _, text in said), [(v, t[-300:]) for v, _, t in said if SECRET in t]
    # each verb reached the database and said something of it (the URL, redacted, where it names it)
    assert any("password=***" in text for _, _, text in said) and any(":***@" in text for _, _, text in said)
