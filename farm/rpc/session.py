"""Request an RPC session for a key, with a deadline TVM's own client lacks."""

from __future__ import annotations

import logging
import socket
import time

from tvm import rpc
from tvm.rpc import base

from farm.errors import DeviceLost, DeviceUnavailable, TrackerError
from farm.records import TrackerAddress
from farm.rpc.tracker import open_tracker_socket

log = logging.getLogger(__name__)


def request_session(
    tracker: TrackerAddress,
    key: str,
    timeout_s: float,
    session_timeout_s: float = 0.0,
    priority: int = 1,
) -> rpc.RPCSession:
    """Ask the tracker for a free server under ``key``; give up after ``timeout_s``.

    On timeout the request's socket is closed, so the tracker drops the request
    instead of handing the next free server to nobody.
    """
    deadline = time.monotonic() + timeout_s
    sock = open_tracker_socket(tracker, timeout_s=max(timeout_s, 0.1))
    try:
        base.sendjson(sock, [base.TrackerCode.REQUEST, key, "", priority])
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            reply = base.recvjson(sock)
        except (socket.timeout, TimeoutError) as exc:
            raise DeviceUnavailable(
                f"no free device for key {key!r} after {timeout_s:g} s",
                f"check `farm devices` (is a server registered under {key!r} at {tracker}?) or raise --timeout",
            ) from exc
        except (OSError, RuntimeError) as exc:
            raise TrackerError(f"tracker at {tracker} dropped the request for {key!r}: {exc}", "check `farm tracker status`") from exc
    finally:
        sock.close()
    if reply[0] != base.TrackerCode.SUCCESS:
        raise TrackerError(f"tracker refused the request for {key!r}: {reply}", "check `farm tracker status`")
    host, port, matchkey = reply[1]
    try:
        return rpc.connect(host, port, matchkey, session_timeout=session_timeout_s)
    except Exception as exc:  # TVM raises bare RuntimeError/TVMError here
        raise DeviceLost(
            f"server for {key!r} at {host}:{port} was assigned but refused the connection: {exc}",
            "the server may have died; check `farm devices` and the server log",
        ) from exc
