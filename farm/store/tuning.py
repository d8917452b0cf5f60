"""Tuning: MetaSchedule sessions and their records, kept in the store so that any host can tune and
compile with them.

MetaSchedule's JSON database is two files: workload lines, and record lines ``[workload_index, body]``.
The store keys workloads by the sha of their line and records by the sha of ``[workload_sha, body]``, so
files from anywhere merge cleanly.
"""

from __future__ import annotations

import base64
import hashlib
import json

from farm.records import Device, ModelSource, SavedCostModel
from farm.store.backends import Backend, now, retried


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


NOTHING: dict = {}  # a key's night that tuned nothing (no model measured ok): stored, so a job run again knows it


class TuningMixin:
    """The ``Store``'s tuning sessions and tuning records."""

    _db: Backend

    @retried
    def start_tune_session(self, device: Device, model: ModelSource, tuning_key: str, target: dict,
                           tvm_version: str, trials: int) -> int:
        with self._db.transaction() as db:
            return db.insert_id(
                """INSERT INTO tune_sessions (started_at, device, key, model, model_digest, tuning_key, target,
                   tvm_version, trials_requested, status) VALUES (?,?,?,?,?,?,?,?,?,'running')""",
                (now(), device.name, device.key, model.name, model.digest, tuning_key, json.dumps(target),
                 tvm_version, trials))

    @retried
    def finish_tune_session(self, session_id: int, status: str, reason: str, trials_done: int) -> None:
        with self._db.transaction() as db:
            db.execute("UPDATE tune_sessions SET finished_at=?, status=?, reason=?, trials_done=? WHERE id=?",
                       (now(), status, reason, trials_done, session_id))

    @retried
    def add_tuning_lines(self, tuning_key: str, workloads: list[str], records: list[tuple[int, str, float | None]],
                         session_id: int | None = None) -> int:
        """Merge database lines; ``records`` are (workload index, body json, best run seconds). Returns new records."""
        stamp = now()
        workload_shas = [_sha(line) for line in workloads]
        added = 0
        with self._db.transaction() as db:
            db.executemany("INSERT INTO tune_workloads (tuning_key, sha, line, added_at) VALUES (?,?,?,?) "
                           "ON CONFLICT DO NOTHING",
                           [(tuning_key, s, line, stamp) for s, line in zip(workload_shas, workloads)])
            for index, body, run_s in records:
                wsha = workload_shas[index]
                cursor = db.execute("INSERT INTO tune_records (tuning_key, sha, workload_sha, body, run_s, "
                                    "session_id, added_at) VALUES (?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                                    (tuning_key, _sha(wsha + body), wsha, body, run_s, session_id, stamp))
                added += cursor.rowcount
        return added

    @retried
    def save_cost_model(self, tuning_key: str, body: bytes, format: str, samples: int, session_id: int | None) -> None:
        """Keep the tuning key's cost model (``tune.costmodel.dump_cost_model``'s bytes), replacing the previous one."""
        with self._db.transaction() as db:
            db.execute("INSERT INTO tune_cost_models (tuning_key, body, format, samples, session_id, updated_at) "
                       "VALUES (?,?,?,?,?,?) ON CONFLICT (tuning_key) DO UPDATE SET body=excluded.body, "
                       "format=excluded.format, samples=excluded.samples, session_id=excluded.session_id, "
                       "updated_at=excluded.updated_at",
                       (tuning_key, base64.b64encode(body).decode("ascii"), format, samples, session_id, now()))

    def cost_model(self, tuning_key: str) -> SavedCostModel | None:
        """The tuning key's saved cost model, or None."""
        row = self._db.execute("SELECT body, format, samples FROM tune_cost_models WHERE tuning_key=?",
                               (tuning_key,)).fetchone()
        return None if row is None else SavedCostModel(base64.b64decode(row["body"]), row["format"], int(row["samples"]))

    def tuning_sessions(self, tuning_key: str, without_session: int | None = None) -> list[int | None]:
        """The session that added each of ``tuning_lines``' record lines, in their order (None: added without one)."""
        return [row[0] for row in self._db.execute(
            "SELECT session_id FROM tune_records WHERE tuning_key=? AND (session_id IS NULL OR session_id "
            "NOT IN (SELECT id FROM tune_sessions WHERE status='rejected' OR id=?)) ORDER BY rowid",
            (tuning_key, -1 if without_session is None else without_session)).fetchall()]

    def tuning_lines(self, tuning_key: str, without_session: int | None = None) -> tuple[list[str], list[str]]:
        """The JSON database files' lines for ``tuning_key``: (workload lines, record lines). Records a rejected
        session added (``judge_tune_session``) are left out: they made a model slower; so are ``without_session``'s
        (the set as it was before that session)."""
        workloads = self._db.execute(
            "SELECT sha, line FROM tune_workloads WHERE tuning_key=? ORDER BY rowid", (tuning_key,)).fetchall()
        index = {row["sha"]: i for i, row in enumerate(workloads)}
        records = self._db.execute(
            "SELECT workload_sha, body FROM tune_records WHERE tuning_key=? AND (session_id IS NULL OR session_id "
            "NOT IN (SELECT id FROM tune_sessions WHERE status='rejected' OR id=?)) ORDER BY rowid",
            (tuning_key, -1 if without_session is None else without_session)).fetchall()
        return [row["line"] for row in workloads], [f"[{index[r['workload_sha']]}, {r['body']}]" for r in records]

    @retried
    def judge_tune_session(self, session_id: int, kept: bool, reason: str) -> None:
        """The verdict on a session's records after the model was measured with them: kept, or ``rejected`` (its
        records then compile into nothing; they stay stored, for the record)."""
        with self._db.transaction() as db:
            if kept:
                db.execute("UPDATE tune_sessions SET reason=? WHERE id=?", (reason, session_id))
            else:
                db.execute("UPDATE tune_sessions SET status='rejected', reason=? WHERE id=?", (reason, session_id))

    def tune_session(self, session_id: int) -> dict | None:
        rows = self._db.dicts("SELECT * FROM tune_sessions WHERE id=?", (session_id,))
        return rows[0] if rows else None

    @retried
    def save_night_tuning(self, sweep_id: int, device: str, tunings: list[dict]) -> None:
        """What a sweep's nightly tuning did for the key ``device`` tuned (``night.tuning.NightTuning`` as dicts, in
        order), in place of what was stored for it before."""
        stamp = now()
        with self._db.transaction() as db:
            db.execute("DELETE FROM night_tunings WHERE sweep_id=? AND device=?", (sweep_id, device))
            db.executemany("INSERT INTO night_tunings (sweep_id, device, position, body, stored_at) VALUES (?,?,?,?,?)",
                           [(sweep_id, device, i, json.dumps(t), stamp) for i, t in enumerate(tunings or [NOTHING])])

    def night_tuned(self, sweep_id: int) -> set[str]:
        """The devices whose nightly tuning for the sweep is stored (an empty night counts: nothing to tune)."""
        return {row[0] for row in self._db.tuples("SELECT device FROM night_tunings WHERE sweep_id=?", (sweep_id,))}

    def night_tunings(self, sweep_id: int) -> list[dict]:
        """The sweep's nightly tuning (``save_night_tuning``), by device, in order."""
        bodies = [json.loads(row[0]) for row in self._db.tuples(
            "SELECT body FROM night_tunings WHERE sweep_id=? ORDER BY device, position", (sweep_id,))]
        return [body for body in bodies if body != NOTHING]

    def ever_had_records(self, tuning_key: str) -> bool:
        """Whether any record was ever stored for the key, rejected ones included."""
        return self._db.execute("SELECT 1 FROM tune_records WHERE tuning_key=? LIMIT 1", (tuning_key,)).fetchone() \
            is not None

    def other_tunings(self, target: dict, tvm_version: str) -> list[tuple[str, str]]:
        """(tuning key, TVM version) of the same target under other TVM versions whose keys hold records, newest
        session first: what a TVM upgrade can replay instead of starting from nothing (the caller picks a version)."""
        rows = self._db.execute(
            "SELECT s.tuning_key, s.tvm_version, MAX(s.id) AS newest FROM tune_sessions s WHERE s.target=? AND "
            "s.tvm_version<>? AND EXISTS (SELECT 1 FROM tune_records r WHERE r.tuning_key=s.tuning_key) "
            "GROUP BY s.tuning_key, s.tvm_version ORDER BY newest DESC", (json.dumps(target), tvm_version)).fetchall()
        return [(row["tuning_key"], row["tvm_version"]) for row in rows]

    def copy_tuning(self, from_key: str, to_key: str, session_id: int) -> int:
        """Replay ``from_key``'s records (rejected ones left out) into ``to_key`` as ``session_id``'s; returns how many."""
        workloads, records = self.tuning_lines(from_key)
        parsed = [json.loads(line) for line in records]
        return self.add_tuning_lines(to_key, workloads, [(index, json.dumps(body), None) for index, body in parsed],
                                     session_id)
