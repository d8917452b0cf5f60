"""The lab's signature on what one host hands another to run (#62).

A lab's hosts share one PostgreSQL, and every host that queues work may write it. A library's sha256 beside it in
the same database catches damage, not tampering: whoever can write the row can write both. So what a build worker
stores for the others to load (``compile.artifact_file``) is signed with the lab's key, an HMAC-SHA256 secret that
lives in each host's own file (``KEY_ENV``, else ``DEFAULT_KEY_FILE``), never in the database; a host loads a
library from the lab's store only when the signature verifies with its key, else it compiles the model itself.
Whoever holds the key file can sign: give it only to the lab's hosts (mode 600).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

KEY_ENV = "FARM_LAB_KEY_FILE"  # the lab key's file on this host
DEFAULT_KEY_FILE = Path("~/.config/farm/lab.key")
SIGNATURE = "signature"  # the metadata field that carries it
MIN_KEY_BYTES = 16


def key_file() -> Path:
    return Path(os.environ.get(KEY_ENV) or DEFAULT_KEY_FILE).expanduser()


def lab_key() -> bytes | None:
    """This host's lab key (the file's bytes, surrounding whitespace removed); None where there is none, or it is
    too short to be a secret (``MIN_KEY_BYTES``)."""
    try:
        key = key_file().read_bytes().strip()
    except OSError:
        return None
    return key if len(key) >= MIN_KEY_BYTES else None


def _message(meta: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in meta.items() if k != SIGNATURE}, sort_keys=True, default=str).encode()


def sign(key: bytes, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with its signature: every field of it (the file's sha256, the key it is stored under, its target,
    who built it) signed together."""
    return {**meta, SIGNATURE: hmac.new(key, _message(meta), hashlib.sha256).hexdigest()}


def unsigned_reason(key: bytes | None, meta: dict[str, Any]) -> str:
    """Why ``meta`` is not to be trusted on this host ('' when its signature verifies with ``key``)."""
    if key is None:
        return (f"this host has no lab key ({KEY_ENV}, else {DEFAULT_KEY_FILE}): it runs no library another host "
                "stored")
    signature = meta.get(SIGNATURE)
    if not isinstance(signature, str):
        return "it carries no signature of the lab's key"
    if not hmac.compare_digest(signature.encode("utf-8", "replace"),
                               hmac.new(key, _message(meta), hashlib.sha256).hexdigest().encode()):
        return "its signature does not verify with this host's lab key (written by someone without the key)"
    return ""
