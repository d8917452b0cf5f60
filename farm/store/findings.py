"""Findings as records with a life (#22): each finding (``farm/findings.py``) of a reviewed sweep, its triage state
(new | acknowledged | expected | fixed) carried across nights while the finding persists, and each sweep's
confirmation budget (what was spent, what was left unconfirmed)."""

from __future__ import annotations

import json
from typing import Any, Mapping

from farm.errors import StoreError
from farm.records import TRIAGE_STATES
from farm.store.backends import Backend, now, retried


class FindingsMixin:
    """The ``Store``'s findings and confirmation budgets."""

    _db: Backend

    @retried
    def record_findings(self, sweep_id: int, findings: list[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        """Store a sweep's findings (each a mapping with ``key``, ``kind``, ``metric``: ``findings.Finding``); returns
        key → {id, state, note, first_sweep}. A finding persists when its key was a finding of the last sweep reviewed
        before this one (or spans this one, reviewed again): it keeps its id and triage state. Otherwise it is new.
        Every review is recorded (``reviewed_sweeps``), a quiet one too: a finding missing from a reviewed night
        that comes back the next is new again, not the old one with its old state ('fixed')."""
        stamp = now()
        out: dict[str, dict[str, Any]] = {}
        with self._db.transaction() as db:
            row = db.execute("SELECT MAX(sweep_id) FROM reviewed_sweeps WHERE sweep_id < ?", (sweep_id,)).fetchone()
            previous = row[0] if row and row[0] is not None else None
            db.execute("INSERT INTO reviewed_sweeps (sweep_id, reviewed_at) VALUES (?,?) ON CONFLICT (sweep_id)"
                       " DO UPDATE SET reviewed_at=excluded.reviewed_at", (sweep_id, stamp))
            db.execute("DELETE FROM finding_sweeps WHERE sweep_id=?", (sweep_id,))  # reviewed again: this review's
            for position, finding in enumerate(findings):
                key = finding["key"]
                found = db.execute(  # this sweep was in its span (reviewed again), or it lasted to the last review
                    "SELECT id, state, note, first_sweep FROM findings WHERE key=? AND ((first_sweep<=? AND last_sweep>=?)"
                    " OR last_sweep=?) ORDER BY id DESC LIMIT 1",
                    (key, sweep_id, sweep_id, previous if previous is not None else sweep_id)).fetchone()
                if found is None:
                    finding_id = db.insert_id(
                        "INSERT INTO findings (key, kind, metric, first_sweep, last_sweep, state, note, created_at,"
                        " updated_at) VALUES (?,?,?,?,?,'new','',?,?)",
                        (key, finding["kind"], finding["metric"], sweep_id, sweep_id, stamp, stamp))
                    state, note, first = "new", "", sweep_id
                else:
                    finding_id, state, note, first = found[0], found[1], found[2], found[3]
                    db.execute("UPDATE findings SET last_sweep=?, updated_at=? WHERE id=?",
                               (max(sweep_id, _last_sweep(db, finding_id)), stamp, finding_id))
                db.execute("INSERT INTO finding_sweeps (finding_id, sweep_id, position, body) VALUES (?,?,?,?)",
                           (finding_id, sweep_id, position, json.dumps(dict(finding), default=list)))
                out[key] = {"id": finding_id, "state": state, "note": note, "first_sweep": first}
        return out

    def findings(self, sweep_id: int) -> list[dict[str, Any]]:
        """A reviewed sweep's stored findings, in the order they were ranked, each its body with id, state, note and
        first_sweep."""
        rows = self._db.dicts(
            "SELECT f.id, f.state, f.note, f.first_sweep, s.body FROM finding_sweeps s JOIN findings f"
            " ON f.id = s.finding_id WHERE s.sweep_id=? ORDER BY s.position", [sweep_id])
        return [{**json.loads(r["body"]), "finding_id": r["id"], "state": r["state"], "note": r["note"],
                 "first_sweep": r["first_sweep"]} for r in rows]

    def last_reviewed(self) -> int | None:
        """The latest sweep whose findings are stored (``record_findings``), None when none is."""
        row = self._db.execute("SELECT MAX(sweep_id) FROM reviewed_sweeps").fetchone()
        return row[0] if row and row[0] is not None else None

    def finding(self, finding_id: int, sweep_id: int | None = None) -> dict[str, Any] | None:
        """One stored finding as a sweep ranked it (default: its last), with its id, state, note, first and last sweep
        and its position that night; None when there is no such finding."""
        rows = self._db.dicts(
            "SELECT f.id, f.state, f.note, f.first_sweep, f.last_sweep, s.sweep_id, s.position, s.body"
            " FROM finding_sweeps s JOIN findings f ON f.id = s.finding_id WHERE f.id=?"
            + (" AND s.sweep_id=?" if sweep_id is not None else "") + " ORDER BY s.sweep_id DESC LIMIT 1",
            [finding_id] + ([sweep_id] if sweep_id is not None else []))
        if not rows:
            return None
        r = rows[0]
        return {**json.loads(r["body"]), "finding_id": r["id"], "state": r["state"], "note": r["note"],
                "first_sweep": r["first_sweep"], "last_sweep": r["last_sweep"], "sweep_id": r["sweep_id"],
                "position": r["position"]}

    def finding_states(self, keys: list[str], sweep_id: int) -> dict[str, dict[str, Any]]:
        """Stored id, state, note and first sweep of the findings of ``sweep_id`` with these keys (read only)."""
        out = {}
        for key in keys:
            row = self._db.execute("SELECT id, state, note, first_sweep FROM findings WHERE key=? AND first_sweep<=?"
                                   " AND last_sweep>=? ORDER BY id DESC LIMIT 1", (key, sweep_id, sweep_id)).fetchone()
            if row is not None:
                out[key] = {"id": row[0], "state": row[1], "note": row[2], "first_sweep": row[3]}
        return out

    @retried
    def set_finding_state(self, finding_id: int, state: str, note: str = "") -> None:
        """Triage a finding: new, acknowledged, expected (a planned trade-off) or fixed."""
        if state not in TRIAGE_STATES:
            raise StoreError(f"unknown triage state {state!r}", f"one of {', '.join(TRIAGE_STATES)}")
        with self._db.transaction() as db:
            if db.execute("SELECT id FROM findings WHERE id=?", (finding_id,)).fetchone() is None:
                raise StoreError(f"there is no finding {finding_id}", "farm regressions lists each finding's id")
            db.execute("UPDATE findings SET state=?, note=?, updated_at=? WHERE id=?", (state, note, now(), finding_id))

    @retried
    def save_budget(self, sweep_id: int, budget_s: float, spent_s: float, rerun: int, left_unconfirmed: int) -> None:
        with self._db.transaction() as db:
            db.execute("INSERT INTO confirmation_budgets (sweep_id, budget_s, spent_s, rerun, left_unconfirmed, updated_at)"
                       " VALUES (?,?,?,?,?,?) ON CONFLICT (sweep_id) DO UPDATE SET budget_s=excluded.budget_s,"
                       " spent_s=excluded.spent_s, rerun=excluded.rerun, left_unconfirmed=excluded.left_unconfirmed,"
                       " updated_at=excluded.updated_at", (sweep_id, budget_s, spent_s, rerun, left_unconfirmed, now()))

    def budget(self, sweep_id: int) -> dict[str, Any] | None:
        """A sweep's confirmation budget: budget_s, spent_s, rerun (series), left_unconfirmed (findings)."""
        rows = self._db.dicts("SELECT budget_s, spent_s, rerun, left_unconfirmed FROM confirmation_budgets"
                              " WHERE sweep_id=?", [sweep_id])
        return rows[0] if rows else None


def _last_sweep(db: Any, finding_id: int) -> int:
    return int(db.execute("SELECT last_sweep FROM findings WHERE id=?", (finding_id,)).fetchone()[0])
