"""The results database. The only module that writes it.

SQLite in WAL mode, one transaction per recorded result, raw samples in long format.
Summaries are computed from the samples (``results.py``), never stored.

SCHEMA_VERSION history:
  1  devices, models, artifacts, runs, samples (steady + copy), copies, checks
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

SCHEMA_VERSION = 1

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
}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Store:
    """An open results database. Use as a context manager or call ``close``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
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

    def record_result(self, result: BenchResult, device: Device, model: ModelSource, artifact: Artifact | None) -> int:
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
                    db.execute("INSERT OR IGNORE INTO artifacts VALUES (?,?,?,?,?,?,?,?,?,?)",
                               (artifact.cache_key, artifact.model_digest, json.dumps(artifact.target), artifact.export,
                                artifact.toolchain, artifact.tvm_version, artifact.file_digest, artifact.path,
                                artifact.build_s, now))
                config = result.config
                cursor = db.execute(
                    """INSERT INTO runs (started_at, device, key, model, model_digest, artifact_key, status,
                       failed_step, reason, upload_s, load_s, first_run_s, steady_number, steady_repeat,
                       min_repeat_ms, emulated, farm_version, tvm_version, context, config)
                       VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                    (result.started_at or now, result.device, result.key, result.model, result.model_digest,
                     result.artifact_key, result.status, result.failed_step, result.reason, result.upload_s,
                     result.load_s, result.first_run_s, result.steady_number, config.repeat, config.min_repeat_ms,
                     int(device.emulated), result.context.get("farm_version", ""),
                     result.context.get("tvm_version", ""), json.dumps(result.context), json.dumps(asdict(config))))
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

    # -- reads --------------------------------------------------------------------------

    def runs(self, device: str | None = None, model: str | None = None, latest_only: bool = False) -> list[dict[str, Any]]:
        """Runs joined with their check, newest first."""
        where, params = [], []
        if device:
            where.append("r.device = ?")
            params.append(device)
        if model:
            where.append("r.model = ?")
            params.append(model)
        if latest_only:
            where.append("r.id = (SELECT MAX(id) FROM runs r2 WHERE r2.device = r.device AND r2.model = r.model)")
        sql = """SELECT r.*, c.status AS check_status, c.max_abs_err, c.rtol, c.atol, c.reference, c.detail AS check_detail
                 FROM runs r LEFT JOIN checks c ON c.run_id = r.id"""
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
        if table not in ("runs", "samples", "copies", "checks", "devices", "models", "artifacts"):
            raise ValueError(table)
        return int(self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def open_store(path: str | Path) -> Store:
    return Store(path)
