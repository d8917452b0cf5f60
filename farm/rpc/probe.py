"""Health checks: is each device's server there, free, and answering a no-op session?"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from farm.errors import DeviceUnavailable, FarmError, message_line
from farm.records import Device, TrackerAddress
from farm.rpc.session import SESSION_SLOTS, request_session
from farm.rpc.tracker import KeyStatus, TrackerSummary


@dataclass(frozen=True)
class Probe:
    device: str
    key: str
    state: str  # online | busy | missing | unreachable
    reason: str
    latency_s: float | None  # request + no-op round trip, when online
    at: float  # time.time() of the probe


def probe_device(tracker: TrackerAddress, device: Device, summary: TrackerSummary, timeout_s: float) -> Probe:
    status = summary.keys.get(device.key, KeyStatus(device.key, 0, 0, 0))
    now = time.time()
    if status.servers == 0:
        return Probe(device.name, device.key, "missing", f"no server registered under key {device.key!r}", None, now)
    start = time.perf_counter()
    try:
        session = request_session(tracker, device.key, timeout_s, session_timeout_s=max(timeout_s, 5.0))
        if not session.cpu(0).exist:
            return Probe(device.name, device.key, "unreachable", "the server answered but has no CPU device", None, now)
        return Probe(device.name, device.key, "online", "", time.perf_counter() - start, now)
    except DeviceUnavailable:
        return Probe(device.name, device.key, "busy", f"all {status.servers} server(s) stayed busy for {timeout_s:g} s",
                     None, now)
    except FarmError as exc:
        return Probe(device.name, device.key, "unreachable", exc.message, None, now)
    except Exception as exc:  # the session broke after connecting
        return Probe(device.name, device.key, "unreachable", f"session failed: {message_line(exc, 300)}", None, now)


def probe_all(tracker: TrackerAddress, devices: list[Device], summary: TrackerSummary, timeout_s: float) -> list[Probe]:
    """Probe every device at once, so the whole check takes about one timeout."""
    if not devices:
        return []
    with ThreadPoolExecutor(max_workers=min(SESSION_SLOTS, len(devices))) as pool:
        return list(pool.map(lambda d: probe_device(tracker, d, summary, timeout_s), devices))
