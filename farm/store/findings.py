"""Findings as records with a life (#22, #65): each finding (``farm.analysis.findings``) of a reviewed sweep, its triage state
(``records.TRIAGE_STATES``) carried to every night it returns on, each change of it an event (who, when, why, the
bug), and each sweep's confirmation budget (what was spent, what was left unconfirmed)."""

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
        key → {id, state, note, first_sweep}. A finding whose key was a finding of a night near this one
        (``_carried``: its span covers this night, or it was last seen at most ``CARRY_GAP`` reviewed nights before,
        or it starts later and this older night is reviewed now) keeps its id and triage state (schema 23); one
        marked fixed before this night is reopened (state new, with an event by "farm" saying so). Otherwise it is
        new. Every review is recorded (``reviewed_sweeps``)."""
        stamp = now()
        out: dict[str, dict[str, Any]] = {}
        with self._db.transaction() as db:
            db.execute("INSERT INTO reviewed_sweeps (sweep_id, reviewed_at) VALUES (?,?) ON CONFLICT (sweep_id)"
                       " DO UPDATE SET reviewed_at=excluded.reviewed_at", (sweep_id, stamp))
            db.execute("DELETE FROM finding_sweeps WHERE sweep_id=?", (sweep_id,))  # reviewed again: this review's
            for position, finding in enumerate(findings):
                key = finding["key"]
                found = _carried(db, key, sweep_id)
                if found is None:
                    finding_id = db.insert_id(
                        "INSERT INTO findings (key, kind, metric, first_sweep, last_sweep, state, note, created_at,"
                        " updated_at) VALUES (?,?,?,?,?,'new','',?,?)",
                        (key, finding["kind"], finding["metric"], sweep_id, sweep_id, stamp, stamp))
                    state, note, first = "new", "", sweep_id
                else:
                    finding_id, state, note, first = found[0], found[1], found[2], min(found[3], sweep_id)
                    if state == "fixed" and sweep_id > _fixed_on(db, finding_id, found[4]):  # back after its fix
                        _event(db, finding_id, "farm", "fixed", "new", f"reopened: back on sweep {sweep_id} after "
                               "it was marked fixed", "", None, sweep_id, stamp)
                        db.execute("UPDATE findings SET state='new' WHERE id=?", (finding_id,))
                        state = "new"
                    db.execute("UPDATE findings SET first_sweep=?, last_sweep=?, updated_at=? WHERE id=?",
                               (first, max(sweep_id, found[4]), stamp, finding_id))
                db.execute("INSERT INTO finding_sweeps (finding_id, sweep_id, position, body) VALUES (?,?,?,?)",
                           (finding_id, sweep_id, position, json.dumps(dict(finding), default=list)))
                out[key] = {"id": finding_id, "state": state, "note": note, "first_sweep": first}
        return out

    def findings(self, sweep_id: int) -> list[dict[str, Any]]:
        """A reviewed sweep's stored findings, in the order they were ranked, each its body with id, state, note and
        first_sweep."""
        rows = self._db.dicts(
            "SELECT f.id, f.state, f.note, f.bug, f.duplicate_of, f.first_sweep, s.body FROM finding_sweeps s"
            " JOIN findings f ON f.id = s.finding_id WHERE s.sweep_id=? ORDER BY s.position", [sweep_id])
        return [_as_stored(r) for r in rows]

    def reviewed(self, sweep_id: int) -> bool:
        return self._db.execute("SELECT 1 FROM reviewed_sweeps WHERE sweep_id=?", (sweep_id,)).fetchone() is not None

    def judged(self, sweep_id: int) -> bool:
        """Whether the sweep's stored findings are its last word: reviewed after it finished, and no run of it started
        since (a resumed sweep is judged again)."""
        row = self._db.execute(
            "SELECT 1 FROM reviewed_sweeps r JOIN sweeps s ON s.id = r.sweep_id WHERE r.sweep_id=? AND"
            " s.finished_at IS NOT NULL AND s.finished_at <= r.reviewed_at AND NOT EXISTS"
            " (SELECT 1 FROM runs WHERE runs.sweep_id = r.sweep_id AND runs.started_at >= r.reviewed_at)",
            (sweep_id,)).fetchone()
        return row is not None

    def finding_nights(self, finding_id: int) -> list[int]:
        """The reviewed nights a finding was a finding of, oldest first."""
        return [int(r[0]) for r in self._db.execute("SELECT sweep_id FROM finding_sweeps WHERE finding_id=? ORDER BY"
                                                    " sweep_id", (finding_id,)).fetchall()]

    def last_reviewed(self) -> int | None:
        """The latest sweep whose findings are stored (``record_findings``), None when none is."""
        row = self._db.execute("SELECT MAX(sweep_id) FROM reviewed_sweeps").fetchone()
        return row[0] if row and row[0] is not None else None

    def finding(self, finding_id: int, sweep_id: int | None = None) -> dict[str, Any] | None:
        """One stored finding as a sweep ranked it (default: its last), with its id, state, note, first and last sweep
        and its position that night; None when there is no such finding."""
        rows = self._db.dicts(
            "SELECT f.id, f.state, f.note, f.bug, f.duplicate_of, f.first_sweep, f.last_sweep, s.sweep_id, s.position,"
            " s.body"
            " FROM finding_sweeps s JOIN findings f ON f.id = s.finding_id WHERE f.id=?"
            + (" AND s.sweep_id=?" if sweep_id is not None else "") + " ORDER BY s.sweep_id DESC LIMIT 1",
            [finding_id] + ([sweep_id] if sweep_id is not None else []))
        if not rows:
            return None
        r = rows[0]
        return {**_as_stored(r), "last_sweep": r["last_sweep"], "sweep_id": r["sweep_id"], "position": r["position"]}

    def finding_states(self, keys: list[str], sweep_id: int) -> dict[str, dict[str, Any]]:
        """Stored id, state, note and first sweep of the findings of ``sweep_id`` with these keys (read only)."""
        out = {}
        for key in keys:
            row = _carried(self._db, key, sweep_id)  # the rule record_findings will apply
            if row is not None:
                out[key] = {"id": row[0], "state": row[1], "note": row[2], "first_sweep": min(row[3], sweep_id)}
        return out

    @retried
    def triage(self, finding_id: int, state: str, author: str, note: str = "", bug: str = "",
               duplicate_of: int | None = None) -> dict[str, Any]:
        """Set a finding's triage state (``records.TRIAGE_STATES``), as one event: at, author, from → to, note, bug
        URL, the finding it duplicates (state duplicate only, and then required). Returns the event."""
        if state not in TRIAGE_STATES:
            raise StoreError(f"unknown triage state {state!r}", f"one of {', '.join(TRIAGE_STATES)}")
        if not author.strip():
            raise StoreError("a triage needs its author", "say who: --by NAME (or FARM_USER)")
        if (state == "duplicate") != (duplicate_of is not None):
            raise StoreError("a duplicate names the finding it duplicates, and only a duplicate does",
                             "--triage ID:duplicate --duplicate-of OTHER_ID")
        stamp = now()
        with self._db.transaction() as db:
            row = db.execute("SELECT state, last_sweep FROM findings WHERE id=?", (finding_id,)).fetchone()
            if row is None:
                raise StoreError(f"there is no finding {finding_id}", "farm regressions lists each finding's id")
            if duplicate_of is not None and (duplicate_of == finding_id or db.execute(
                    "SELECT id FROM findings WHERE id=?", (duplicate_of,)).fetchone() is None):
                raise StoreError(f"finding {finding_id} cannot duplicate {duplicate_of}: no such other finding",
                                 "farm regressions lists each finding's id")
            # the finding keeps its last note and bug until a triage gives new ones; each event keeps its own
            db.execute("UPDATE findings SET state=?, note=CASE WHEN ?='' THEN note ELSE ? END, bug=CASE WHEN ?=''"
                       " THEN bug ELSE ? END, duplicate_of=?, updated_at=? WHERE id=?",
                       (state, note, note, bug, bug, duplicate_of, stamp, finding_id))
            _event(db, finding_id, author.strip(), row[0], state, note, bug, duplicate_of, row[1], stamp)
        return {"finding_id": finding_id, "at": stamp, "author": author.strip(), "from_state": row[0],
                "to_state": state, "note": note, "bug": bug, "duplicate_of": duplicate_of, "sweep_id": row[1]}

    def set_finding_state(self, finding_id: int, state: str, note: str = "") -> None:
        """``triage`` by farm itself (no person named): kept for the callers of schema 12's API."""
        self.triage(finding_id, state, "farm", note)

    def finding_events(self, finding_ids: list[int] | None = None) -> dict[int, list[dict[str, Any]]]:
        """Each finding's triage events, oldest first (all findings' when ``finding_ids`` is None)."""
        sql = "SELECT * FROM finding_events"
        params: list[Any] = []
        if finding_ids is not None:
            if not finding_ids:
                return {}
            sql += f" WHERE finding_id IN ({','.join('?' * len(finding_ids))})"
            params = list(finding_ids)
        out: dict[int, list[dict[str, Any]]] = {}
        for row in self._db.dicts(sql + " ORDER BY id", params):
            out.setdefault(row["finding_id"], []).append(row)
        return out

    def invalid_by_month(self) -> list[tuple[str, int]]:
        """(YYYY-MM, findings triaged invalid that month), oldest first: the false alerts that tune thresholds."""
        rows = self._db.tuples("SELECT substr(at, 1, 7) AS month, COUNT(DISTINCT finding_id) FROM finding_events"
                               " WHERE to_state='invalid' GROUP BY substr(at, 1, 7) ORDER BY month")
        return [(str(m), int(n)) for m, n in rows]

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


def _as_stored(row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored finding as a night ranked it (its body) with its life: id, triage state, note, bug, duplicate, first
    sweep."""
    return {**json.loads(row["body"]), "finding_id": row["id"], "state": row["state"], "note": row["note"],
            "bug": row["bug"], "duplicate_of": row["duplicate_of"], "first_sweep": row["first_sweep"]}


def _event(db: Any, finding_id: int, author: str, old: str, new: str, note: str, bug: str, duplicate_of: int | None,
           sweep_id: int | None, stamp: str) -> None:
    db.execute("INSERT INTO finding_events (finding_id, at, author, from_state, to_state, note, bug, duplicate_of,"
               " sweep_id) VALUES (?,?,?,?,?,?,?,?,?)", (finding_id, stamp, author, old, new, note, bug, duplicate_of,
                                                         sweep_id))


# A finding last seen more reviewed nights before than this is another finding when its key returns (a scatter's
# or a tuning finding's key is the same on every night: a state set in January must not silence June's)
CARRY_GAP = 7


def _carried(db: Any, key: str, sweep_id: int) -> tuple | None:
    """(id, state, note, first_sweep, last_sweep) of the finding a night's finding of ``key`` continues: the one whose
    span covers the night; else the latest seen before it, when at most ``CARRY_GAP`` reviewed nights lie between;
    else the earliest that starts after it (an older night reviewed late: it extends that finding back)."""
    columns = "SELECT id, state, note, first_sweep, last_sweep FROM findings WHERE key=?"
    covering = db.execute(f"{columns} AND first_sweep<=? AND last_sweep>=? ORDER BY id DESC LIMIT 1",
                          (key, sweep_id, sweep_id)).fetchone()
    if covering is not None:
        return tuple(covering)
    before = db.execute(f"{columns} AND last_sweep<? ORDER BY last_sweep DESC, id DESC LIMIT 1",
                        (key, sweep_id)).fetchone()
    if before is not None:
        gap = db.execute("SELECT COUNT(*) FROM reviewed_sweeps WHERE sweep_id>? AND sweep_id<?",
                         (before[4], sweep_id)).fetchone()[0]
        if gap <= CARRY_GAP:
            return tuple(before)
    after = db.execute(f"{columns} AND first_sweep>? ORDER BY first_sweep, id LIMIT 1", (key, sweep_id)).fetchone()
    return tuple(after) if after is not None else None


def _fixed_on(db: Any, finding_id: int, last_sweep: int) -> int:
    """The night a finding was last marked fixed on (its last sweep then); for one marked fixed before schema 23 (no
    event), its last night as stored (``last_sweep``, before this review)."""
    row = db.execute("SELECT MAX(sweep_id) FROM finding_events WHERE finding_id=? AND to_state='fixed'",
                     (finding_id,)).fetchone()
    return int(row[0]) if row and row[0] is not None else last_sweep
