"""Who may register a server with the tracker (#62): TVM's RPC has no authentication, so on a lab's network anyone
could register a server under a device's key, and the timings farm stored would be that server's.

Where the inventory names each lab host's address (``[tracker] lab_hosts = { lab1 = "10.0.0.5" }``), farm's
tracker takes a key's registration only from where that key's servers run (``devices.registrations``): a device
with a ``lab_host``, that host's address; a board reached over ssh (its kind's ``registers_from``: ``server_host``,
else its ssh host), its own address; any other device, the tracker's own host (its servers are this host's
processes). Every other registration is refused: its connection closed, a line in the tracker's log. A lab also
binds the tracker to its own network (``[tracker] host``), never a public one.
"""

from __future__ import annotations


def refusal(allowed: dict[str, list[str]], key: str, peer: str, claimed: str | None) -> str:
    """Why a registration of ``key`` from ``peer`` (claiming the address ``claimed``) is refused ('' when it is
    taken)."""
    sources = allowed.get(key)
    if sources is None:
        return f"key {key!r} is no device's in the inventory"
    if peer not in sources:
        return f"key {key!r} registers only from {', '.join(sources)}"
    if claimed not in (None, peer) and claimed not in sources:
        return f"it claims the address {claimed}, not one of {', '.join(sources)}"
    return ""
