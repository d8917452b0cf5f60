"""Connections to the results database: a SQLite file, or a PostgreSQL server for shared farms.

Both take the same SQL (written portably: ``?`` placeholders, ``ON CONFLICT``, ``RETURNING``),
and return rows readable by name and by position. ``--db`` is a file path or a
``postgresql://user@host:port/dbname`` URL.

This is where a driver's error (sqlite3's or psycopg's) becomes a ``StoreError``, once: every
statement, fetch, transaction and commit of a ``Backend`` raises nothing else. Its message says what
farm was doing (opening, upgrading, writing or reading) and where; its hint, why it most likely failed.

A PostgreSQL server may restart or fail over under a running farm (#50: ``pg_ctl restart -m fast`` took 0.66 s,
and every cell running then failed for good at its next write). So a lost connection is not an error until
``RECONNECT_S`` has passed: a statement outside a transaction runs again on a new connection, and a write (a
``Store`` method marked ``@retried``: its whole transaction) runs again from its start. Each such write is safe
to run twice: a sweep's run has its unique cell key (a commit whose acknowledgement was lost is found, not doubled).
"""

from __future__ import annotations

import functools
import secrets
import logging
import sqlite3
import threading
import time
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from farm.errors import ConnectionLost, StoreError, message_line
from farm.records import utc_now
from farm.store.schema import postgres_ddl, sqlite_ddl
from farm.store.locations import application_name, is_url, redact

log = logging.getLogger(__name__)
T = TypeVar("T")

# a lost server is waited for this long on each write or read before it is an error: a restart took 0.66 s here
# (#50), and 60 s is the bound #50 sets for a failover; what a lab job waits at most for its database
RECONNECT_S = 60.0
RECONNECT_PAUSES_S = (0.1, 0.2, 0.5, 1.0, 2.0)  # between tries to reconnect, then the last one again


class Outage:
    """One wait through a lost connection, the one rule of farm's reconnects (the store's and the lab queue's):
    it starts at the first loss and ends ``RECONNECT_S`` later (or at a ``deadline`` it is given: an outage the
    process already waits through), with ``RECONNECT_PAUSES_S`` between tries."""

    def __init__(self, deadline: float | None = None) -> None:
        self.deadline, self.tries = deadline, 0

    def pause(self) -> float | None:
        """The pause before the next try; None once the outage has lasted its time (give up)."""
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + RECONNECT_S
        if now >= self.deadline:
            return None
        self.tries += 1
        return RECONNECT_PAUSES_S[min(self.tries - 1, len(RECONNECT_PAUSES_S) - 1)]

    def outlast(self, call: Callable[[], T], lost: Callable[[Exception], bool],
                first_loss: Callable[[Exception], None] | None = None) -> T:
        """``call()``, run again while what it raises is ``lost`` (the connection gone), after each ``pause``; the
        error itself once it is not lost or the outage has lasted its time. ``first_loss`` hears of the first. The
        loop of the store's connects and the lab queue's calls (procrastinate's own, async, keep theirs:
        ``lab.queue``)."""
        while True:
            try:
                return call()
            except Exception as exc:
                if not lost(exc) or (wait := self.pause()) is None:
                    raise
                if self.tries == 1 and first_loss is not None:
                    first_loss(exc)
                time.sleep(wait)


MIGRATION_LOCK = 0x6661726D  # "farm": one migrator at a time on a shared server
FETCH_ROWS = 1000  # rows fetched at a time while a cursor is iterated

OPEN_HINT = "pass another --db PATH, or move the damaged file aside"
CHECK_HINT = "check the database (or move it aside) and pass --db PATH"


def open_backend(location: str | Path, readonly: bool, wait_s: float = 0.0) -> "SqliteBackend | PostgresBackend":
    """``wait_s``: how long a PostgreSQL server that refuses the first connection is waited for (a lab's job or
    follower: ``RECONNECT_S``; a command a person typed: not at all, a wrong URL says so at once)."""
    if is_url(location):
        return PostgresBackend(str(location), readonly, wait_s)
    return SqliteBackend(Path(location), readonly)


def retried(method: Callable[..., T]) -> Callable[..., T]:
    """A ``Store`` method that writes in one transaction: run again whole on a new connection when the server's
    went away meanwhile (``Backend.retrying``), for up to ``RECONNECT_S``."""

    @functools.wraps(method)
    def write(self: Any, *args: Any, **kwargs: Any) -> T:
        return self._db.retrying(lambda: method(self, *args, **kwargs))

    return write


def write_token() -> str:
    """A token made once per write, before its first try: what a write run again by ``retried`` finds its rows by
    when its first commit landed and only the acknowledgement was lost (schema 21, #61)."""
    return secrets.token_hex(12)


now = utc_now  # a timestamp as the database keeps it (records.utc_now: UTC, ISO 8601, to the second)


def backend_hint(exc: BaseException, default: str = CHECK_HINT) -> str:
    """What to do about a driver's error, from its text (the same words on SQLite and PostgreSQL)."""
    text = str(exc).lower()
    if "locked" in text or "busy" in text:
        return "another farm process is writing it: run the command again when it is done"
    if "no such table" in text or "no such column" in text or "does not exist" in text:
        return "the database is from another farm version or not farm's: pass another --db, or open it writable once"
    if "readonly" in text or "read-only" in text or "permission" in text:
        return "the database is read-only here: pass a writable --db PATH"
    if "disk" in text or "full" in text:
        return "check disk space"
    if "terminating connection" in text or "server closed the connection" in text or "connection" in text:
        return (f"the database server went away (a restart or failover) and was not back within {RECONNECT_S:g} s: "
                "check that it runs, then run the command again (a sweep: farm sweep --resume ID)")
    return default


# what a failure's message says farm was doing, and the hint when the error's text tells nothing more
DOING = {"open": ("cannot open results database {}", OPEN_HINT),
         "upgrade": ("could not upgrade the schema of {}", OPEN_HINT),
         "write": ("could not write to {}", CHECK_HINT),
         "read": ("could not read {}", CHECK_HINT)}


class Backend:
    """What both connections share: the translation of their driver's errors into ``StoreError``."""

    kind: str
    location: str  # shown in messages and reports: never a password
    clock_s: str  # SQL: the database's clock in seconds since 1970 (leases expire by it, whatever a host's clock says)
    lock_row: str  # SQL after a SELECT: hold the rows read until the transaction ends
    errors: tuple[type[Exception], ...]
    doing = "read"  # "open", "upgrade", "write" or "read": set by ``phase`` and by transactions

    @contextmanager
    def phase(self, doing: str) -> Iterator[None]:
        """Failures inside say that farm was ``doing`` this (a key of ``DOING``)."""
        outer, self.doing = self.doing, doing
        try:
            yield
        finally:
            self.doing = outer

    @contextmanager
    def translated(self) -> Iterator[None]:
        try:
            yield
        except self.errors as exc:
            raise self.failure(exc) from exc

    def failure(self, exc: Exception) -> StoreError:
        message, default = DOING[self.doing]
        return StoreError(f"{message.format(self.location)}: {self.reason(exc)}", backend_hint(exc, default))

    def reason(self, exc: Exception) -> str:
        return message_line(exc)

    def execute(self, sql: str, params: Any = ()) -> "Rows":
        with self.translated():
            return Rows(self._execute(sql, params), self)

    def retrying(self, fn: Callable[[], T]) -> T:
        """``fn()``, a whole write: run again while the connection is lost and comes back (PostgreSQL's)."""
        return fn()

    def insert_id(self, sql: str, params: Any = ()) -> int:
        """Run an INSERT and return the new row's id."""
        return int(self.execute(sql + " RETURNING id", params).fetchall()[0][0])

    # what each connection implements
    def _execute(self, sql: str, params: Any) -> Any:
        raise NotImplementedError

    def dicts(self, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        raise NotImplementedError

    def tuples(self, sql: str, params: Any = ()) -> list[tuple]:
        raise NotImplementedError

    def executemany(self, sql: str, rows: list) -> None:
        raise NotImplementedError

    def transaction(self, migrating: bool = False) -> AbstractContextManager["Backend"]:
        """One writer's transaction: committed at the end of the block, rolled back on an exception."""
        raise NotImplementedError

    def table_exists(self, name: str) -> bool:
        raise NotImplementedError

    def ddl(self, statement: str) -> str:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Rows:
    """A statement's cursor, fetched through its backend: a failure while rows are read (SQLite steps a
    query as its rows are fetched) is a ``StoreError`` too."""

    def __init__(self, cursor: Any, backend: Backend) -> None:
        self._cursor = cursor
        self._backend = backend

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def fetchone(self) -> Any:
        with self._backend.translated():
            return self._cursor.fetchone()

    def fetchall(self) -> list:
        with self._backend.translated():
            return self._cursor.fetchall()

    def __iter__(self) -> Iterator[Any]:
        while True:
            with self._backend.translated():
                rows = self._cursor.fetchmany(FETCH_ROWS)
            if not rows:
                return
            yield from rows


class SqliteBackend(Backend):
    kind = "sqlite"
    clock_s = "((julianday('now') - 2440587.5) * 86400.0)"  # the database's own clock, seconds since 1970
    lock_row = ""  # SQLite's writer holds the whole database (BEGIN IMMEDIATE)
    errors: tuple[type[Exception], ...] = (sqlite3.Error,)

    def __init__(self, path: Path, readonly: bool) -> None:
        self.location = str(path)
        try:
            if readonly:  # readers (dashboard) never create, migrate or lock for writing
                self.db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30,
                                          isolation_level=None, check_same_thread=False)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.db = sqlite3.connect(path, timeout=30, isolation_level=None)
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA foreign_keys=ON")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open results database {path}: {exc}", OPEN_HINT) from exc
        except OSError as exc:
            raise StoreError(f"cannot create results database {path}: {exc.strerror}", "pass a writable --db PATH") from exc
        self.db.row_factory = sqlite3.Row

    def _execute(self, sql: str, params: Any) -> Any:
        return self.db.execute(sql, params)

    def dicts(self, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        """All rows as plain dicts, built from tuples (3× faster than from sqlite3.Row at 50,000 rows)."""
        with self.translated():
            cursor = self.db.cursor()
            cursor.row_factory = None
            cursor.execute(sql, params)
            names = [column[0] for column in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

    def tuples(self, sql: str, params: Any = ()) -> list[tuple]:
        """All rows as plain tuples: no row objects, for reads of 100,000 rows."""
        with self.translated():
            cursor = self.db.cursor()
            cursor.row_factory = None
            return cursor.execute(sql, params).fetchall()

    def executemany(self, sql: str, rows: list) -> None:
        with self.translated():
            self.db.executemany(sql, rows)

    @contextmanager
    def transaction(self, migrating: bool = False) -> Iterator["SqliteBackend"]:
        with self.phase("upgrade" if migrating else "write"):
            self.execute("BEGIN IMMEDIATE")  # one writer at a time, waiting up to the timeout
            try:
                yield self
            except BaseException:
                if self.db.in_transaction:  # SQLite ends it itself after some errors (a full disk)
                    self.execute("ROLLBACK")
                raise
            self.execute("COMMIT")

    def table_exists(self, name: str) -> bool:
        return self.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone() is not None

    def ddl(self, statement: str) -> str:
        return sqlite_ddl(statement)

    def close(self) -> None:
        self.db.close()


class Row(tuple):
    """A row readable as ``row[0]`` and ``row["name"]``, and by ``dict(row)``, like sqlite3.Row."""

    names: tuple[str, ...] = ()

    def __getitem__(self, key):
        if isinstance(key, str):
            return tuple.__getitem__(self, self.names.index(key))
        return tuple.__getitem__(self, key)

    def keys(self) -> tuple[str, ...]:
        return self.names


def _row_factory(cursor):
    names = tuple(c.name for c in cursor.description or ())
    row_type = type("Row", (Row,), {"names": names})
    return lambda values: row_type(values)


class PostgresBackend(Backend):
    kind = "postgresql"
    clock_s = "EXTRACT(EPOCH FROM clock_timestamp())"  # the server's clock: every host's leases on one clock
    lock_row = " FOR UPDATE"

    def __init__(self, url: str, readonly: bool, wait_s: float = 0.0) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise StoreError("a postgresql:// --db needs psycopg", 'pip install "psycopg[binary]" (farm depends on it)') from exc
        self._psycopg = psycopg
        self.errors = (psycopg.Error,)
        self.location = redact(url)
        self._url, self._readonly = url, readonly
        self._local = threading.local()  # this thread's: _depth, _retrying (the connection is shared: ``_lock``)
        # one connection, many threads (a lab worker's jobs: ``store.shared_store``): a transaction holds it whole,
        # a statement outside one for its own time; a cursor's rows are read after, from the client's copy
        self._lock = threading.RLock()
        self._outage_deadline: float | None = None  # while the connection is lost: when waiting for it ends
        self._generation = 0  # one more at each new connection: a statement that failed on an older one runs again
        try:
            self.db = self._connect(time.monotonic() + wait_s)
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to results database {self.location}: {message_line(exc)}",
                             "check the URL (postgresql://USER@HOST:PORT/DBNAME), that the server runs and the "
                             "database exists (createdb DBNAME)") from exc

    @property
    def _depth(self) -> int:
        """This thread's transactions open: a statement inside one is never run again alone."""
        return getattr(self._local, "depth", 0)

    @_depth.setter
    def _depth(self, value: int) -> None:
        self._local.depth = value

    @property
    def _retrying(self) -> bool:
        """This thread runs a write that runs again whole: the writes it calls do not retry on their own."""
        return getattr(self._local, "retrying", False)

    @_retrying.setter
    def _retrying(self, value: bool) -> None:
        self._local.retrying = value

    def _connect(self, deadline: float) -> Any:
        """A new connection, tried until ``deadline`` while the server refuses or is starting (an OperationalError)."""
        def attempt() -> Any:
            # a writer waits for a writable server, never a standby's read-only one
            attrs = "any" if self._readonly else "read-write"
            db = self._psycopg.connect(self._url, autocommit=True, row_factory=_row_factory, connect_timeout=10,
                                       application_name=application_name(), target_session_attrs=attrs)
            if self._readonly:
                db.execute("SET default_transaction_read_only = on")
            return db

        return Outage(deadline).outlast(attempt, lambda exc: isinstance(exc, self._psycopg.OperationalError))

    def lost(self, exc: BaseException | None) -> bool:
        """Whether ``exc`` (or what it was raised from) is the server's connection gone: an OperationalError
        after which the connection is closed (AdminShutdown on a restart, a reset, a timeout); or a write refused
        by a server that answers read-only (#61: a standby during a failover, taken for a failed write at once),
        which a new connection to a writable server (``target_session_attrs``) replaces."""
        while exc is not None and not isinstance(exc, self._psycopg.Error):
            exc = exc.__cause__
        if isinstance(exc, self._psycopg.errors.ReadOnlySqlTransaction) and not self._readonly:
            return True
        return isinstance(exc, self._psycopg.OperationalError) and (self.db.closed or self.db.broken)

    def _reconnect(self, deadline: float, exc: BaseException) -> None:
        with self._lock:
            self._reconnect_locked(deadline, exc)

    def _reconnect_locked(self, deadline: float, exc: BaseException) -> None:
        """One reconnect for every thread that lost the shared connection (#61: each waiting thread closed the
        connection the one before it had made again and took a deadline of its own, in turn under the lock: with
        24 slots, a thread could wait 25 minutes). A thread that finds the connection back returns; the outage's
        deadline is the first loser's, shared; once it passed, a thread tries once and fails at once."""
        read_only = isinstance(exc, self._psycopg.errors.ReadOnlySqlTransaction)
        if not (self.db.closed or self.db.broken or read_only):  # another thread reconnected while this one waited
            return
        outage = self._outage_deadline = self._outage_deadline or deadline
        log.warning("lost the connection to %s (%s): reconnecting", self.location, message_line(exc))
        try:
            self.db.close()
        except self._psycopg.Error:
            pass
        try:
            self.db = self._connect(max(outage, time.monotonic()))  # past the outage's deadline: one try
        except self._psycopg.Error as again:
            raise ConnectionLost(f"lost the connection to {self.location} ({message_line(exc)}) and could not "
                                 f"reconnect within {RECONNECT_S:g} s: {message_line(again)}",
                                 backend_hint(exc)) from again
        self._outage_deadline = None
        self._generation += 1
        log.warning("reconnected to %s", self.location)

    def retrying(self, fn: Callable[[], T]) -> T:
        with self._lock:  # a write runs whole before another thread's (its retry too)
            if self._depth or self._retrying:
                return fn()
            deadline = None
            self._retrying = True
            try:
                while True:
                    try:
                        return fn()
                    except StoreError as exc:
                        if isinstance(exc, ConnectionLost) or not self.lost(exc):
                            raise
                        deadline = deadline or time.monotonic() + RECONNECT_S
                        self._reconnect(deadline, exc.__cause__ or exc)
            finally:
                self._retrying = False

    def _statement(self, fn: Callable[[], T]) -> T:
        """``fn()``, one statement: run again on a new connection when the old one was lost, unless it is part of a
        write (which runs again whole: ``retrying``)."""
        deadline = None
        while True:
            generation = self._generation
            try:
                with self._lock:
                    return fn()
            except self._psycopg.OperationalError as exc:
                if self._depth or self._retrying:
                    raise
                if self._generation != generation:  # another thread made the connection again meanwhile: run again
                    continue
                if not self.lost(exc):
                    if self._generation != generation:  # made again between the two reads
                        continue
                    raise
                deadline = deadline or time.monotonic() + RECONNECT_S
                self._reconnect(deadline, exc)

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """The psycopg connection itself, held for the block (nothing else runs on it meanwhile), alive (a lost one
        replaced first): for the lab's queue's own statements in a worker (``lab.queue.LabQueue``), which then open no
        connection of their own. Not closed after."""
        with self._lock:
            if self.db.closed or self.db.broken:
                self._statement(lambda: self.db.execute("SELECT 1"))
            yield self.db

    def reason(self, exc: Exception) -> str:
        """The server's own one-line message (its text goes on with the statement and a caret), else the
        client's (a lost connection)."""
        return getattr(getattr(exc, "diag", None), "message_primary", None) or message_line(exc)

    @staticmethod
    def _sql(sql: str) -> str:
        return sql.replace("%", "%%").replace("?", "%s")

    def _execute(self, sql: str, params: Any) -> Any:
        return self._statement(lambda: self.db.execute(self._sql(sql), params))

    def _fetch(self, sql: str, params: Any, row_factory: Any) -> list:
        def fetch() -> list:
            with self.db.cursor(row_factory=row_factory) as cursor:
                cursor.execute(self._sql(sql), params)
                return cursor.fetchall()

        with self.translated():
            return self._statement(fetch)

    def dicts(self, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        """All rows as plain dicts."""
        from psycopg.rows import dict_row

        return self._fetch(sql, params, dict_row)

    def tuples(self, sql: str, params: Any = ()) -> list[tuple]:
        """All rows as plain tuples."""
        from psycopg.rows import tuple_row

        return self._fetch(sql, params, tuple_row)

    def executemany(self, sql: str, rows: list) -> None:
        def run() -> None:
            with self.db.cursor() as cursor:
                cursor.executemany(self._sql(sql), rows)

        with self.translated():
            self._statement(run)

    @contextmanager
    def transaction(self, migrating: bool = False) -> Iterator["PostgresBackend"]:
        # the commit (or rollback) happens inside ``translated``: a failing commit is a StoreError too
        with self._lock, self.phase("upgrade" if migrating else "write"), self.translated():
            if not self._depth and (self.db.closed or self.db.broken):  # lost since the last statement: a new one
                self._statement(lambda: self.db.execute("SELECT 1"))
            self._depth += 1
            try:
                with self.db.transaction():
                    if migrating:  # two farms opening a new database at once: one creates the tables
                        self.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
                    yield self
            finally:
                self._depth -= 1

    def table_exists(self, name: str) -> bool:
        return self.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() "
                            "AND table_name = ?", (name,)).fetchone() is not None

    def ddl(self, statement: str) -> str:
        return postgres_ddl(statement)

    def close(self) -> None:
        self.db.close()
