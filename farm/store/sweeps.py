"""Sweeps and their alerts: a sweep's spec and status, its cells' attempts, and the regression verdicts
(``regress.SeriesVerdict``) stored with the method that reached them and their confirmation."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from farm.records import Alert, StoredAttempt
from farm.store.backends import Backend, now, retried, write_token


class SweepsMixin:
    """The ``Store``'s sweeps and alerts."""

    _db: Backend

    def start_sweep(self, spec: dict[str, Any]) -> int:
        """A new sweep "running" with ``spec``; its id. Under one write token (schema 21), so a retry whose first
        commit landed finds that sweep instead of leaving it an orphan "running" beside a second one (#61)."""
        return self._start_sweep(spec, write_token())

    @retried
    def _start_sweep(self, spec: dict[str, Any], token: str) -> int:
        with self._db.transaction() as db:
            inserted = db.execute("INSERT INTO sweeps (started_at, status, spec, start_key) VALUES (?, 'running', ?, ?) "
                                  "ON CONFLICT DO NOTHING RETURNING id", (now(), json.dumps(spec), token)).fetchall()
            if inserted:
                return int(inserted[0][0])
            return int(db.execute("SELECT id FROM sweeps WHERE start_key = ?", (token,)).fetchone()[0])

    @retried
    def finish_sweep(self, sweep_id: int, status: str) -> None:
        with self._db.transaction() as db:
            db.execute("UPDATE sweeps SET finished_at=?, status=? WHERE id=?", (now(), status, sweep_id))

    def sweep(self, sweep_id: int | None = None) -> dict[str, Any] | None:
        """One sweep (the latest when ``sweep_id`` is None), with its spec parsed."""
        if sweep_id is None:
            row = self._db.execute("SELECT * FROM sweeps ORDER BY id DESC LIMIT 1").fetchone()
        else:
            row = self._db.execute("SELECT * FROM sweeps WHERE id=?", (sweep_id,)).fetchone()
        return None if row is None else {**dict(row), "spec": json.loads(row["spec"])}

    def sweep_attempts(self, sweep_id: int) -> dict[tuple[str, str], list[StoredAttempt]]:
        """(device, model) -> the attempts of a sweep's stored TVM runs, in order (a cell's reference-runtime run
        is stored with its attempt, not an attempt of its own: ``record_cell``)."""
        cells: dict[tuple[str, str], list[StoredAttempt]] = {}
        for device, model, attempt, status, step in self._db.tuples(
                "SELECT device, model, attempt, status, failed_step FROM runs WHERE sweep_id=? AND runtime='tvm'"
                " ORDER BY id", (sweep_id,)):
            cells.setdefault((device, model), []).append(StoredAttempt(attempt, status, step))
        return cells

    def save_alert(self, verdict: Mapping[str, Any], method: dict[str, Any], status: str | None = None,
                   confirmation: dict[str, Any] | None = None) -> int:
        """Insert or update the alert of one series in one sweep; returns its id.

        Detecting again without confirming keeps an earlier confirmation and its status."""
        return self.save_alerts([verdict], method, [status], [confirmation])[0]

    @retried
    def save_alerts(self, verdicts: Sequence[Mapping[str, Any]], method: dict[str, Any],
                    statuses: Sequence[str | None] | None = None,
                    confirmations: Sequence[dict[str, Any] | None] | None = None) -> list[int]:
        """``save_alert`` for many series in one transaction (a night's 1,000 alerts: one commit, not 1,000);
        returns their ids in order."""
        stamp, ids = now(), []
        statuses = statuses if statuses is not None else [None] * len(verdicts)
        confirmations = confirmations if confirmations is not None else [None] * len(verdicts)
        with self._db.transaction() as db:
            for verdict, status, confirmation in zip(verdicts, statuses, confirmations):
                db.execute(
                    """INSERT INTO alerts (created_at, updated_at, sweep_id, device, model, tuned, runtime, metric,
                       run_id, baseline_run_id, status, value, z, change, baseline, method, confirmation)
                       VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
                       ON CONFLICT (sweep_id, device, model, tuned, runtime, metric) DO UPDATE SET
                       updated_at=excluded.updated_at,
                       status=CASE WHEN excluded.confirmation = '{}' THEN alerts.status ELSE excluded.status END,
                       confirmation=CASE WHEN excluded.confirmation = '{}' THEN alerts.confirmation
                                         ELSE excluded.confirmation END""",
                    (stamp, stamp, verdict["sweep_id"], verdict["device"], verdict["model"], int(verdict["tuned"]),
                     verdict.get("runtime", "tvm"), verdict["metric"], verdict["run_id"], verdict["baseline_run_id"],
                     status or verdict["status"],
                     verdict["value"], verdict["z"], verdict["change"], json.dumps(verdict["baseline"]),
                     json.dumps(method), json.dumps(confirmation or {})))
                row = db.execute("SELECT id FROM alerts WHERE sweep_id=? AND device=? AND model=? AND tuned=? AND "
                                 "runtime=? AND metric=?", (verdict["sweep_id"], verdict["device"], verdict["model"],
                                                            int(verdict["tuned"]), verdict.get("runtime", "tvm"),
                                                            verdict["metric"])).fetchone()
                ids.append(int(row[0]))
        return ids

    def series_alerts(self, device: str, model: str, tuned: bool, runtime: str, metric: str = "steady") -> list[Alert]:
        """Every stored alert of one series and metric, oldest sweep first (a finding page's markers)."""
        rows = self._db.dicts("SELECT * FROM alerts WHERE device=? AND model=? AND tuned=? AND runtime=? AND metric=?"
                              " ORDER BY sweep_id, id", [device, model, int(tuned), runtime, metric])
        return [_alert(r) for r in rows]

    def alerts(self, sweep_id: int | None = None) -> list[Alert]:
        sql, params = "SELECT * FROM alerts", []
        if sweep_id is not None:
            sql, params = sql + " WHERE sweep_id=?", [sweep_id]
        return [_alert(r) for r in self._db.dicts(sql + " ORDER BY id", params)]


def _alert(row: dict[str, Any]) -> Alert:
    return Alert(**{**row, "tuned": bool(row["tuned"]), "baseline": json.loads(row["baseline"]),
                    "method": json.loads(row["method"]), "confirmation": json.loads(row["confirmation"])})
