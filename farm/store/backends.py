"""Connections to the results database: a SQLite file, or a PostgreSQL server for shared farms.

Both take the same SQL (written portably: ``?`` placeholders, ``ON CONFLICT``, ``RETURNING``),
and return rows readable by name and by position. ``--db`` is a file path or a
``postgresql://user@host:port/dbname`` URL.

This is where a driver's error (sqlite3's or psycopg's) becomes a ``StoreError``, once: every
statement, fetch, transaction and commit of a ``Backend`` raises nothing else. Its message says what
farm was doing (opening, upgrading, writing or reading) and where; its hint, why it most likely failed.
"""

from __future__ import annotations

import re
import sqlite3
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Iterator

from farm.errors import StoreError, message_line
from farm.records import utc_now
from farm.store.schema import postgres_ddl, sqlite_ddl

URL_PREFIXES = ("postgresql://", "postgres://")
MIGRATION_LOCK = 0x6661726D  # "farm": one migrator at a time on a shared server
FETCH_ROWS = 1000  # rows fetched at a time while a cursor is iterated

OPEN_HINT = "pass another --db PATH, or move the damaged file aside"
CHECK_HINT = "check the database (or move it aside) and pass --db PATH"


def is_url(location: str | Path) -> bool:
    return str(location).startswith(URL_PREFIXES)


def redact(location: str) -> str:
    """The location without a password, for messages and reports."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", location)


def exists(location: str | Path) -> bool:
    """Whether there can be results there: a server is asked when it is opened."""
    return is_url(location) or Path(location).exists()


def open_backend(location: str | Path, readonly: bool) -> "SqliteBackend | PostgresBackend":
    if is_url(location):
        return PostgresBackend(str(location), readonly)
    return SqliteBackend(Path(location), readonly)


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

    def __init__(self, url: str, readonly: bool) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise StoreError("a postgresql:// --db needs psycopg", 'pip install "psycopg[binary]" (farm depends on it)') from exc
        self.errors = (psycopg.Error,)
        self.location = redact(url)
        try:
            self.db = psycopg.connect(url, autocommit=True, row_factory=_row_factory, connect_timeout=10)
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to results database {self.location}: {message_line(exc)}",
                             "check the URL (postgresql://USER@HOST:PORT/DBNAME), that the server runs and the "
                             "database exists (createdb DBNAME)") from exc
        if readonly:
            with self.phase("open"):
                self.execute("SET default_transaction_read_only = on")

    def reason(self, exc: Exception) -> str:
        """The server's own one-line message (its text goes on with the statement and a caret), else the
        client's (a lost connection)."""
        return getattr(getattr(exc, "diag", None), "message_primary", None) or message_line(exc)

    @staticmethod
    def _sql(sql: str) -> str:
        return sql.replace("%", "%%").replace("?", "%s")

    def _execute(self, sql: str, params: Any) -> Any:
        return self.db.execute(self._sql(sql), params)

    def dicts(self, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        """All rows as plain dicts."""
        from psycopg.rows import dict_row

        with self.translated(), self.db.cursor(row_factory=dict_row) as cursor:
            cursor.execute(self._sql(sql), params)
            return cursor.fetchall()

    def tuples(self, sql: str, params: Any = ()) -> list[tuple]:
        """All rows as plain tuples."""
        from psycopg.rows import tuple_row

        with self.translated(), self.db.cursor(row_factory=tuple_row) as cursor:
            cursor.execute(self._sql(sql), params)
            return cursor.fetchall()

    def executemany(self, sql: str, rows: list) -> None:
        with self.translated(), self.db.cursor() as cursor:
            cursor.executemany(self._sql(sql), rows)

    @contextmanager
    def transaction(self, migrating: bool = False) -> Iterator["PostgresBackend"]:
        # the commit (or rollback) happens inside ``translated``: a failing commit is a StoreError too
        with self.phase("upgrade" if migrating else "write"), self.translated(), self.db.transaction():
            if migrating:  # two farms opening a new database at once: one creates the tables
                self.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
            yield self

    def table_exists(self, name: str) -> bool:
        return self.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() "
                            "AND table_name = ?", (name,)).fetchone() is not None

    def ddl(self, statement: str) -> str:
        return postgres_ddl(statement)

    def close(self) -> None:
        self.db.close()
