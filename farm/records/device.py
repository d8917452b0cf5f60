"""An inventory's records: the tracker's address, a ``Device``, this host's CPU, the ``Inventory``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any



@dataclass(frozen=True)
class TrackerAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def split_address(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` as (host, port); None when it is not one (no host, blanks in it, a port outside 1-65535).
    The one reader of addresses: --tracker, --adb, the inventory's ``adb`` and ``proxy`` fields."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or any(c.isspace() for c in host) or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


@dataclass(frozen=True)
class Device:
    """One inventory entry. ``key`` is its tracker key, everywhere."""

    name: str
    kind: str
    key: str
    target: dict[str, Any]
    host: dict[str, Any] | None = None
    export: str = "so"
    cooldown_s: float = 0.0
    session_timeout_s: float = 600.0
    emulated: bool = False
    tags: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    threads: int | None = None  # devices.toml's ``threads``: TVM's CPU threads on the device (``threads_setting``)
    # devices.toml's ``weight_prepack``; None: the default for the target (``weight_prepack_setting``)
    weight_prepack: bool | None = None
    # devices.toml's ``layout``; None: the default for the target (``layout_setting``)
    layout: str | None = None
    lab_host: str | None = None  # devices.toml's ``lab_host``: the host it is attached to, whose ``farm worker`` serves it


@dataclass(frozen=True)
class HostCPU:
    """This host's CPU as a device kind's target rules need it: LLVM's name for it (None when LLVM does not
    know it) and its core count."""

    cpu: str | None
    cores: int


@dataclass(frozen=True)
class Inventory:
    path: str
    tracker: TrackerAddress
    devices: dict[str, Device]
    db: str | None = None  # [store] db: the results database shared by the farm's hosts
    # [tracker] lab_hosts: each lab host's address; when given, the tracker takes registrations only from where
    # each key's server runs (``rpc.registrations``: a rogue server cannot register under a device's key)
    lab_hosts: dict[str, str] | None = None
    dashboard_url: str | None = None  # [dashboard] url: where the lab's farm dashboard is read (digests link to it)
    triage_token_file: str | None = None  # [dashboard] token_file: the lab's triage token (FARM_TRIAGE_TOKEN overrides)
    notify_url: str | None = None  # [notify] url: the webhook a night's digest is POSTed to when it has new findings
