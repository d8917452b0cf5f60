"""Device leases (#50): which lab cell holds each device, fenced by an epoch, on the database's own clock.

A lab's job can run twice at once: a worker that froze (SIGSTOP, a paused VM, a long pause) has its job handed to
another worker after ``lab.jobs.STALLED_S``, and wakes later still measuring. procrastinate's lock per device cannot
tell them apart, so a cell holds its device by a lease: taken when free, released, or silent for its ``lease_s``
(the holder renews it: ``lab.leases.LeaseKeeper``); each new holder gets the next epoch. ``record_cell``
stores a result only in the transaction that finds the holder's epoch still current, so what a holder measured after
it lost the device is refused (``LeaseLost``), never stored beside or over the new holder's.
"""

from __future__ import annotations

from farm.errors import LeaseLost
from farm.records import Lease
from farm.store.backends import Backend, now, retried


class LeasesMixin:
    """The ``Store``'s device leases."""

    _db: Backend

    @retried
    def take_lease(self, device: str, holder: str, lease_s: float) -> Lease | None:
        """The device's lease for ``holder`` for ``lease_s``, if it is free (never taken, released, or expired
        by the database's clock); else None (another holder renews it)."""
        clock = self._db.clock_s
        with self._db.transaction() as db:
            rows = db.execute(
                f"""INSERT INTO device_leases (device, holder, epoch, expires_s, released, previous, taken_at)
                    VALUES (?, ?, 1, {clock} + ?, 0, '', ?)
                    ON CONFLICT (device) DO UPDATE SET holder = excluded.holder, epoch = device_leases.epoch + 1,
                      expires_s = excluded.expires_s, taken_at = excluded.taken_at, released = 0,
                      previous = CASE WHEN device_leases.released = 0 THEN device_leases.holder ELSE '' END
                    WHERE device_leases.released = 1 OR device_leases.expires_s < {clock}
                    RETURNING epoch, previous""", (device, holder, lease_s, now())).fetchall()
        return Lease(device, holder, int(rows[0][0]), rows[0][1]) if rows else None

    @retried
    def renew_lease(self, lease: Lease, lease_s: float) -> bool:
        """Extend the lease ``lease_s`` from now; False when it is no longer this holder's (taken over)."""
        with self._db.transaction() as db:
            return db.execute(f"UPDATE device_leases SET expires_s = {self._db.clock_s} + ? WHERE device = ? AND "
                              "epoch = ? AND holder = ? AND released = 0",
                              (lease_s, lease.device, lease.epoch, lease.holder)).rowcount == 1

    @retried
    def release_lease(self, lease: Lease) -> None:
        with self._db.transaction() as db:
            db.execute("UPDATE device_leases SET released = 1 WHERE device = ? AND epoch = ? AND holder = ?",
                       (lease.device, lease.epoch, lease.holder))

    def lease_holder(self, device: str) -> tuple[str, int, float] | None:
        """Who holds the device's unreleased lease: (holder, epoch, seconds until it expires: negative when
        expired); None when nobody does."""
        row = self._db.execute(f"SELECT holder, epoch, expires_s - {self._db.clock_s} FROM device_leases WHERE "
                               "device = ? AND released = 0", (device,)).fetchone()
        return None if row is None else (row[0], int(row[1]), float(row[2]))

    def _check_lease(self, db: Backend, lease: Lease) -> None:
        """Inside a write: the lease is still ``lease``'s epoch (its row held to the commit), else ``LeaseLost``."""
        row = db.execute(f"SELECT holder, epoch, released FROM device_leases WHERE device = ?{db.lock_row}",
                         (lease.device,)).fetchone()
        # the epoch and the holder: after a failover that lost an epoch's bump, the next holder may get the same
        # epoch number again (#61); the holder names the worker, its job's thread and the cell
        if row is None or int(row[1]) != lease.epoch or row[0] != lease.holder or int(row[2]):
            now_held = "nobody" if row is None or int(row[2]) else f"{row[0]} (epoch {row[1]})"
            raise LeaseLost(f"{lease.holder} lost device {lease.device}'s lease (epoch {lease.epoch}) while it measured; "
                            f"it is now {now_held}'s: its result is refused, not stored",
                            "nothing is lost: the cell's job runs on its new holder (a worker that froze past "
                            "the lease, or lost the database, gives its device up)")
