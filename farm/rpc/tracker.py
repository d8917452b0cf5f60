"""Talk to a TVM RPC tracker with bounded waits, without importing TVM.

TVM's ``TrackerSession`` retries connects for 60 s and blocks forever on requests;
farm speaks the same wire protocol (magic 0x2F271, ``[int32 len][json]`` frames, the codes
of ``tvm.rpc.base.TrackerCode``) on its own socket so every wait has a deadline. Importing
TVM takes seconds; `farm devices` over 100 devices needs none of it.
"""

from __future__ import annotations

import enum
import json
import socket
import struct
import time
from dataclasses import dataclass
from typing import Callable

from farm.errors import DeviceError, TrackerError
from farm.records import TrackerAddress


RPC_TRACKER_MAGIC = 0x2F271  # tvm.rpc.RPC_TRACKER_MAGIC


class TrackerCode(enum.IntEnum):  # tvm.rpc.base.TrackerCode
    FAIL = -1
    SUCCESS = 0
    PING = 1
    STOP = 2
    PUT = 3
    REQUEST = 4
    UPDATE_INFO = 5
    SUMMARY = 6
    GET_PENDING_MATCHKEYS = 7


def recvall(sock: socket.socket, nbytes: int) -> bytes:
    chunks, got = [], 0
    while got < nbytes:
        chunk = sock.recv(min(nbytes - got, 65536))
        if not chunk:
            raise OSError("connection reset")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def sendjson(sock: socket.socket, value) -> None:
    data = json.dumps(value).encode("utf-8")
    sock.sendall(struct.pack("<i", len(data)) + data)


def recvjson(sock: socket.socket):
    size = struct.unpack("<i", recvall(sock, 4))[0]
    return json.loads(recvall(sock, size).decode("utf-8"))


@dataclass(frozen=True)
class KeyStatus:
    key: str
    servers: int  # registered servers (busy or free)
    free: int
    pending: int  # requests waiting for this key


def key_state(status: KeyStatus | None) -> str:
    """A key's state from the tracker's summary: online (a free server), busy (servers, none free) or missing (no
    server; ``None``: the summary does not list the key). The one rule: `farm devices` and the dashboard."""
    if status is None:
        return "missing"
    return "online" if status.free else ("busy" if status.servers else "missing")


@dataclass(frozen=True)
class TrackerSummary:
    keys: dict[str, KeyStatus]
    servers: tuple[tuple[str, str, int], ...]  # (key, host, port)


def open_tracker_socket(tracker: TrackerAddress, timeout_s: float) -> socket.socket:
    """Connect and handshake; the socket keeps ``timeout_s`` for later reads."""
    try:
        sock = socket.create_connection((tracker.host, tracker.port), timeout=timeout_s)
    except OSError as exc:
        raise TrackerError(
            f"cannot reach the RPC tracker at {tracker}: {exc.strerror or exc}",
            "start one with `farm tracker start`, or fix [tracker] in devices.toml",
        ) from exc
    try:
        sock.sendall(struct.pack("<i", RPC_TRACKER_MAGIC))
        magic = struct.unpack("<i", recvall(sock, 4))[0]
    except (OSError, RuntimeError) as exc:
        sock.close()
        raise TrackerError(
            f"{tracker} did not answer as a TVM RPC tracker ({exc})",
            "check [tracker] port in devices.toml: something else listens there",
        ) from exc
    if magic != RPC_TRACKER_MAGIC:
        sock.close()
        raise TrackerError(f"{tracker} is not a TVM RPC tracker", "check [tracker] port in devices.toml")
    return sock


def query_summary(tracker: TrackerAddress, timeout_s: float = 5.0) -> TrackerSummary:
    sock = open_tracker_socket(tracker, timeout_s)
    try:
        sendjson(sock, [TrackerCode.SUMMARY])
        reply = recvjson(sock)
    except (OSError, RuntimeError, ValueError) as exc:
        raise TrackerError(f"tracker at {tracker} did not answer a summary: {exc}", "check `farm tracker status`") from exc
    finally:
        sock.close()
    if reply[0] != TrackerCode.SUCCESS:
        raise TrackerError(f"tracker at {tracker} refused a summary: {reply}", "check `farm tracker status`")
    return parse_summary(reply[1])


def parse_summary(raw: dict) -> TrackerSummary:
    servers = []
    counts: dict[str, int] = {}
    for item in raw.get("server_info", []):
        name = item["key"].split(":", 1)[1] if ":" in item["key"] else item["key"]  # "server:KEY"
        if name.startswith("proxy[") and name.endswith("]"):  # "server:proxy[k1,k2]": a proxy relaying iOS apps
            server_keys = [k for k in name[6:-1].split(",") if k]
        else:
            server_keys = [name]
        host, port = item["addr"][0], int(item["addr"][1])
        for key in server_keys:
            servers.append((key, str(host), port))
            counts[key] = counts.get(key, 0) + 1
    keys: dict[str, KeyStatus] = {}
    for key, info in raw.get("queue_info", {}).items():
        # a server the queue lists as free is registered even before its UPDATE_INFO reached server_info (a proxy's
        # app, just connected): never fewer servers than free ones
        free = int(info["free"])
        keys[key] = KeyStatus(key, max(counts.get(key, 0), free), free, int(info["pending"]))
    for key, n in counts.items():
        keys.setdefault(key, KeyStatus(key, n, 0, 0))
    return TrackerSummary(keys=keys, servers=tuple(sorted(servers)))


def wait_for_tracker(tracker: TrackerAddress, timeout_s: float) -> TrackerSummary:
    """Poll until the tracker answers a summary (it was just started)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return query_summary(tracker, timeout_s=2.0)
        except TrackerError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def wait_for_servers(tracker: TrackerAddress, counts: dict[str, int], timeout_s: float,
                     give_up: Callable[[set[str]], None] | None = None) -> TrackerSummary:
    """Poll the summary until each key has at least ``counts[key]`` free servers. ``give_up`` is shown the keys
    still missing at each poll and raises to end the wait at once (``launch.exited_at_start``: a server that
    exited will not register, however long the wait)."""
    deadline = time.monotonic() + timeout_s
    while True:
        summary = query_summary(tracker)
        missing = {k: n for k, n in counts.items() if summary.keys.get(k, KeyStatus(k, 0, 0, 0)).free < n}
        if not missing:
            return summary
        if give_up is not None:
            give_up(set(missing))
        if time.monotonic() > deadline:
            raise DeviceError(
                f"servers for {', '.join(sorted(missing))} did not register with {tracker} within {timeout_s:.0f} s",
                "look at the server logs that `farm serve` prints",
            )
        time.sleep(0.1)
