"""Each tracker key's allowed sources, from the inventory (``farm.rpc.registrations`` says why and applies them in
farm's tracker)."""

from __future__ import annotations

import socket

from farm.devices import kind_of
from farm.records import Inventory

LOOPBACK = "127.0.0.1"


def allowed_sources(inventory: Inventory) -> dict[str, list[str]] | None:
    """Each tracker key's allowed source addresses (None: the inventory names no lab hosts, every registration is
    taken, as TVM's tracker does)."""
    if inventory.lab_hosts is None:
        return None
    here = {LOOPBACK, _resolve(inventory.tracker.host)}
    allowed: dict[str, set[str]] = {}
    for device in inventory.devices.values():
        board = kind_of(device).registers_from(device)
        if board:  # its addresses, and its names as it claims them (a board's server sends --custom-addr)
            sources = {*board, *(_resolve(name) for name in board)}
        elif device.lab_host:
            sources = {_resolve(inventory.lab_hosts[str(device.lab_host)])}
        else:
            sources = here
        allowed.setdefault(device.key, set()).update(sources)
    return {key: sorted(sources) for key, sources in sorted(allowed.items())}


def _resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host
