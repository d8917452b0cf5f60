"""A lab worker's hold on its devices (#50): one lease per running cell, renewed by a thread of its own.

Why a lease and not only procrastinate's lock per device: a job whose worker is silent for ``lab.jobs.STALLED_S`` is
handed to another worker, but a silent worker is not always a dead one. One that froze (SIGSTOP, a paused VM, a
swap storm) wakes still holding its RPC session and finishes its measurement, and a worker whose event loop missed
its heartbeats still measures. The lease (``store.leases``) makes the device's holder known and fenced:

- a cell takes its device's lease before it reads whether the cell is done, and keeps it to its last write;
- this module's thread renews every lease its worker holds each ``RENEW_S``. A thread, not the event loop that beats
  procrastinate's heartbeats: a long synchronous call in a job does not stop it, and a frozen process stops it;
- a lease not renewed for ``LEASE_S`` (by the database's clock) may be taken by the cell's next holder, under the
  next epoch. That holder then waits for the device's RPC session as long as the old holder's session may last (the
  server ends it after the device's ``session_timeout_s``), so it never stores "no free device" because its own
  earlier run still holds the device;
- the old holder's results are refused at their write (``Store.record_cell``: ``LeaseLost``), with a log line.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Callable, Iterator

from farm.errors import DeviceUnavailable, StoreError
from farm.lab.jobs import HEARTBEAT_S, STALLED_S
from farm.records import Device, Lease
from farm.store import Store, shared_store

log = logging.getLogger("farm.sweep.leases")  # the name its warnings have always carried

# a holder silent this long loses its device: longer than procrastinate's stall (a redelivered job is started
# STALLED_S after the last heartbeat at the earliest, then waits at most 2 beats more), so a worker that only
# missed some beats keeps its device
LEASE_S = STALLED_S + 2 * HEARTBEAT_S
RENEW_S = HEARTBEAT_S  # six renewals a lease: one lost write does not lose it
LEASE_POLL_S = 1.0  # how often a cell asks again for a device another holder has
# the longest a cell waits for a device whose holder keeps renewing its lease (a cell's own bounds end it sooner:
# its session timeout, the tuning budget); past it the job fails and the cell is left for --resume, never stored
LEASE_WAIT_S = 4 * 3600.0


class LeaseKeeper:
    """The leases one worker process holds, and the thread that renews them (on the worker's shared store)."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self._held: dict[tuple[str, int], Lease] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextmanager
    def hold(self, store: Store, device: str, holder: str,
             say: Callable[[str], None] | None = None) -> Iterator[Lease]:
        """The device's lease for ``holder`` while the block runs, renewed meanwhile, released after (waited for
        while another holder renews it: ``take``)."""
        lease = take(store, device, holder, say)
        with self._lock:
            self._held[(lease.device, lease.epoch)] = lease
            if self._thread is None:
                self._thread = threading.Thread(target=self._renew, name="farm-leases", daemon=True)
                self._thread.start()
        try:
            yield lease
        finally:
            with self._lock:
                self._held.pop((lease.device, lease.epoch), None)
            store.release_lease(lease)

    def _renew(self) -> None:
        while True:
            time.sleep(RENEW_S)
            with self._lock:
                held = list(self._held.values())
            for lease in held:
                try:
                    renewed = shared_store(self.db_url).renew_lease(lease, LEASE_S)
                    with self._lock:
                        released = (lease.device, lease.epoch) not in self._held  # its cell ended meanwhile
                    if not renewed and not released:
                        log.error("%s lost device %s's lease (epoch %d): another holder took it after it was not "
                                  "renewed for %g s; what it measures now will be refused", lease.holder, lease.device,
                                  lease.epoch, LEASE_S)
                        with self._lock:
                            self._held.pop((lease.device, lease.epoch), None)
                except StoreError as exc:
                    log.warning("could not renew device %s's lease: %s", lease.device, exc.message)


def take(store: Store, device: str, holder: str, say: Callable[[str], None] | None = None) -> Lease:
    """The device's lease, once it is free: released, or not renewed for ``LEASE_S`` (its holder froze or died: the
    new lease says whom it was taken from). ``DeviceUnavailable`` after ``LEASE_WAIT_S`` of a holder renewing it."""
    deadline, told = time.monotonic() + LEASE_WAIT_S, False
    while True:
        lease = store.take_lease(device, holder, LEASE_S)
        if lease is not None:
            if lease.taken_over:
                log.warning("%s took device %s's lease from %s, which did not renew it for %g s (frozen or gone); "
                            "its results are refused from now on", holder, device, lease.previous, LEASE_S)
            return lease
        held = store.lease_holder(device)
        if not told and held is not None and say:
            say(f"device {device} is held by {held[0]} (its lease ends in {max(held[2], 0):.0f} s unless renewed): "
                "waiting")
            told = True
        if time.monotonic() >= deadline:
            raise DeviceUnavailable(f"device {device} stayed held by {held[0] if held else 'another cell'} for "
                                    f"{LEASE_WAIT_S:g} s", "see farm worker --status; the cell is left for "
                                    "farm sweep --resume")
        time.sleep(LEASE_POLL_S)


def device_holds(db: str, store: Store, holder: str,
                 say: Callable[[str], None] | None = None) -> Callable[[Device], AbstractContextManager[object]]:
    """What a rerun outside a lab worker (``farm sweep --confirm``, ``farm regressions --confirm``) holds a device
    with while it measures (``night.confirmation.DeviceHold``): its lease, where its lab's workers share it (a device with
    a ``lab_host``, on the lab's PostgreSQL), so it never measures beside their cells (#61); nothing elsewhere."""
    from farm.store.locations import is_url

    def hold(device: Device) -> AbstractContextManager[object]:
        if not (device.lab_host and is_url(db)):
            return nullcontext()
        return LeaseKeeper(db).hold(store, device.name, f"{holder} ({device.name})", say)

    return hold
