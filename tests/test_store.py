import dataclasses
import sqlite3

import pytest

from farm.errors import StoreError
from farm.models import load_model
from farm.records import BenchConfig, BenchResult, CheckResult, CopyTiming, Device, StoredAttempt
from farm.analysis.results import rows_frame, run_rows
from farm.store import SCHEMA_VERSION, Store

DEVICE = Device("cpu", "local", "cpu", {"kind": "llvm"})


def _result(status="ok", samples=(0.002, 0.001, 0.003)) -> BenchResult:
    return BenchResult(
        device="cpu", key="cpu", model="mlp", model_digest=load_model("mlp").digest, status=status,
        reason="" if status == "ok" else "boom", failed_step="" if status == "ok" else "load",
        load_s=0.5, first_run_s=0.01, steady_number=10, steady_samples_s=samples,
        copies=(CopyTiming(0, 40, (1, 10), "float32", 100, (1e-6, 2e-6)),),
        check=CheckResult("passed", 1e-7, 1e-4, 1e-4, "onnxruntime"), config=BenchConfig(),
        context={"farm_version": "0.1.0", "tvm_version": "0.27"}, started_at="2026-11-22T00:00:00+00:00",
    )


def test_record_result_keeps_every_raw_sample(db_location):
    with Store(db_location) as store:
        run_id = store.record_result(_result(), DEVICE, load_model("mlp"), None)
        assert store.samples(run_id) == [0.002, 0.001, 0.003]
        assert store.samples(run_id, "copy", 0) == [1e-6, 2e-6]
        row = run_rows(store)[0]
    assert row["steady_median_s"] == 0.002 and row["steady_n"] == 3 and row["steady_number"] == 10
    assert row["copy_bytes"] == (40,) and row["copy_s"] == (1.5e-6,)
    assert row["check"] == "passed"


def test_a_sweep_s_attempt_delivered_twice_is_stored_once(db_location):
    """A cell's job run again after its result committed (a worker killed before the queue heard) stores nothing:
    the same run id, one row, its samples once. Another attempt, another runtime, another sweep or a run outside a
    sweep is a run of its own; a cell stored offline may be stored again (each resume while it is down)."""
    from farm.records import OFFLINE_ATTEMPT

    mlp = load_model("mlp")
    with Store(db_location) as store:
        sweep = store.start_sweep({"devices": ["cpu"], "models": ["mlp"]})
        first = store.record_result(_result(), DEVICE, mlp, None, sweep, 1)
        again = store.record_result(_result(samples=(9.0,)), DEVICE, mlp, None, sweep, 1)
        assert again == first and store.samples(first) == [0.002, 0.001, 0.003]
        others = [store.record_result(_result(), DEVICE, mlp, None, sweep, 2),
                  store.record_result(dataclasses.replace(_result(), runtime="onnxruntime"), DEVICE, mlp, None, sweep, 1),
                  store.record_result(_result(), DEVICE, mlp, None, store.start_sweep({}), 1),
                  store.record_result(_result(), DEVICE, mlp, None),
                  store.record_result(_result(), DEVICE, mlp, None),
                  store.record_result(_result("failed", ()), DEVICE, mlp, None, sweep, OFFLINE_ATTEMPT),
                  store.record_result(_result("failed", ()), DEVICE, mlp, None, sweep, OFFLINE_ATTEMPT)]
        assert len({first, *others}) == 8
        assert store.sweep_attempts(sweep) == {("cpu", "mlp"): [
            StoredAttempt(1, "ok", ""), StoredAttempt(2, "ok", ""), StoredAttempt(0, "failed", "load"),
            StoredAttempt(0, "failed", "load")]}


def test_store_uses_wal_and_schema_version(tmp_path):
    Store(tmp_path / "r.db").close()
    db = sqlite3.connect(tmp_path / "r.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)


def test_latest_only_and_csv(db_location):
    with Store(db_location) as store:
        store.record_result(_result(), DEVICE, load_model("mlp"), None)
        newest = store.record_result(_result("failed", ()), DEVICE, load_model("mlp"), None)
        rows = run_rows(store, latest_only=True)
    assert [r["run_id"] for r in rows] == [newest]
    assert rows[0]["status"] == "failed" and rows[0]["reason"] == "boom"
    csv = rows_frame(rows).to_csv(index=False)
    assert csv.splitlines()[0].startswith("run_id,started_at,device")


def test_not_a_database_is_store_error(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError) as info:
        Store(path)
    assert "cannot open results database" in info.value.message


def raw_connection(location: str):
    """The database without farm: sqlite3 or psycopg, as an operator would open it."""
    if location.startswith("postgresql://"):
        import psycopg

        return psycopg.connect(location, autocommit=True)
    return sqlite3.connect(location, isolation_level=None)


def test_newer_schema_is_refused(db_location):
    Store(db_location).close()
    db = raw_connection(db_location)
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.close()
    with pytest.raises(StoreError, match="newer than this farm"):
        Store(db_location)


def test_version_1_database_is_migrated_keeping_its_runs(db_location):
    from farm.store.schema import MIGRATIONS, postgres_ddl, statements

    path = db_location
    db = raw_connection(path)
    for statement in statements(MIGRATIONS[1]):
        db.execute(postgres_ddl(statement) if path.startswith("postgresql://") else statement)
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    db.execute("""INSERT INTO runs (started_at, device, key, model, model_digest, artifact_key, status, failed_step,
                  reason, steady_repeat, min_repeat_ms, emulated, farm_version, tvm_version, context, config)
                  VALUES ('t', 'cpu', 'cpu', 'mlp', 'd', 'a', 'ok', '', '', 3, 5, 0, '0', '0', '{}', '{}')""")
    db.close()
    with Store(path) as store:
        rows = run_rows(store)
        assert store.count("tune_records") == 0
    assert [(r["device"], r["tuned"]) for r in rows] == [("cpu", False)]
    assert raw_connection(path).execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)


def _summary_rows(location: str) -> list[tuple]:
    return [tuple(r) for r in raw_connection(location).execute("SELECT * FROM summaries ORDER BY run_id, metric, series")]


def test_summaries_are_written_with_the_samples_and_reads_take_them_from_there(db_location):
    from farm.stats import summarize

    samples = (0.004, 0.001, 0.003, 0.002)  # even: the median is the mean of the middle two
    with Store(db_location) as store:
        run_id = store.record_result(_result(samples=samples), DEVICE, load_model("mlp"), None)
    assert [r[:3] for r in _summary_rows(db_location)] == [(run_id, "copy", 0), (run_id, "steady", 0)]
    db = raw_connection(db_location)
    db.execute("DELETE FROM samples")  # what reads the runs never reads a raw sample
    db.close()
    with Store(db_location) as store:
        row = run_rows(store)[0]
    assert row.steady == summarize(samples) and row.steady_median_s == 0.0025
    assert row.copy_s == (1.5e-6,) and row.steady_wall is None


SCHEMA_4_ALERTS = """CREATE TABLE alerts (
    id {id}, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
    sweep_id INTEGER NOT NULL, device TEXT NOT NULL, model TEXT NOT NULL, tuned INTEGER NOT NULL,
    metric TEXT NOT NULL, run_id INTEGER NOT NULL, baseline_run_id INTEGER, status TEXT NOT NULL,
    value {real} NOT NULL, z {real}, change {real}, baseline TEXT NOT NULL, method TEXT NOT NULL,
    confirmation TEXT NOT NULL DEFAULT '{{}}', UNIQUE (sweep_id, device, model, tuned, metric))"""


def undo_schemas_21_to_23(db) -> None:
    """Undo schemas 23, 22 and 21 by hand (a store from before them): triage events, manifests, start keys."""
    db.execute("DROP INDEX alerts_series")  # schema 23
    db.execute("DROP TABLE finding_events")
    db.execute("ALTER TABLE findings DROP COLUMN bug")
    db.execute("ALTER TABLE findings DROP COLUMN duplicate_of")
    db.execute("DROP TABLE manifests")  # schema 22
    db.execute("ALTER TABLE runs DROP COLUMN manifest")
    db.execute("DROP INDEX sweeps_start_key")  # schema 21
    db.execute("ALTER TABLE sweeps DROP COLUMN start_key")


def back_to_schema_8(db, location: str) -> None:
    """Undo schema 9 by hand (what farm 8 left): runs without a runtime, the old runs_series index, alerts keyed
    without a runtime (rebuilt, rows kept)."""
    pg = location.startswith("postgresql://")
    undo_schemas_21_to_23(db)
    db.execute("DROP TABLE profiles")  # schema 20
    db.execute("DROP TABLE device_leases")  # schema 19
    db.execute("DROP INDEX copy_curves_curve_key")
    db.execute("ALTER TABLE copy_curves DROP COLUMN curve_key")
    db.execute("DROP TABLE artifact_files")  # schema 18
    db.execute("DROP TABLE sweep_builds")
    db.execute("DROP TABLE night_tunings")  # schema 17
    db.execute("DROP INDEX runs_cell_key")  # schema 16
    db.execute("ALTER TABLE runs DROP COLUMN cell_key")
    db.execute("ALTER TABLE models DROP COLUMN ops")  # schema 15
    db.execute("ALTER TABLE runs DROP COLUMN threads")  # schema 14
    db.execute("DROP TABLE reviewed_sweeps")  # schema 13
    for table in ("finding_sweeps", "findings", "confirmation_budgets"):
        db.execute(f"DROP TABLE {table}")  # schema 12
    for table, column in [*(("artifacts", c) for c in ("params_bytes", "planned_host_bytes", "planned_device_bytes",
                                                      "planned_dynamic")),
                          *(("runs", c) for c in ("params_bytes", "planned_host_bytes", "planned_device_bytes",
                                                  "rss_before_load_bytes", "rss_after_load_bytes", "rss_peak_bytes"))]:
        db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")  # schema 11
    db.execute("DROP TABLE tune_cost_models")  # schema 10
    db.execute("DROP INDEX runs_series")
    db.execute("ALTER TABLE runs DROP COLUMN runtime")
    db.execute("ALTER TABLE runs DROP COLUMN runtime_version")
    db.execute("CREATE INDEX runs_series ON runs (device, model, tuned, id)")
    db.execute("ALTER TABLE alerts RENAME TO alerts_9")
    db.execute(SCHEMA_4_ALERTS.format(id="SERIAL PRIMARY KEY" if pg else "INTEGER PRIMARY KEY AUTOINCREMENT",
                                      real="DOUBLE PRECISION" if pg else "REAL"))
    columns = ("id, created_at, updated_at, sweep_id, device, model, tuned, metric, run_id, baseline_run_id, status, "
               "value, z, change, baseline, method, confirmation")
    db.execute(f"INSERT INTO alerts ({columns}) SELECT {columns} FROM alerts_9")
    db.execute("DROP TABLE alerts_9")
    if pg:
        db.execute("SELECT setval(pg_get_serial_sequence('alerts', 'id'), COALESCE((SELECT MAX(id) FROM alerts), 0) + 1, false)")
    db.execute("UPDATE meta SET value='8' WHERE key='schema_version'")


def test_a_schema_12_database_keeps_the_reviews_it_can_tell(db_location):
    """Schema 13 records every review (a quiet one too); a schema-12 file's reviews are its sweeps with stored findings
    or a confirmation budget; schema 23 carries a finding across the quiet reviewed nights between (within
    ``CARRY_GAP``)."""
    finding = {"key": "series|steady|slower|cpu|mlp", "kind": "series", "metric": "steady"}
    with Store(db_location) as store:
        first = store.record_findings(3, [finding])[finding["key"]]
        store.save_budget(5, 1800.0, 60.0, 1, 0)
    db = raw_connection(db_location)
    undo_schemas_21_to_23(db)
    db.execute("DROP TABLE profiles")  # schema 20
    db.execute("DROP TABLE device_leases")  # schema 19
    db.execute("DROP INDEX copy_curves_curve_key")
    db.execute("ALTER TABLE copy_curves DROP COLUMN curve_key")
    db.execute("DROP TABLE artifact_files")  # schema 18
    db.execute("DROP TABLE sweep_builds")
    db.execute("DROP TABLE night_tunings")  # schema 17
    db.execute("DROP INDEX runs_cell_key")  # schema 16
    db.execute("ALTER TABLE runs DROP COLUMN cell_key")
    db.execute("ALTER TABLE models DROP COLUMN ops")  # schema 15
    db.execute("ALTER TABLE runs DROP COLUMN threads")  # schema 14
    db.execute("DROP TABLE reviewed_sweeps")
    db.execute("UPDATE meta SET value='12' WHERE key='schema_version'")
    db.close()
    with Store(db_location) as store:
        again = store.record_findings(6, [finding])[finding["key"]]  # sweep 5 was reviewed without it
        store.record_findings(7, [])  # quiet, reviewed
        third = store.record_findings(8, [finding])[finding["key"]]
    # schema 23's rule: a finding back within a few reviewed nights is the same one (schema 13 made it new again)
    assert again["id"] == third["id"] == first["id"] and again["first_sweep"] == third["first_sweep"] == 3
    db = raw_connection(db_location)
    assert [row[0] for row in db.execute("SELECT sweep_id FROM reviewed_sweeps ORDER BY sweep_id").fetchall()] == [
        3, 5, 6, 7, 8]
    db.close()


def test_a_schema_13_database_reads_its_runs_unchanged_with_threads_not_known(db_location):
    """Schema 14 stores each run's threads; the runs stored before have none (NULL), and read as before: the same
    series context (no threads in it), so their baselines go on until a run states its threads."""
    with Store(db_location) as store:
        run_id = store.record_result(_result(), DEVICE, load_model("mlp"), None)
        written = run_rows(store)
    db = raw_connection(db_location)
    undo_schemas_21_to_23(db)
    db.execute("DROP TABLE profiles")  # schema 20
    db.execute("DROP TABLE device_leases")  # schema 19
    db.execute("DROP INDEX copy_curves_curve_key")
    db.execute("ALTER TABLE copy_curves DROP COLUMN curve_key")
    db.execute("DROP TABLE artifact_files")  # schema 18
    db.execute("DROP TABLE sweep_builds")
    db.execute("DROP TABLE night_tunings")  # schema 17
    db.execute("DROP INDEX runs_cell_key")  # schema 16
    db.execute("ALTER TABLE runs DROP COLUMN cell_key")
    db.execute("ALTER TABLE models DROP COLUMN ops")  # schema 15
    db.execute("ALTER TABLE runs DROP COLUMN threads")
    db.execute("UPDATE meta SET value='13' WHERE key='schema_version'")
    db.close()
    with Store(db_location) as store:
        read = run_rows(store)
        threaded = store.record_result(dataclasses.replace(_result(), threads=2), DEVICE, load_model("mlp"), None)
        rows = {r.run_id: r for r in run_rows(store)}
    assert [r.run_id for r in read] == [run_id] and read[0].threads is None
    assert read[0].series_context == written[0].series_context and "threads" not in read[0].series_context
    assert rows[threaded].threads == 2 and rows[threaded].series_context != rows[run_id].series_context


def test_a_schema_8_database_gets_runtimes_and_keeps_its_alerts(db_location):
    verdict = {"sweep_id": 1, "device": "cpu", "model": "mlp", "tuned": False, "metric": "steady", "run_id": 1,
               "baseline_run_id": None, "status": "candidate", "value": 0.002, "z": 3.0, "change": 0.2, "baseline": None}
    with Store(db_location) as store:
        run_id = store.record_result(_result(), DEVICE, load_model("mlp"), None)
        alert_id = store.save_alert(verdict, {"window": 20})
        written = run_rows(store)
    db = raw_connection(db_location)
    back_to_schema_8(db, db_location)
    db.close()
    with Store(db_location) as store:  # migrated to 9: the run is TVM's, the alert kept with its id
        assert run_rows(store) == written and written[0].runtime == "tvm" and written[0].run_id == run_id
        assert [(a.id, a.runtime, a.status) for a in store.alerts()] == [(alert_id, "tvm", "candidate")]
        # the same series and metric of the reference runtime is an alert of its own; new ids follow the kept one
        reference = store.save_alert({**verdict, "runtime": "onnxruntime"}, {"window": 20})
        assert reference > alert_id and store.save_alert(verdict, {"window": 20}) == alert_id
        assert sorted(a.runtime for a in store.alerts()) == ["onnxruntime", "tvm"]


def test_a_schema_7_database_gets_its_runs_summarized_once_on_open(db_location):
    with Store(db_location) as store:
        for samples in [(0.002, 0.001, 0.003), (0.5, 0.1), (0.007,)]:
            store.record_result(_result(samples=samples), DEVICE, load_model("mlp"), None)
        written = run_rows(store)
    before = _summary_rows(db_location)
    db = raw_connection(db_location)  # what farm 7 left: no summaries, schema 7
    back_to_schema_8(db, db_location)
    db.execute("DROP TABLE summaries")
    db.execute("DELETE FROM meta WHERE key='summary_rule'")
    db.execute("UPDATE meta SET value='7' WHERE key='schema_version'")
    db.close()
    with pytest.raises(StoreError, match="older farm") as info:  # the dashboard opens read-only: it says how
        Store(db_location, readonly=True)
    assert "farm results --db" in info.value.hint
    with Store(db_location) as store:
        assert run_rows(store) == written and store.count("summaries") == 6
    assert _summary_rows(db_location) == before


def test_summaries_are_recomputed_when_farms_rule_changes(db_location):
    with Store(db_location) as store:
        store.record_result(_result(), DEVICE, load_model("mlp"), None)
    before = _summary_rows(db_location)
    db = raw_connection(db_location)
    db.execute("UPDATE summaries SET median = 99")
    db.execute("UPDATE meta SET value = 'an older rule' WHERE key='summary_rule'")
    db.close()
    with Store(db_location) as store:
        assert run_rows(store)[0].steady_median_s == 0.002
    assert _summary_rows(db_location) == before


def test_a_run_is_a_frozen_record_readable_by_name(db_location):
    import dataclasses

    from farm.analysis.results import COLUMNS

    with Store(db_location) as store:
        store.record_result(_result(), DEVICE, load_model("mlp"), None)
        row = run_rows(store)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.status = "failed"
    assert set(COLUMNS) <= set(dict(row)) and row["unstable"] is row.unstable is True  # CV 50 %
    with pytest.raises(KeyError):
        row["no_such_field"]


def test_a_run_read_as_a_plain_tuple_has_each_stored_column_under_its_own_name(db_location):
    """results.run_rows builds each Run positionally from Store.run_table: every field read from a column holds
    that column's value (a column out of order would put a string where a number is, or shift the Nones)."""
    import json

    with Store(db_location) as store:
        store.record_result(_result(), DEVICE, load_model("mlp"), None)
        row, stored = run_rows(store)[0], store.runs()[0]
    renamed = {"run_id": "id", "check": "check_status"}
    compared = [f.name for f in dataclasses.fields(row) if renamed.get(f.name, f.name) in stored]
    assert len(compared) >= 35, compared
    unknown = {"check": "skipped", "tuned_tasks": 0, "total_tasks": 0}  # read as these when not stored
    for name in compared:
        expected = stored[renamed.get(name, name)]
        expected = json.loads(expected) if name == "context" else unknown.get(name) if expected is None else expected
        assert getattr(row, name) == expected, name
    assert row.emulated is False and row.tuned is False and row.steady_number == 10 and row.check == "passed"


def test_tuning_lines_merge_in_order_without_duplicates(db_location):
    with Store(db_location) as store:
        assert store.add_tuning_lines("k", ['{"w": 2}', '{"w": 1}'], [(0, '{"r": "b"}', 0.2), (1, '{"r": "a"}', 0.1)]) == 2
        # the same lines again (from another host's JSON database) add nothing; a new one is appended
        assert store.add_tuning_lines("k", ['{"w": 1}'], [(0, '{"r": "a"}', 0.1), (0, '{"r": "c"}', 0.3)]) == 1
        workloads, records = store.tuning_lines("k")
    assert workloads == ['{"w": 2}', '{"w": 1}']
    assert records == ['[0, {"r": "b"}]', '[1, {"r": "a"}]', '[1, {"r": "c"}]']


def test_sweeps_alerts_and_probes_round_trip(db_location):
    from farm.rpc.probe import Probe

    verdict = {"sweep_id": 0, "device": "cpu", "model": "mlp", "tuned": False, "metric": "steady", "run_id": 1,
               "baseline_run_id": None, "status": "candidate", "value": 0.002, "z": 3.5, "change": 0.25,
               "baseline": {"median_s": 0.0016}}
    with Store(db_location) as store:
        sweep_id = store.start_sweep({"devices": ["cpu"], "models": ["mlp"]})
        store.record_result(_result(), DEVICE, load_model("mlp"), None, sweep_id=sweep_id)
        store.finish_sweep(sweep_id, "done")
        first = store.save_alert({**verdict, "sweep_id": sweep_id}, {"z": 1.0}, "confirmed", {"mwu_p": 0.001})
        again = store.save_alert({**verdict, "sweep_id": sweep_id}, {"z": 1.0})  # re-detected: confirmation kept
        store.record_probes([Probe("cpu", "cpu", "online", "", 0.01, 100.0), Probe("cpu", "cpu", "missing", "gone", None, 200.0)])
        assert store.sweep()["status"] == "done"
        assert store.sweep_attempts(sweep_id) == {("cpu", "mlp"): [StoredAttempt(1, "ok", "")]}
        alerts = store.alerts(sweep_id)
        assert first == again and [(a["status"], a["confirmation"]) for a in alerts] == [("confirmed", {"mwu_p": 0.001})]
        assert store.last_online() == {"cpu": 100.0} and store.latest_probes()["cpu"]["state"] == "missing"
        assert store.count("probes") == 2


def test_readonly_store_cannot_write(db_location):
    Store(db_location).close()
    with Store(db_location, readonly=True) as store:
        with pytest.raises(StoreError):
            store.record_result(_result(), DEVICE, load_model("mlp"), None)


def test_a_sweep_s_night_of_tuning_is_stored_per_key_an_empty_one_too(db_location):
    """Schema 17: each key's night (nightly.NightTuning as dicts), replaced when stored again; a key that tuned
    nothing is known as tuned (a tuning job delivered again does nothing) and lists nothing."""
    kept = {"device": "cpu-a", "model": "mlp", "status": "kept", "trials": 8}
    with Store(db_location) as store:
        store.save_night_tuning(4, "cpu-b", [])
        store.save_night_tuning(4, "cpu-a", [{**kept, "status": "failed"}])
        store.save_night_tuning(4, "cpu-a", [kept, {**kept, "model": "convnet"}])
        store.save_night_tuning(5, "cpu-a", [kept])
        assert store.night_tuned(4) == {"cpu-a", "cpu-b"} and store.night_tuned(6) == set()
        assert store.night_tunings(4) == [kept, {**kept, "model": "convnet"}]


def test_a_cell_is_stored_whole_with_its_fallback_and_reference_or_not_at_all(db_location):
    """TVM's run, its CPU fallback and its reference run are one transaction: a failure inside (here a reference
    result the schema refuses, NULL in a NOT NULL column) leaves none of them; stored again, all three are there,
    the fallback pointing at TVM's run; stored a third time (a redelivered job), nothing new."""
    from farm.records import RunToStore

    mlp = load_model("mlp")
    gpu = _result("failed")
    cpu = dataclasses.replace(_result(), device="cpu@cpu")
    reference = dataclasses.replace(_result(), runtime="onnxruntime")
    with Store(db_location) as store:
        sweep = store.start_sweep({"devices": ["cpu"], "models": ["mlp"]})
        broken = dataclasses.replace(reference, status=None)
        try:
            store.record_cell(RunToStore(gpu, DEVICE, mlp, None), RunToStore(cpu, DEVICE, mlp, None),
                              RunToStore(broken, DEVICE, mlp, None), sweep)  # type: ignore[arg-type]
        except StoreError:
            pass
        else:
            raise AssertionError("a reference run with no status was stored")
        assert store.count("runs") == 0 and store.count("samples") == 0 and store.sweep_attempts(sweep) == {}
        ids = store.record_cell(RunToStore(gpu, DEVICE, mlp, None), RunToStore(cpu, DEVICE, mlp, None),
                                RunToStore(reference, DEVICE, mlp, None), sweep)
        again = store.record_cell(RunToStore(gpu, DEVICE, mlp, None), RunToStore(cpu, DEVICE, mlp, None),
                                  RunToStore(reference, DEVICE, mlp, None), sweep)
        assert again == ids and store.count("runs") == 3
        runs = {r["id"]: r for r in store.runs(sweep_id=sweep)}
        assert [(runs[i]["device"], runs[i]["runtime"], runs[i]["fallback_of"]) for i in ids] == [
            ("cpu", "tvm", None), ("cpu@cpu", "tvm", ids[0]), ("cpu", "onnxruntime", None)]


def test_a_lease_fences_its_holder_a_silent_one_is_taken_over_and_its_result_refused(db_location):
    """A device's lease is one holder's; a second waits. Not renewed past its time (a frozen worker), it is taken
    by the next holder under the next epoch, which names the one it was taken from; the first holder's renewal and
    its result are refused (LeaseLost, nothing stored), the new holder's are stored. Released, it is taken afresh."""
    import time

    from farm.errors import LeaseLost
    from farm.records import RunToStore

    mlp = load_model("mlp")
    with Store(db_location) as store:
        sweep = store.start_sweep({"devices": ["cpu"], "models": ["mlp"]})
        frozen = store.take_lease("cpu", "worker-a", 0.5)
        assert frozen is not None and frozen.epoch == 1 and not frozen.taken_over
        assert store.take_lease("cpu", "worker-b", 30.0) is None
        assert store.lease_holder("cpu")[:2] == ("worker-a", 1)
        time.sleep(1.0)  # worker-a renews nothing: its lease ends by the database's clock
        taken = store.take_lease("cpu", "worker-b", 30.0)
        assert taken is not None and taken.epoch == 2 and taken.previous == "worker-a"
        assert not store.renew_lease(frozen, 30.0) and store.renew_lease(taken, 30.0)
        try:
            store.record_cell(RunToStore(_result(), DEVICE, mlp, None), sweep_id=sweep, lease=frozen)
        except LeaseLost as exc:
            assert exc.message == ("worker-a lost device cpu's lease (epoch 1) while it measured; it is now worker-b "
                                   "(epoch 2)'s: its result is refused, not stored")
        else:
            raise AssertionError("a result measured under a lost lease was stored")
        assert store.count("runs") == 0
        store.record_cell(RunToStore(_result(), DEVICE, mlp, None), sweep_id=sweep, lease=taken)
        assert store.count("runs") == 1
        store.release_lease(taken)
        assert store.lease_holder("cpu") is None
        fresh = store.take_lease("cpu", "worker-a", 30.0)
        assert fresh is not None and fresh.epoch == 3 and not fresh.taken_over


def test_a_sweep_s_copy_curve_is_stored_once_per_attempt(db_location):
    from farm.records import CopyCurve, CopyPoint

    curve = CopyCurve("cpu", "cpu", "cuda", "2026-11-28T00:00:00+00:00", (CopyPoint("d2h", 4096, 10, (1e-6, 2e-6)),))
    with Store(db_location) as store:
        sweep = store.start_sweep({"devices": ["cpu"], "models": ["mlp"]})
        first = store.record_copy_curve(curve, sweep)
        assert store.record_copy_curve(curve, sweep) == first  # a curve job delivered again
        second = store.record_copy_curve(dataclasses.replace(curve, status="failed"), sweep, attempt=2)
        outside = [store.record_copy_curve(curve), store.record_copy_curve(curve)]
        assert len({first, second, *outside}) == 4 and store.count("copy_curve_samples") == 4 * 2
        assert store.sweep_curves(sweep, "cpu") == ["ok", "failed"]


def test_a_cell_s_standing_tells_what_a_resume_measures_again():
    """Literal attempts in, exact standings out: ok; failed for good (a compile failure is never measured again,
    retries or not; retries spent); failed with retries left; only offline; nothing stored."""
    from farm.records import OFFLINE_ATTEMPT, CellStanding, SweepSpec

    spec = SweepSpec(("cpu",), ("mlp",), retries=1)
    cases = {
        CellStanding.OK: [StoredAttempt(1, "failed", "session"), StoredAttempt(2, "ok", "")],
        CellStanding.FAILED: [StoredAttempt(1, "failed", "compile")],
        CellStanding.RETRY: [StoredAttempt(OFFLINE_ATTEMPT, "failed", "offline"), StoredAttempt(1, "failed", "load")],
        CellStanding.OFFLINE: [StoredAttempt(OFFLINE_ATTEMPT, "failed", "offline")],
        CellStanding.NEVER: [],
    }
    assert {standing: spec.standing(attempts) for standing, attempts in cases.items()} == {s: s for s in cases}
    assert spec.standing([StoredAttempt(1, "failed", "load"), StoredAttempt(2, "failed", "session")]) == \
        CellStanding.FAILED  # its one retry spent
    assert [s for s in cases if spec.cell_done(cases[s])] == [CellStanding.OK, CellStanding.FAILED]


def test_a_run_s_profile_is_stored_with_it_and_a_schema_19_database_gets_the_table(db_location):
    """Schema 20: a run's per-kernel profile is written with the run (its kernels as one compact row) and read back
    whole, on both backends; a run without one has none; a profile 'not available' keeps its reason. A schema-19
    database keeps its runs and gets the table."""
    from farm.records import KernelProfile, KernelTime

    profile = KernelProfile("ok", "", "wall", 10, 0.004, (
        KernelTime("fused_conv2d_add_relu", "conv", 1.0, 0.003, ("float32[1, 3, 32, 32]", "float32[1, 16, 32, 32]"),
                   884736.0, "tuned"),
        KernelTime("vm.builtin.alloc_tensor", "vm", 2.0, 0.0001)))
    with Store(db_location) as store:
        plain = store.record_result(_result(), DEVICE, load_model("mlp"), None)
        written = run_rows(store)
    db = raw_connection(db_location)
    undo_schemas_21_to_23(db)
    db.execute("DROP TABLE profiles")
    db.execute("UPDATE meta SET value='19' WHERE key='schema_version'")
    db.close()
    with Store(db_location) as store:
        assert run_rows(store) == written
        profiled = store.record_result(dataclasses.replace(_result(), profile=profile), DEVICE, load_model("mlp"), None)
        missing = store.record_result(dataclasses.replace(_result(), profile=KernelProfile(
            "not available", "the device's server has no farm.KernelProfile")), DEVICE, load_model("mlp"), None)
        assert store.profile(profiled) == profile and store.profile(plain) is None
        assert store.profiles([plain, profiled, missing])[missing].reason == "the device's server has no farm.KernelProfile"
        assert round(profile.kernel_sum_s, 9) == 0.003 and profile.kernels[0].gflops == 884736.0 / 0.003 / 1e9


def test_a_write_run_again_after_its_commit_landed_stores_nothing_twice(db_location):
    """#61: a write whose commit's acknowledgement was lost is run again by ``backends.retried`` (a reconnect): with
    the token it made once, the retry finds what the first try stored. farm bench stored a second run, and a
    retried start_sweep left an orphan sweep "running". Here the retry is played by the write's own inner call with
    the same token, as ``retried`` makes it; two writes with their own tokens remain two."""
    from farm.records import CopyCurve, CopyPoint, RunToStore

    mlp = load_model("mlp")
    run = RunToStore(_result(), DEVICE, mlp, None, 1)
    reference = RunToStore(dataclasses.replace(_result(), runtime="onnxruntime"), DEVICE, mlp, None, 1)
    curve = CopyCurve("cpu", "cpu", "cuda", "2026-11-28T00:00:00+00:00", (CopyPoint("d2h", 4096, 10, (1e-6, 2e-6)),))
    with Store(db_location) as store:
        first = store._record_cell(run, None, reference, None, None, "token-1")
        stored = [store.count(table) for table in ("runs", "samples", "checks")]
        assert store._record_cell(run, None, reference, None, None, "token-1") == first  # the retry
        assert [store.count(table) for table in ("runs", "samples", "checks")] == stored and stored[0] == 2
        sweep = store._start_sweep({"devices": ["cpu"]}, "token-2")
        assert store._start_sweep({"devices": ["cpu"]}, "token-2") == sweep
        assert store.count("sweeps") == 1
        key = "write/token-3/cpu"
        assert store._record_copy_curve(curve, None, None, key) == store._record_copy_curve(curve, None, None, key)
        assert store.count("copy_curves") == 1
        assert store.record_cell(run)[0] != store.record_cell(run)[0]  # two farm bench runs: two rows
        assert store.start_sweep({}) != store.start_sweep({})


def test_an_offline_cell_is_stored_only_by_its_device_s_lease_holder(db_location):
    """#61: a lab cell's "offline" row was stored without its lease: a worker that lost the device to another
    holder still wrote it. Now it is refused like any result measured under a lost lease."""
    import time

    from farm.errors import LeaseLost
    from farm.sweep.run import store_offline

    mlp = load_model("mlp")
    with Store(db_location) as store:
        sweep = store.start_sweep({"devices": ["cpu"], "models": ["mlp"]})
        lapsed = store.take_lease("cpu", "worker-a", 0.5)
        time.sleep(1.0)
        taken = store.take_lease("cpu", "worker-b", 30.0)
        assert lapsed is not None and taken is not None
        with pytest.raises(LeaseLost):
            store_offline(store, DEVICE, mlp, BenchConfig(), sweep, "no server", "bring it up", lapsed)
        assert store.count("runs") == 0
        store_offline(store, DEVICE, mlp, BenchConfig(), sweep, "no server", "bring it up", taken)
        assert store.sweep_attempts(sweep) == {("cpu", "mlp"): [StoredAttempt(0, "failed", "offline")]}


def test_a_lease_s_epoch_handed_out_again_does_not_fence_in_its_old_holder(db_location):
    """#61: after a failover that lost an epoch's bump, the next holder got the same epoch number, and the fence,
    which compared the epoch alone, let the old holder store and renew. Played here by writing the row as such a
    failover leaves it: the same epoch, another holder."""
    from farm.errors import LeaseLost
    from farm.records import RunToStore

    mlp = load_model("mlp")
    with Store(db_location) as store:
        sweep = store.start_sweep({"devices": ["cpu"], "models": ["mlp"]})
        old = store.take_lease("cpu", "worker-a", 30.0)
        assert old is not None
        with store._db.transaction() as db:
            db.execute("UPDATE device_leases SET holder = 'worker-b' WHERE device = 'cpu'")
        assert not store.renew_lease(old, 30.0)
        with pytest.raises(LeaseLost):
            store.record_cell(RunToStore(_result(), DEVICE, mlp, None), sweep_id=sweep, lease=old)
        store.release_lease(old)
        assert store.lease_holder("cpu")[:2] == ("worker-b", 1)  # the old holder's release frees nothing
        assert store.count("runs") == 0


@pytest.mark.parametrize("url, shown, secrets", [
    ("postgresql://farm:s3cret@db:5432/lab", "postgresql://farm:***@db:5432/lab", ["s3cret"]),
    ("postgresql://farm@db/lab?password=s3cret&sslmode=require", "postgresql://farm@db/lab?password=***&sslmode=require",
     ["s3cret"]),
    ("postgresql://farm@db/lab?sslmode=require&sslpassword=k3y", "postgresql://farm@db/lab?sslmode=require&sslpassword=***",
     ["k3y"]),
    ("postgresql://farm@db/lab", "postgresql://farm@db/lab", []),
    ("/home/me/results.db", "/home/me/results.db", []),
])
def test_a_database_location_is_shown_without_its_passwords(url, shown, secrets):
    """#62: redact missed ?password=; what the CLI keeps out of its output is each password as written."""
    from farm.store.locations import redact, url_secrets

    assert (redact(url), url_secrets(url)) == (shown, secrets)
