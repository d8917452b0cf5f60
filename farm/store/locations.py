"""Where the results are, as farm names and shows it: a file or a PostgreSQL URL (``is_url``, ``exists``,
``require_server``), the URL without its password (``redact``, ``url_secrets``), what farm's connections call
themselves (``application_name``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from farm.errors import StoreError


URL_PREFIXES = ("postgresql://", "postgres://")


def is_url(location: str | Path) -> bool:
    return str(location).startswith(URL_PREFIXES)


def application_name() -> str:
    """What each of farm's PostgreSQL connections calls itself (pg_stat_activity's ``application_name``): the
    process's id, so an operator (and a test) sees which process holds which connections."""
    return f"farm:{os.getpid()}"


def require_server(location: str | Path, what: str) -> None:
    """``what`` (a lab's queue, its workers, a queued sweep's status) lives on the lab's PostgreSQL: a ``StoreError``
    for a file. The one place this rule is written (#50: it was written three times)."""
    if not is_url(location):
        raise StoreError(f"{what} needs the lab's PostgreSQL database, not the file {location}",
                         "pass --db postgresql://USER@HOST:PORT/DBNAME (or set [store] db in devices.toml)")


# a password in a database URL: in its user part (postgresql://farm:PASSWORD@host), or as a parameter
# (postgresql://farm@host/db?password=PASSWORD; sslpassword for a client key's)
URL_PASSWORD = re.compile(r"(://[^:/@?\s]+):([^@/\s]*)@")  # a URL in a line of text ends at white space
PARAMETER_PASSWORD = re.compile(r"([?&](?:ssl)?password=)([^&#\s'\"]*)", re.IGNORECASE)


def redact(location: str) -> str:
    """The location without a password, for messages and reports (#62: ``?password=`` was printed)."""
    return PARAMETER_PASSWORD.sub(r"\1***", URL_PASSWORD.sub(r"\1:***@", location))


# a password this long is written as *** wherever it stands; a shorter one only where it stands in a URL (its user
# part, ?password=): a short one ("farm") would otherwise turn "farm_version" in --json into "***_version"
BARE_SECRET_CHARS = 8


def url_secrets(location: str) -> list[str]:
    """The passwords a database URL carries, as written (what ``cli`` keeps out of everything it prints)."""
    found = [m.group(2) for m in URL_PASSWORD.finditer(location)] + \
        [m.group(2) for m in PARAMETER_PASSWORD.finditer(location)]
    return [secret for secret in found if secret and secret != "***"]


def exists(location: str | Path) -> bool:
    """Whether there can be results there: a server is asked when it is opened."""
    return is_url(location) or Path(location).exists()
