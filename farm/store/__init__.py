"""The results database. The only package that writes it.

A SQLite file in WAL mode (default) or a PostgreSQL database (``--db postgresql://...``) for a
farm whose hosts share one database; the same SQL runs on both (``backends.py``). One
transaction per recorded result, raw samples in long format, and each sample series' summary
(``stats.summarize_rows``) written with it, so that reading 50,000 runs never reads their 1.5 M samples.
The summaries are derived data: the rule that wrote them is kept in meta and, when farm's rule
changes, they are recomputed from the samples on open. The schema and its history: ``schema.py``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from farm.errors import StoreError, first_line
from farm.records import Alert, Artifact, BenchResult, CopyCurve, Device, InputSpec, ModelSource
from farm.stats import SUMMARY_RULE, Summary, summarize_groups
from farm.store.backends import exists, open_backend
from farm.store.schema import MIGRATIONS, SCHEMA_VERSION, statements

__all__ = ["Store", "SCHEMA_VERSION", "exists"]

# the columns of ``summaries`` after its key: stats.Summary's fields, by name
SUMMARY_COLUMNS = ", ".join(f.name for f in fields(Summary))

def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Store:
    """An open results database. Use as a context manager or call ``close``."""

    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self._db = open_backend(path, readonly)
        self.kind = self._db.kind
        self.path = Path(path) if self.kind == "sqlite" else self._db.location  # shown in reports, never a password
        try:
            if readonly:
                version = self._version()
                if version > SCHEMA_VERSION:
                    raise StoreError(f"{self.path} has a newer schema than this farm", "upgrade farm")
                if version < SCHEMA_VERSION or self._summary_rule() != SUMMARY_RULE:
                    raise StoreError(f"{self.path} was written by an older farm (schema {version}) and is opened read-only",
                                     f"upgrade it once by opening it writable: farm results --db {self.path} --latest")
            else:
                self._migrate()
        except StoreError:
            self._db.close()
            raise
        except self._db.errors as exc:
            self._db.close()
            raise StoreError(f"cannot open results database {self.path}: {exc}",
                             "pass another --db PATH, or move the damaged file aside") from exc

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    def _transaction(self, migrating: bool = False):
        return self._db.transaction(migrating)

    def _version(self) -> int:
        if not self._db.table_exists("meta"):
            return 0
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _migrate(self) -> None:
        version = self._version()
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema {version}, newer than this farm ({SCHEMA_VERSION})",
                             "upgrade farm, or use another --db")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            with self._transaction(migrating=True) as db:
                if self._version() >= target:  # another farm migrated meanwhile
                    continue
                for statement in statements(MIGRATIONS[target]):
                    db.execute(self._db.ddl(statement))
                db.execute("INSERT INTO meta VALUES ('schema_version', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                           (str(target),))
        if self._summary_rule() != SUMMARY_RULE:
            with self._transaction(migrating=True) as db:
                if self._summary_rule() != SUMMARY_RULE:  # another farm did it meanwhile
                    self._summarize_stored(db)
                    db.execute("INSERT INTO meta VALUES ('summary_rule', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                               (SUMMARY_RULE,))

    def _summary_rule(self) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key='summary_rule'").fetchone()
        return row[0] if row else None

    def _summarize_stored(self, db, runs_per_chunk: int = 20_000) -> None:
        """(Re)compute every stored run's summaries from its samples, a chunk of runs at a time (memory stays
        flat whatever the database's size): schema 8's migration, and any change of ``stats.SUMMARY_RULE``."""
        db.execute("DELETE FROM summaries")
        key = "run_id, metric, series"
        last = -1
        while True:
            row = db.execute("SELECT MAX(id) FROM (SELECT id FROM runs WHERE id > ? ORDER BY id LIMIT ?) chunk",
                             (last, runs_per_chunk)).fetchone()
            if row is None or row[0] is None:
                return
            first, last = last, int(row[0])
            span = (first, last)
            groups = [tuple(g) for g in db.execute(f"SELECT {key}, COUNT(*) FROM samples WHERE run_id > ? AND run_id <= ?"
                                                   f" GROUP BY {key} ORDER BY {key}", span)]
            values = [v[0] for v in db.execute(f"SELECT value_s FROM samples WHERE run_id > ? AND run_id <= ?"
                                               f" ORDER BY {key}, idx", span)]
            self._insert_summaries(db, [g[:3] for g in groups], [g[3] for g in groups], values)

    @staticmethod
    def _insert_summaries(db, keys: list[tuple[int, str, int]], sizes: list[int], values: list[float]) -> None:
        rows = summarize_groups(sizes, values)
        db.executemany(f"INSERT INTO summaries (run_id, metric, series, {SUMMARY_COLUMNS})"
                       f" VALUES ({','.join('?' * (3 + len(fields(Summary))))})",
                       [(*k, *r[:-1], int(r[-1])) for k, r in zip(keys, rows)])

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
                db.execute("INSERT INTO models VALUES (?,?,?,?,?) ON CONFLICT DO NOTHING",
                           (model.digest, model.name, model.origin,
                            json.dumps([asdict(s) for s in model.inputs]), now))
                if artifact is not None:
                    db.execute(
                        """INSERT INTO artifacts (cache_key, model_digest, target, export, toolchain,
                           tvm_version, file_digest, path, build_s, created_at, tuning_digest, tuned_tasks, total_tasks)
                           VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING""",
                        (artifact.cache_key, artifact.model_digest, json.dumps(artifact.target), artifact.export,
                         artifact.toolchain, artifact.tvm_version, artifact.file_digest, artifact.path,
                         artifact.build_s, now, artifact.tuning_digest, artifact.tuned_tasks, artifact.total_tasks))
                config = result.config
                run_id = self._insert_id(
                    """INSERT INTO runs (started_at, device, key, model, model_digest, artifact_key, status,
                       failed_step, reason, upload_s, load_s, first_run_s, steady_number, steady_repeat,
                       min_repeat_ms, emulated, farm_version, tvm_version, context, config, tuned, sweep_id, attempt,
                       load_warm_s, first_run_warm_s, steady_clock, steady_wall_number, fallback_of)
                       VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                    (result.started_at or now, result.device, result.key, result.model, result.model_digest,
                     result.artifact_key, result.status, result.failed_step, result.reason, result.upload_s,
                     result.load_s, result.first_run_s, result.steady_number, config.repeat, config.min_repeat_ms,
                     int(device.emulated), result.context.get("farm_version", ""),
                     result.context.get("tvm_version", ""), json.dumps(result.context), json.dumps(asdict(config)),
                     int(bool(artifact and artifact.tuned_tasks)), sweep_id, attempt, result.load_warm_s,
                     result.first_run_warm_s, result.steady_clock, result.steady_wall_number, result.fallback_of))
                db.executemany("INSERT INTO samples VALUES (?,?,?,?,?,?)",
                               [(run_id, "steady", 0, i, v, result.steady_number or 0)
                                for i, v in enumerate(result.steady_samples_s)]
                               + [(run_id, "steady_wall", 0, i, v, result.steady_wall_number or 0)
                                  for i, v in enumerate(result.steady_wall_samples_s)])
                for copy in result.copies:
                    db.execute("INSERT INTO copies VALUES (?,?,?,?,?,?)",
                               (run_id, copy.output_index, copy.nbytes, json.dumps(list(copy.shape)), copy.dtype, copy.number))
                    db.executemany("INSERT INTO samples VALUES (?,?,?,?,?,?)",
                                   [(run_id, "copy", copy.output_index, i, v, copy.number)
                                    for i, v in enumerate(copy.samples_s)])
                series = [((run_id, "steady", 0), result.steady_samples_s),
                          ((run_id, "steady_wall", 0), result.steady_wall_samples_s),
                          *(((run_id, "copy", c.output_index), c.samples_s) for c in result.copies)]
                series = [(k, list(v)) for k, v in series if len(v)]
                self._insert_summaries(db, [k for k, _ in series], [len(v) for _, v in series],
                                       [x for _, v in series for x in v])
                check = result.check
                db.execute("INSERT INTO checks VALUES (?,?,?,?,?,?,?)",
                           (run_id, check.status, check.max_abs_err, check.rtol, check.atol, check.reference, check.detail))
        except self._db.errors as exc:
            raise StoreError(f"could not write the result to {self.path}: {exc}", "check disk space and permissions") from exc
        return run_id

    def record_copy_curve(self, curve: CopyCurve, sweep_id: int | None = None) -> int:
        """Store one copy curve with every raw sample, atomically. Returns its id."""
        try:
            with self._transaction() as db:
                curve_id = self._insert_id(
                    """INSERT INTO copy_curves (started_at, device, key, device_type, status, reason, sweep_id, context)
                       VALUES (?,?,?,?,?,?,?,?)""",
                    (curve.started_at, curve.device, curve.key, curve.device_type, curve.status, curve.reason,
                     sweep_id, json.dumps(curve.context)))
                db.executemany("INSERT INTO copy_curve_samples VALUES (?,?,?,?,?,?)",
                               [(curve_id, p.direction, p.nbytes, i, v, p.number)
                                for p in curve.points for i, v in enumerate(p.samples_s)])
        except self._db.errors as exc:
            raise StoreError(f"could not write the copy curve to {self.path}: {exc}", "check disk space and permissions") from exc
        return curve_id

    def copy_curves(self, device: str | None = None, latest_only: bool = False) -> list[dict[str, Any]]:
        """Copy curves, newest first, each with ``points``: {direction, nbytes, number, samples_s}."""
        sql, params = "SELECT * FROM copy_curves c", []
        if device:
            sql, params = sql + " WHERE c.device = ?", [device]
        if latest_only:
            sql += (" WHERE" if not device else " AND") + \
                " c.id = (SELECT MAX(id) FROM copy_curves c2 WHERE c2.device = c.device)"
        curves = [dict(row) for row in self._db.execute(sql + " ORDER BY c.id DESC", params)]
        for curve in curves:
            curve["context"] = json.loads(curve["context"])
            points: dict[tuple[str, int], dict[str, Any]] = {}
            for row in self._db.execute("SELECT * FROM copy_curve_samples WHERE curve_id=? ORDER BY direction, nbytes, idx",
                                        (curve["id"],)):
                point = points.setdefault((row["direction"], row["nbytes"]), {
                    "direction": row["direction"], "nbytes": row["nbytes"], "number": row["number"], "samples_s": []})
                point["samples_s"].append(row["value_s"])
            curve["points"] = list(points.values())
        return curves

    def _insert_id(self, sql: str, params: tuple) -> int:
        """Run an INSERT and return the new row's id."""
        return int(self._db.execute(sql + " RETURNING id", params).fetchall()[0][0])

    # -- tuning records -----------------------------------------------------------------
    # MetaSchedule's JSON database is two files: workload lines, and record lines
    # ``[workload_index, body]``. The store keys workloads by the sha of their line and
    # records by the sha of ``[workload_sha, body]``, so files from anywhere merge cleanly.

    def start_tune_session(self, device: Device, model: ModelSource, tuning_key: str, target: dict,
                           tvm_version: str, trials: int) -> int:
        with self._transaction():
            return self._insert_id(
                """INSERT INTO tune_sessions (started_at, device, key, model, model_digest, tuning_key, target,
                   tvm_version, trials_requested, status) VALUES (?,?,?,?,?,?,?,?,?,'running')""",
                (_now(), device.name, device.key, model.name, model.digest, tuning_key, json.dumps(target),
                 tvm_version, trials))

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
                db.executemany("INSERT INTO tune_workloads (tuning_key, sha, line, added_at) VALUES (?,?,?,?) "
                               "ON CONFLICT DO NOTHING",
                               [(tuning_key, s, line, now) for s, line in zip(workload_shas, workloads)])
                for index, body, run_s in records:
                    wsha = workload_shas[index]
                    cursor = db.execute("INSERT INTO tune_records (tuning_key, sha, workload_sha, body, run_s, "
                                        "session_id, added_at) VALUES (?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                                        (tuning_key, sha(wsha + body), wsha, body, run_s, session_id, now))
                    added += cursor.rowcount
        except self._db.errors as exc:
            raise StoreError(f"could not store tuning records in {self.path}: {exc}", "check disk space") from exc
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
        with self._transaction():
            return self._insert_id("INSERT INTO sweeps (started_at, status, spec) VALUES (?, 'running', ?)",
                                   (_now(), json.dumps(spec)))

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

    def save_alert(self, verdict: Mapping[str, Any], method: dict[str, Any], status: str | None = None,
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

    def alerts(self, sweep_id: int | None = None) -> list[Alert]:
        sql, params = "SELECT * FROM alerts", []
        if sweep_id is not None:
            sql, params = sql + " WHERE sweep_id=?", [sweep_id]
        return [Alert(**{**r, "tuned": bool(r["tuned"]), "baseline": json.loads(r["baseline"]),
                         "method": json.loads(r["method"]), "confirmation": json.loads(r["confirmation"])})
                for r in self._db.dicts(sql + " ORDER BY id", params)]

    def model_inputs(self, digest: str) -> list[dict[str, Any]] | None:
        """The stored input signature of a model (name, shape, dtype per input)."""
        row = self._db.execute("SELECT inputs FROM models WHERE digest=?", (digest,)).fetchone()
        return None if row is None else json.loads(row[0])

    def artifact(self, cache_key: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT * FROM artifacts WHERE cache_key=?", (cache_key,)).fetchone()
        return None if row is None else {**dict(row), "target": json.loads(row["target"])}

    def artifact_record(self, cache_key: str, model_name: str) -> Artifact | None:
        """The stored artifact as the record farm measures (every stored field; the pipeline version is part of
        its cache key, not a column)."""
        row = self.artifact(cache_key)
        if row is None:
            return None
        return Artifact(cache_key=row["cache_key"], path=row["path"], model_name=model_name,
                        model_digest=row["model_digest"], target=row["target"], export=row["export"],
                        toolchain=row["toolchain"], tvm_version=row["tvm_version"], file_digest=row["file_digest"],
                        build_s=row["build_s"], cached=True, tuning_digest=row["tuning_digest"] or "",
                        tuned_tasks=row["tuned_tasks"] or 0, total_tasks=row["total_tasks"] or 0)

    def model_signature(self, digest: str, name: str) -> ModelSource | None:
        """A stored model as a source without its bytes: its name, digest and input signature."""
        inputs = self.model_inputs(digest)
        if inputs is None:
            return None
        return ModelSource(name=name, origin="", digest=digest, data=b"",
                           inputs=tuple(InputSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in inputs))

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
             sweep_id: int | None = None, limit: int | None = None,
             status: str | None = None) -> list[dict[str, Any]]:
        """Runs joined with their check, newest first (the newest ``limit`` only, when given)."""
        where, params = self._run_filter(device, model, latest_only, sweep_id, limit, status)
        sql = f"""SELECT r.*, c.status AS check_status, c.max_abs_err, c.rtol, c.atol, c.reference, c.detail AS check_detail,
                        a.tuned_tasks, a.total_tasks
                 FROM runs r LEFT JOIN checks c ON c.run_id = r.id LEFT JOIN artifacts a ON a.cache_key = r.artifact_key
                 WHERE r.id IN ({where}) ORDER BY r.id DESC"""
        return self._db.dicts(sql, params)

    def run_summaries(self, device: str | None = None, model: str | None = None, latest_only: bool = False,
                      sweep_id: int | None = None, limit: int | None = None,
                      status: str | None = None) -> dict[tuple[int, str, int], Summary]:
        """(run id, metric, series) -> its stored summary, for the runs ``runs`` selects with the same arguments."""
        where, params = self._run_filter(device, model, latest_only, sweep_id, limit, status)
        rows = self._db.tuples(f"SELECT run_id, metric, series, {SUMMARY_COLUMNS} FROM summaries WHERE run_id IN ({where})",
                               params)
        return {(r[0], r[1], r[2]): Summary(*r[3:-1], bool(r[-1])) for r in rows}

    def run_copies(self, device: str | None = None, model: str | None = None, latest_only: bool = False,
                   sweep_id: int | None = None, limit: int | None = None,
             status: str | None = None) -> dict[int, list[dict[str, Any]]]:
        """run id -> its outputs' copies (index, bytes, shape, dtype, number), for the runs ``runs`` selects."""
        where, params = self._run_filter(device, model, latest_only, sweep_id, limit, status)
        copies: dict[int, list[dict[str, Any]]] = {}
        for row in self._db.execute(f"SELECT * FROM copies WHERE run_id IN ({where}) ORDER BY run_id, output_index",
                                    params):
            copies.setdefault(row["run_id"], []).append(dict(row))
        return copies

    @staticmethod
    def _run_filter(device: str | None, model: str | None, latest_only: bool, sweep_id: int | None,
                    limit: int | None, status: str | None = None) -> tuple[str, list[Any]]:
        """A subquery selecting run ids, and its parameters."""
        where, params = [], []
        if status is not None:
            where.append("r.status = ?")
            params.append(status)
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
        sql = "SELECT r.id FROM runs r" + (" WHERE " + " AND ".join(where) if where else "")
        if limit is not None:
            sql, params = sql + " ORDER BY r.id DESC LIMIT ?", [*params, int(limit)]
        return sql, params

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
        if table not in ("runs", "samples", "summaries", "copies", "checks", "devices", "models", "artifacts", "tune_records",
                         "tune_workloads", "tune_sessions", "sweeps", "alerts", "probes", "copy_curves",
                         "copy_curve_samples"):
            raise ValueError(table)
        return int(self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def _backend_hint(exc: BaseException) -> str:
    text = str(exc).lower()
    if "locked" in text or "busy" in text:
        return "another farm process is writing it: run the command again when it is done"
    if "no such table" in text or "no such column" in text or "does not exist" in text:
        return "the database is from another farm version or not farm's: pass another --db, or open it writable once"
    if "readonly" in text or "read-only" in text or "permission" in text:
        return "the database is read-only here: pass a writable --db PATH"
    if "disk" in text or "full" in text:
        return "check disk space"
    return "check the database (or move it aside) and pass --db PATH"


def _translated(method):
    @functools.wraps(method)
    def call(self: "Store", *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except self._db.errors as exc:
            raise StoreError(f"{self.path}: {method.__name__.replace('_', ' ')} failed: {first_line(exc)}",
                             _backend_hint(exc)) from exc
    return call


# every public method: a backend error (a locked or older file, a lost server) is a StoreError naming the
# database, never a raw sqlite3/psycopg traceback
for _name, _method in list(vars(Store).items()):
    if not _name.startswith("_") and callable(_method) and _name != "close":
        setattr(Store, _name, _translated(_method))


def open_store(path: str | Path) -> Store:
    return Store(path)
