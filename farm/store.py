"""The results database. The only module that writes it.

SQLite in WAL mode, one transaction per recorded result, raw samples in long format.
Summaries are computed from the samples (``results.py``), never stored.

SCHEMA_VERSION history:
  1  devices, models, artifacts, runs, samples (steady + copy), copies, checks
  2  tuning: tune_sessions, tune_workloads, tune_records; artifacts.tuning_digest/tuned_tasks/total_tasks;
     runs.tuned
  3  sweeps; runs.sweep_id, runs.attempt
  4  alerts (regression verdicts with method, baseline and confirmation, reproducible)
  5  probes (device health checks)
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from farm.errors import StoreError
from farm.records import Artifact, BenchResult, Device, ModelSource

SCHEMA_VERSION = 5

MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE devices (
        name TEXT PRIMARY KEY, key TEXT NOT NULL, kind TEXT NOT NULL, target TEXT NOT NULL,
        emulated INTEGER NOT NULL, tags TEXT NOT NULL, context TEXT NOT NULL,
        first_seen TEXT NOT NULL, last_seen TEXT NOT NULL);
    CREATE TABLE models (
        digest TEXT PRIMARY KEY, name TEXT NOT NULL, origin TEXT NOT NULL, inputs TEXT NOT NULL,
        first_seen TEXT NOT NULL);
    CREATE TABLE artifacts (
        cache_key TEXT PRIMARY KEY, model_digest TEXT NOT NULL, target TEXT NOT NULL, export TEXT NOT NULL,
        toolchain TEXT NOT NULL, tvm_version TEXT NOT NULL, file_digest TEXT NOT NULL, path TEXT NOT NULL,
        build_s REAL NOT NULL, created_at TEXT NOT NULL);
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT, started_at TEXT NOT NULL, device TEXT NOT NULL, key TEXT NOT NULL,
        model TEXT NOT NULL, model_digest TEXT NOT NULL, artifact_key TEXT NOT NULL, status TEXT NOT NULL,
        failed_step TEXT NOT NULL, reason TEXT NOT NULL, upload_s REAL, load_s REAL, first_run_s REAL,
        steady_number INTEGER, steady_repeat INTEGER NOT NULL, min_repeat_ms REAL NOT NULL,
        emulated INTEGER NOT NULL, farm_version TEXT NOT NULL, tvm_version TEXT NOT NULL,
        context TEXT NOT NULL, config TEXT NOT NULL);
    CREATE INDEX runs_device_model ON runs (device, model, started_at);
    CREATE TABLE samples (
        run_id INTEGER NOT NULL REFERENCES runs(id), metric TEXT NOT NULL, series INTEGER NOT NULL,
        idx INTEGER NOT NULL, value_s REAL NOT NULL, number INTEGER NOT NULL,
        PRIMARY KEY (run_id, metric, series, idx));
    CREATE TABLE copies (
        run_id INTEGER NOT NULL REFERENCES runs(id), output_index INTEGER NOT NULL, nbytes INTEGER NOT NULL,
        shape TEXT NOT NULL, dtype TEXT NOT NULL, number INTEGER NOT NULL,
        PRIMARY KEY (run_id, output_index));
    CREATE TABLE checks (
        run_id INTEGER PRIMARY KEY REFERENCES runs(id), status TEXT NOT NULL, max_abs_err REAL,
        rtol REAL, atol REAL, reference TEXT NOT NULL, detail TEXT NOT NULL);
    """,
    2: """
    ALTER TABLE artifacts ADD COLUMN tuning_digest TEXT NOT NULL DEFAULT '';
    ALTER TABLE artifacts ADD COLUMN tuned_tasks INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE artifacts ADD COLUMN total_tasks INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runs ADD COLUMN tuned INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE tune_sessions (
        id INTEGER PRIMARY KEY AUTOINCREMENT, started_at TEXT NOT NULL, finished_at TEXT, device TEXT NOT NULL,
        key TEXT NOT NULL, model TEXT NOT NULL, model_digest TEXT NOT NULL, tuning_key TEXT NOT NULL,
        target TEXT NOT NULL, tvm_version TEXT NOT NULL, trials_requested INTEGER NOT NULL,
        trials_done INTEGER NOT NULL DEFAULT 0, status TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '');
    CREATE TABLE tune_workloads (
        tuning_key TEXT NOT NULL, sha TEXT NOT NULL, line TEXT NOT NULL, added_at TEXT NOT NULL,
        PRIMARY KEY (tuning_key, sha));
    CREATE TABLE tune_records (
        tuning_key TEXT NOT NULL, sha TEXT NOT NULL, workload_sha TEXT NOT NULL, body TEXT NOT NULL,
        run_s REAL, session_id INTEGER, added_at TEXT NOT NULL,
        PRIMARY KEY (tuning_key, sha));
    """,
    3: """
    CREATE TABLE sweeps (
        id INTEGER PRIMARY KEY AUTOINCREMENT, started_at TEXT NOT NULL, finished_at TEXT, status TEXT NOT NULL,
        spec TEXT NOT NULL);
    ALTER TABLE runs ADD COLUMN sweep_id INTEGER REFERENCES sweeps(id);
    ALTER TABLE runs ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
    CREATE INDEX runs_sweep ON runs (sweep_id, device, model);
    """,
    4: """
    CREATE TABLE alerts (
        id INTEGER PRIMARY KEY AUTOINCREMENT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
        sweep_id INTEGER NOT NULL, device TEXT NOT NULL, model TEXT NOT NULL, tuned INTEGER NOT NULL,
        metric TEXT NOT NULL, run_id INTEGER NOT NULL, baseline_run_id INTEGER, status TEXT NOT NULL,
        value REAL NOT NULL, z REAL, change REAL, baseline TEXT NOT NULL, method TEXT NOT NULL,
        confirmation TEXT NOT NULL DEFAULT '{}',
        UNIQUE (sweep_id, device, model, tuned, metric));
    """,
    5: """
    CREATE TABLE probes (
        id INTEGER PRIMARY KEY AUTOINCREMENT, device TEXT NOT NULL, key TEXT NOT NULL, at REAL NOT NULL,
        state TEXT NOT NULL, reason TEXT NOT NULL, latency_s REAL);
    CREATE INDEX probes_device ON probes (device, at);
    """,
}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Store:
    """An open results database. Use as a context manager or call ``close``."""

    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = Path(path)
        try:
            if readonly:  # readers (dashboard) never create, migrate or lock for writing
                self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=30,
                                           isolation_level=None, check_same_thread=False)
                self._db.row_factory = sqlite3.Row
                if self._version() > SCHEMA_VERSION:
                    raise StoreError(f"{self.path} has a newer schema than this farm", "upgrade farm")
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open results database {self.path}: {exc}",
                             "pass another --db PATH, or move the damaged file aside") from None
        except OSError as exc:
            raise StoreError(f"cannot create results database {self.path}: {exc.strerror}", "pass a writable --db PATH") from None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _version(self) -> int:
        exists = self._db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
        if not exists:
            return 0
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _migrate(self) -> None:
        version = self._version()
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema {version}, newer than this farm ({SCHEMA_VERSION})",
                             "upgrade farm, or use another --db")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            with self._transaction() as db:
                for statement in MIGRATIONS[target].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(target),))

    # -- writes -------------------------------------------------------------------------

    def record_result(self, result: BenchResult, device: Device, model: ModelSource, artifact: Artifact | None,
                      sweep_id: int | None = None, attempt: int = 1) -> int:
        """Store one bench result with its samples, copies and check, atomically. Returns the run id."""
        now = _now()
        try:
            with self._transaction() as db:
                db.execute(
                    """INSERT INTO devices VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET
                       key=excluded.key, kind=excluded.kind, target=excluded.target, emulated=excluded.emulated,
                       tags=excluded.tags, context=excluded.context, last_seen=excluded.last_seen""",
                    (device.name, device.key, device.kind, json.dumps(device.target), int(device.emulated),
                     json.dumps(list(device.tags)), json.dumps(result.context.get("host", {})), now, now))
                db.execute("INSERT OR IGNORE INTO models VALUES (?,?,?,?,?)",
                           (model.digest, model.name, model.origin,
                            json.dumps([asdict(s) for s in model.inputs]), now))
                if artifact is not None:
                    db.execute(
                        """INSERT OR IGNORE INTO artifacts (cache_key, model_digest, target, export, toolchain,
                           tvm_version, file_digest, path, build_s, created_at, tuning_digest, tuned_tasks, total_tasks)
                           VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                        (artifact.cache_key, artifact.model_digest, json.dumps(artifact.target), artifact.export,
                         artifact.toolchain, artifact.tvm_version, artifact.file_digest, artifact.path,
                         artifact.build_s, now, artifact.tuning_digest, artifact.tuned_tasks, artifact.total_tasks))
                config = result.config
                cursor = db.execute(
                    """INSERT INTO runs (started_at, device, key, model, model_digest, artifact_key, status,
                       failed_step, reason, upload_s, load_s, first_run_s, steady_number, steady_repeat,
                       min_repeat_ms, emulated, farm_version, tvm_version, context, config, tuned, sweep_id, attempt)
                       VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                    (result.started_at or now, result.device, result.key, result.model, result.model_digest,
                     result.artifact_key, result.status, result.failed_step, result.reason, result.upload_s,
                     result.load_s, result.first_run_s, result.steady_number, config.repeat, config.min_repeat_ms,
                     int(device.emulated), result.context.get("farm_version", ""),
                     result.context.get("tvm_version", ""), json.dumps(result.context), json.dumps(asdict(config)),
                     int(bool(artifact and artifact.tuned_tasks)), sweep_id, attempt))
                run_id = int(cursor.lastrowid)
                db.executemany("INSERT INTO samples VALUES (?,?,?,?,?,?)",
                               [(run_id, "steady", 0, i, v, result.steady_number or 0)
                                for i, v in enumerate(result.steady_samples_s)])
                for copy in result.copies:
                    db.execute("INSERT INTO copies VALUES (?,?,?,?,?,?)",
                               (run_id, copy.output_index, copy.nbytes, json.dumps(list(copy.shape)), copy.dtype, copy.number))
                    db.executemany("INSERT INTO samples VALUES (?,?,?,?,?,?)",
                                   [(run_id, "copy", copy.output_index, i, v, copy.number)
                                    for i, v in enumerate(copy.samples_s)])
                check = result.check
                db.execute("INSERT INTO checks VALUES (?,?,?,?,?,?,?)",
                           (run_id, check.status, check.max_abs_err, check.rtol, check.atol, check.reference, check.detail))
        except sqlite3.Error as exc:
            raise StoreError(f"could not write the result to {self.path}: {exc}", "check disk space and permissions") from None
        return run_id

    # -- tuning records -----------------------------------------------------------------
    # MetaSchedule's JSON database is two files: workload lines, and record lines
    # ``[workload_index, body]``. The store keys workloads by the sha of their line and
    # records by the sha of ``[workload_sha, body]``, so files from anywhere merge cleanly.

    def start_tune_session(self, device: Device, model: ModelSource, tuning_key: str, target: dict,
                           tvm_version: str, trials: int) -> int:
        with self._transaction() as db:
            cursor = db.execute(
                """INSERT INTO tune_sessions (started_at, device, key, model, model_digest, tuning_key, target,
                   tvm_version, trials_requested, status) VALUES (?,?,?,?,?,?,?,?,?,'running')""",
                (_now(), device.name, device.key, model.name, model.digest, tuning_key, json.dumps(target),
                 tvm_version, trials))
            return int(cursor.lastrowid)

    def finish_tune_session(self, session_id: int, status: str, reason: str, trials_done: int) -> None:
        with self._transaction() as db:
            db.execute("UPDATE tune_sessions SET finished_at=?, status=?, reason=?, trials_done=? WHERE id=?",
                       (_now(), status, reason, trials_done, session_id))

    def add_tuning_lines(self, tuning_key: str, workloads: list[str], records: list[tuple[int, str, float | None]],
                         session_id: int | None = None) -> int:
        """Merge database lines; ``records`` are (workload index, body json, best run seconds). Returns new records."""
        import hashlib

        def sha(text: str) -> str:
            return hashlib.sha256(text.encode()).hexdigest()

        now = _now()
        workload_shas = [sha(line) for line in workloads]
        added = 0
        try:
            with self._transaction() as db:
                db.executemany("INSERT OR IGNORE INTO tune_workloads VALUES (?,?,?,?)",
                               [(tuning_key, s, line, now) for s, line in zip(workload_shas, workloads)])
                for index, body, run_s in records:
                    wsha = workload_shas[index]
                    cursor = db.execute("INSERT OR IGNORE INTO tune_records VALUES (?,?,?,?,?,?,?)",
                                        (tuning_key, sha(wsha + body), wsha, body, run_s, session_id, now))
                    added += cursor.rowcount
        except sqlite3.Error as exc:
            raise StoreError(f"could not store tuning records in {self.path}: {exc}", "check disk space") from None
        return added

    def tuning_lines(self, tuning_key: str) -> tuple[list[str], list[str]]:
        """The JSON database files' lines for ``tuning_key``: (workload lines, record lines)."""
        workloads = self._db.execute(
            "SELECT sha, line FROM tune_workloads WHERE tuning_key=? ORDER BY rowid", (tuning_key,)).fetchall()
        index = {row["sha"]: i for i, row in enumerate(workloads)}
        records = self._db.execute(
            "SELECT workload_sha, body FROM tune_records WHERE tuning_key=? ORDER BY rowid", (tuning_key,)).fetchall()
        return [row["line"] for row in workloads], [f"[{index[r['workload_sha']]}, {r['body']}]" for r in records]

    def start_sweep(self, spec: dict[str, Any]) -> int:
        with self._transaction() as db:
            return int(db.execute("INSERT INTO sweeps (started_at, status, spec) VALUES (?, 'running', ?)",
                                  (_now(), json.dumps(spec))).lastrowid)

    def finish_sweep(self, sweep_id: int, status: str) -> None:
        with self._transaction() as db:
            db.execute("UPDATE sweeps SET finished_at=?, status=? WHERE id=?", (_now(), status, sweep_id))

    def sweep(self, sweep_id: int | None = None) -> dict[str, Any] | None:
        """One sweep (the latest when ``sweep_id`` is None), with its spec parsed."""
        if sweep_id is None:
            row = self._db.execute("SELECT * FROM sweeps ORDER BY id DESC LIMIT 1").fetchone()
        else:
            row = self._db.execute("SELECT * FROM sweeps WHERE id=?", (sweep_id,)).fetchone()
        return None if row is None else {**dict(row), "spec": json.loads(row["spec"])}

    def sweep_attempts(self, sweep_id: int) -> dict[tuple[str, str], list[tuple[int, str]]]:
        """(device, model) -> [(attempt, status), ...] of a sweep's stored runs."""
        cells: dict[tuple[str, str], list[tuple[int, str]]] = {}
        for row in self._db.execute("SELECT device, model, attempt, status FROM runs WHERE sweep_id=? ORDER BY id",
                                    (sweep_id,)):
            cells.setdefault((row["device"], row["model"]), []).append((row["attempt"], row["status"]))
        return cells

    def save_alert(self, verdict: dict[str, Any], method: dict[str, Any], status: str | None = None,
                   confirmation: dict[str, Any] | None = None) -> int:
        """Insert or update the alert of one series in one sweep; returns its id.

        Detecting again without confirming keeps an earlier confirmation and its status."""
        now = _now()
        with self._transaction() as db:
            db.execute(
                """INSERT INTO alerts (created_at, updated_at, sweep_id, device, model, tuned, metric, run_id,
                   baseline_run_id, status, value, z, change, baseline, method, confirmation)
                   VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
                   ON CONFLICT (sweep_id, device, model, tuned, metric) DO UPDATE SET updated_at=excluded.updated_at,
                   status=CASE WHEN excluded.confirmation = '{}' THEN alerts.status ELSE excluded.status END,
                   confirmation=CASE WHEN excluded.confirmation = '{}' THEN alerts.confirmation
                                     ELSE excluded.confirmation END""",
                (now, now, verdict["sweep_id"], verdict["device"], verdict["model"], int(verdict["tuned"]),
                 verdict["metric"], verdict["run_id"], verdict["baseline_run_id"], status or verdict["status"],
                 verdict["value"], verdict["z"], verdict["change"], json.dumps(verdict["baseline"]),
                 json.dumps(method), json.dumps(confirmation or {})))
            row = db.execute("SELECT id FROM alerts WHERE sweep_id=? AND device=? AND model=? AND tuned=? AND metric=?",
                             (verdict["sweep_id"], verdict["device"], verdict["model"], int(verdict["tuned"]),
                              verdict["metric"])).fetchone()
        return int(row[0])

    def record_probes(self, probes: list[Any]) -> None:
        with self._transaction() as db:
            db.executemany("INSERT INTO probes (device, key, at, state, reason, latency_s) VALUES (?,?,?,?,?,?)",
                           [(p.device, p.key, p.at, p.state, p.reason, p.latency_s) for p in probes])

    def last_online(self) -> dict[str, float]:
        """device -> time.time() of its last probe that found it online."""
        return {row[0]: row[1] for row in self._db.execute(
            "SELECT device, MAX(at) FROM probes WHERE state='online' GROUP BY device")}

    def alerts(self, sweep_id: int | None = None) -> list[dict[str, Any]]:
        sql, params = "SELECT * FROM alerts", []
        if sweep_id is not None:
            sql, params = sql + " WHERE sweep_id=?", [sweep_id]
        rows = self._db.execute(sql + " ORDER BY id", params).fetchall()
        return [{**dict(r), "baseline": json.loads(r["baseline"]), "method": json.loads(r["method"]),
                 "confirmation": json.loads(r["confirmation"])} for r in rows]

    def model_inputs(self, digest: str) -> list[dict[str, Any]] | None:
        """The stored input signature of a model (name, shape, dtype per input)."""
        row = self._db.execute("SELECT inputs FROM models WHERE digest=?", (digest,)).fetchone()
        return None if row is None else json.loads(row[0])

    def artifact(self, cache_key: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT * FROM artifacts WHERE cache_key=?", (cache_key,)).fetchone()
        return None if row is None else {**dict(row), "target": json.loads(row["target"])}

    def recent_runs(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest runs with the median of their steady samples."""
        rows = [dict(r) for r in self._db.execute(
            """SELECT id, started_at, device, model, status, failed_step, reason, sweep_id, context
               FROM runs ORDER BY id DESC LIMIT ?""", (limit,))]
        for row in rows:
            values = sorted(self.samples(row["id"]))
            row["steady_median_s"] = values[len(values) // 2] if values else None
        return rows

    def latest_probes(self) -> dict[str, dict[str, Any]]:
        rows = self._db.execute("""SELECT p.* FROM probes p JOIN (SELECT device, MAX(at) AS at FROM probes GROUP BY device) l
                                   ON p.device = l.device AND p.at = l.at""").fetchall()
        return {r["device"]: dict(r) for r in rows}

    def tune_sessions(self, device: str | None = None) -> list[dict[str, Any]]:
        sql, params = "SELECT * FROM tune_sessions", []
        if device:
            sql, params = sql + " WHERE device=?", [device]
        return [dict(row) for row in self._db.execute(sql + " ORDER BY id DESC", params)]

    # -- reads --------------------------------------------------------------------------

    def runs(self, device: str | None = None, model: str | None = None, latest_only: bool = False,
             sweep_id: int | None = None) -> list[dict[str, Any]]:
        """Runs joined with their check, newest first."""
        where, params = [], []
        if sweep_id is not None:
            where.append("r.sweep_id = ?")
            params.append(sweep_id)
        if device:
            where.append("r.device = ?")
            params.append(device)
        if model:
            where.append("r.model = ?")
            params.append(model)
        if latest_only:
            where.append("r.id = (SELECT MAX(id) FROM runs r2 WHERE r2.device = r.device AND r2.model = r.model"
                         " AND r2.tuned = r.tuned)")
        sql = """SELECT r.*, c.status AS check_status, c.max_abs_err, c.rtol, c.atol, c.reference, c.detail AS check_detail,
                        a.tuned_tasks, a.total_tasks
                 FROM runs r LEFT JOIN checks c ON c.run_id = r.id LEFT JOIN artifacts a ON a.cache_key = r.artifact_key"""
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY r.id DESC"
        return [dict(row) for row in self._db.execute(sql, params)]

    def samples(self, run_id: int, metric: str = "steady", series: int = 0) -> list[float]:
        rows = self._db.execute(
            "SELECT value_s FROM samples WHERE run_id=? AND metric=? AND series=? ORDER BY idx", (run_id, metric, series))
        return [row[0] for row in rows]

    def copies(self, run_id: int) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT * FROM copies WHERE run_id=? ORDER BY output_index", (run_id,))
        return [dict(row) for row in rows]

    def all_samples(self) -> list[dict[str, Any]]:
        return [dict(row) for row in self._db.execute("SELECT * FROM samples ORDER BY run_id, metric, series, idx")]

    def count(self, table: str) -> int:
        if table not in ("runs", "samples", "copies", "checks", "devices", "models", "artifacts", "tune_records",
                         "tune_workloads", "tune_sessions", "sweeps", "alerts", "probes"):
            raise ValueError(table)
        return int(self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def open_store(path: str | Path) -> Store:
    return Store(path)
