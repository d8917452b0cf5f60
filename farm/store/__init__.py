"""The results database. The only package that writes it.

A SQLite file in WAL mode (default) or a PostgreSQL database (``--db postgresql://...``) for a
farm whose hosts share one database; the same SQL runs on both (``backends.py``). One
transaction per recorded result, raw samples in long format, and each sample series' summary
(``stats.summarize_rows``) written with it, so that reading 50,000 runs never reads their 1.5 M samples.
The summaries are derived data: the rule that wrote them is kept in meta and, when farm's rule
changes, they are recomputed from the samples on open. The schema and its history: ``schema.py``.

``Store`` is one object over six modules, split by what they store: ``runs.py`` (results, samples,
summaries, copies, copy curves), ``tuning.py`` (tune sessions and records), ``sweeps.py`` (sweeps and
alerts), ``catalog.py`` (probes, artifacts, models), ``findings.py`` (findings, their triage, confirmation
budgets), ``leases.py`` (which lab cell holds each device). This module opens, migrates and closes.
A driver's error never leaves the store: ``backends.py`` turns it into a ``StoreError``. Where the results are, a
file or a URL whose password farm never shows: ``locations.py``.
"""

from __future__ import annotations

import threading
from pathlib import Path

from farm.errors import StoreError
from farm.stats import SUMMARY_RULE
from farm.store.backends import open_backend
from farm.store.locations import exists
from farm.store.catalog import CatalogMixin
from farm.store.findings import FindingsMixin
from farm.store.leases import LeasesMixin
from farm.store.runs import RunsMixin
from farm.store.schema import MIGRATIONS, SCHEMA_VERSION, statements
from farm.store.sweeps import SweepsMixin
from farm.store.tuning import TuningMixin

__all__ = ["Store", "SCHEMA_VERSION", "exists", "shared_store", "shared_connection"]

TABLES = ("runs", "samples", "summaries", "copies", "checks", "devices", "models", "artifacts", "tune_records",
          "tune_workloads", "tune_sessions", "tune_cost_models", "sweeps", "alerts", "probes", "copy_curves",
          "copy_curve_samples", "findings", "finding_sweeps", "confirmation_budgets",
          "reviewed_sweeps", "night_tunings", "artifact_files", "sweep_builds", "device_leases")


class Store(RunsMixin, TuningMixin, SweepsMixin, CatalogMixin, FindingsMixin, LeasesMixin):
    """An open results database. Use as a context manager or call ``close``."""

    def __init__(self, path: str | Path, readonly: bool = False, wait_s: float = 0.0) -> None:
        """``wait_s``: how long a PostgreSQL server that refuses to connect is waited for (``backends.RECONNECT_S``
        in a lab's workers and followers, which outlive a database restart); once open, a lost connection is
        always waited for that long (``backends``)."""
        self._db = open_backend(path, readonly, wait_s)
        self.kind = self._db.kind
        self.path = Path(path) if self.kind == "sqlite" else self._db.location  # shown in reports, never a password
        try:
            with self._db.phase("open"):
                if readonly:
                    version = self._version()
                    if version > SCHEMA_VERSION:
                        raise StoreError(f"{self.path} has a newer schema than this farm", "upgrade farm")
                    if version < SCHEMA_VERSION or self._summary_rule() != SUMMARY_RULE:
                        raise StoreError(f"{self.path} was written by an older farm (schema {version}) and is opened read-only",
                                         f"upgrade it once by opening it writable: farm results --db {self.path} --latest")
                else:
                    self._migrate()
        except BaseException:
            self._db.close()
            raise

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

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
            with self._db.transaction(migrating=True) as db:
                if self._version() >= target:  # another farm migrated meanwhile
                    continue
                for statement in statements(MIGRATIONS[target]):
                    db.execute(self._db.ddl(statement))
                db.execute("INSERT INTO meta VALUES ('schema_version', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                           (str(target),))
        if self._summary_rule() != SUMMARY_RULE:
            with self._db.transaction(migrating=True) as db:
                if self._summary_rule() != SUMMARY_RULE:  # another farm did it meanwhile
                    self._summarize_stored(db)
                    db.execute("INSERT INTO meta VALUES ('summary_rule', ?)"
                               " ON CONFLICT (key) DO UPDATE SET value = excluded.value", (SUMMARY_RULE,))

    def _summary_rule(self) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key='summary_rule'").fetchone()
        return row[0] if row else None

    def count(self, table: str) -> int:
        if table not in TABLES:
            raise ValueError(table)
        return int(self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


_SHARED: dict[str, Store] = {}
_SHARED_LOCK = threading.Lock()


def shared_store(url: str) -> Store:
    """This process's one ``Store`` on the PostgreSQL database ``url``, shared by its threads, never closed: a lab
    worker's jobs, its lease renewals and its queue reads all go through its one connection (#50: a connection per
    running job put 4 workers × 24 slots past PostgreSQL's default ``max_connections = 100``). A transaction holds
    it whole (``backends.PostgresBackend``); it waits for a restarting server (``RECONNECT_S``)."""
    from farm.store.locations import require_server
    from farm.store.backends import RECONNECT_S

    require_server(url, "a store shared by a worker's threads")
    with _SHARED_LOCK:
        if url not in _SHARED:
            _SHARED[url] = Store(url, wait_s=RECONNECT_S)
        return _SHARED[url]


def shared_connection(url: str):
    """The shared store's connection (``PostgresBackend.connection``) where this process has one for ``url``, else
    None: the lab's queue then runs its statements there rather than on a connection of its own."""
    store = _SHARED.get(url)
    return None if store is None else store._db.connection()  # type: ignore[attr-defined]  # PostgresBackend's
