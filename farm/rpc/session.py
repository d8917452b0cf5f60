"""Request an RPC session for a key, with a deadline TVM's own client lacks."""

from __future__ import annotations

import logging
import socket
import threading
import time
import weakref

from tvm import rpc

from farm.errors import DeviceLost, DeviceUnavailable, TrackerError, message_line
from farm.records import TrackerAddress
from farm.rpc.tracker import TrackerCode, open_tracker_socket, recvjson, sendjson

log = logging.getLogger(__name__)

# TVM's client holds at most 32 RPC sessions per process (RPCSessTable::kMaxRPCSession); the 33rd fails with
# "maximum number of RPC session reached". A sweep runs one worker per device, so over 32 devices farm would
# hit it: a process holds at most SESSION_SLOTS sessions, and a request waits for a slot first. A slot is
# freed when its session object is (weakref.finalize), which is when TVM frees the table entry.
SESSION_SLOTS = 24
SLOT_WAIT_S = 3600.0  # a slot frees when another session of this process ends: each is bounded by its own timeout
_slots = threading.BoundedSemaphore(SESSION_SLOTS)


def request_session(
    tracker: TrackerAddress,
    key: str,
    timeout_s: float,
    session_timeout_s: float = 0.0,
    priority: int = 1,
) -> rpc.RPCSession:
    """Ask the tracker for a free server under ``key``; give up after ``timeout_s``.

    On timeout the request's socket is closed, so the tracker drops the request
    instead of handing the next free server to nobody. Waits for one of this process's
    ``SESSION_SLOTS`` first (TVM's limit of 32 sessions per process).
    """
    if not _slots.acquire(timeout=SLOT_WAIT_S):
        raise DeviceUnavailable(f"this farm process had all {SESSION_SLOTS} of its RPC sessions in use for "
                                f"{SLOT_WAIT_S:g} s", "a session is stuck: see the device logs; run fewer devices at once")
    try:
        session = _request(tracker, key, timeout_s, session_timeout_s, priority)
    except BaseException:
        _slots.release()
        raise
    weakref.finalize(session, _slots.release)
    return session


def _request(tracker: TrackerAddress, key: str, timeout_s: float, session_timeout_s: float,
             priority: int) -> rpc.RPCSession:
    deadline = time.monotonic() + timeout_s
    sock = open_tracker_socket(tracker, timeout_s=max(timeout_s, 0.1))
    try:
        sendjson(sock, [TrackerCode.REQUEST, key, "", priority])
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            reply = recvjson(sock)
        except (socket.timeout, TimeoutError) as exc:
            raise DeviceUnavailable(
                f"no free device for key {key!r} after {timeout_s:g} s",
                f"check `farm devices` (is a server registered under {key!r} at {tracker}?) or raise --timeout",
            ) from exc
        except (OSError, RuntimeError) as exc:
            raise TrackerError(f"tracker at {tracker} dropped the request for {key!r}: {exc}",
                               "check `farm tracker status`") from exc
    finally:
        sock.close()
    if reply[0] != TrackerCode.SUCCESS:
        raise TrackerError(f"tracker refused the request for {key!r}: {reply}", "check `farm tracker status`")
    host, port, matchkey = reply[1]
    try:
        return rpc.connect(host, port, matchkey, session_timeout=session_timeout_s)
    except Exception as exc:  # TVM raises bare RuntimeError/TVMError here
        raise DeviceLost(
            f"server for {key!r} at {host}:{port} was assigned but refused the connection: {message_line(exc)}",
            "the server may have died; check `farm devices` and the server log",
        ) from exc
