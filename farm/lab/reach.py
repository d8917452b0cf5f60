"""Reaching the lab queue's database: ``patient``, a ``LabQueue`` call run again whole through an outage (the
store's one reconnect rule, ``store.backends.Outage``), ``connection_lost``, and the URL as farm shows it."""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, TypeVar

from farm.errors import ConnectionLost, StoreError, message_line

log = logging.getLogger("farm.queue")  # the name its warnings have always carried
T = TypeVar("T")


def patient(method: Callable[..., T]) -> Callable[..., T]:
    """A ``LabQueue`` call that reads or writes the queue: run again whole while the database is unreachable (a
    restart, a failover) for up to the store's ``RECONNECT_S``, then a ``ConnectionLost``; any other driver error
    becomes a ``StoreError`` with a hint (#50: a follower ended with "unexpected AdminShutdown"). Each call is
    safe to run twice: reads, cancels of waiting jobs, and defers under their queueing locks. A process that never
    reached the database fails at once (a wrong URL, a server down: a command says so, it does not wait a minute)."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> T:
        import psycopg

        from farm.store.backends import RECONNECT_S, Outage, backend_hint

        errors = (psycopg.Error, self._procrastinate.exceptions.ConnectorException)

        def cause_of(exc: BaseException) -> BaseException:  # procrastinate's error wraps the driver's
            return exc.__cause__ if not isinstance(exc, psycopg.Error) and exc.__cause__ is not None else exc

        def attempt() -> T:
            done = method(self, *args, **kwargs)
            ANSWERED.add(self.url)
            return done

        def lost(exc: Exception) -> bool:  # a process that never reached the database does not wait for it
            return isinstance(exc, errors) and connection_lost(cause_of(exc)) and self.url in ANSWERED

        def said(exc: Exception) -> None:
            log.warning("the lab's queue at %s: %s: trying again", redacted(self.url), message_line(cause_of(exc)))

        try:
            return Outage().outlast(attempt, lost, said)
        except errors as exc:
            cause = cause_of(exc)
            if not connection_lost(cause):
                raise StoreError(f"the lab's queue at {redacted(self.url)} failed: {message_line(exc)}",
                                 backend_hint(exc, "check the PostgreSQL server and its log")) from exc
            if self.url not in ANSWERED:
                raise StoreError(f"cannot connect to the lab's queue at {redacted(self.url)}: {message_line(cause)}",
                                 "check that the PostgreSQL server runs (the lab's queue is on the results "
                                 "database)") from exc
            raise ConnectionLost(f"the lab's queue at {redacted(self.url)} did not answer for {RECONNECT_S:g} s:"
                                 f" {message_line(cause)}", backend_hint(cause)) from exc

    return call


def connection_lost(cause: BaseException | None) -> bool:
    """Whether a driver error means the database is gone for now: the connection's (``OperationalError``: a restart,
    a reset), or a write refused by a server answering read-only (a standby during a failover, #61), both waited
    through as ``patient`` says."""
    import psycopg

    return isinstance(cause, (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction))


ANSWERED: set[str] = set()  # the databases this process reached once: a lost one is waited for (``patient``)


def queue_installed(db) -> bool:
    """Whether procrastinate's tables are on this database (a queue nothing was deferred to yet has none)."""
    return db.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()[0] is not None


def redacted(url: str) -> str:
    from farm.store.locations import redact

    return redact(url)
