"""Device kinds, one module each, found by the ``kind`` devices.toml names.

Each kind is a ``DeviceKind`` subclass (``kind.py``) in a module of this package; ``kinds()``
imports the package's modules once and collects them, so adding a kind is adding a module.
``bring_up``, ``unready`` and ``watch`` are what `farm serve` asks of them.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import threading
from pathlib import Path
from typing import Callable

from farm.devices.kind import DeviceKind
from farm.errors import DeviceError, FarmError, InventoryError
from farm.records import Device, Inventory, TrackerAddress
from farm.procs.registry import ManagedProcess, load_records, update_records
from farm.procs.supervise import collect_ended, process_state, stop_process


@functools.cache
def kinds() -> dict[str, DeviceKind]:
    """Every registered kind by name, in the order of their names."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    found: dict[str, DeviceKind] = {}
    pending = list(DeviceKind.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if not cls.name:
            continue  # a base such as ThisHost
        if cls.name in found:
            raise TypeError(f"two device kinds are named {cls.name!r}: {type(found[cls.name]).__name__} and {cls.__name__}")
        found[cls.name] = cls()
    return dict(sorted(found.items()))


def kind_of(device: Device) -> DeviceKind:
    try:
        return kinds()[device.kind]
    except KeyError as exc:
        raise InventoryError(f"device {device.name!r} has kind {device.kind!r}, which farm does not know",
                             f"write kind = one of {', '.join(kinds())}") from exc


def bring_up(device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
    return kind_of(device).bring_up(device, tracker, state_dir)


def can_bring_up(device: Device) -> bool:
    """Whether ``farm serve`` (without --device) starts something for it (e.g. a linux board only with an ssh
    address, a phone only with a serial)."""
    return kind_of(device).unready(device) == ""


def watch(devices: dict[str, Device], tracker: TrackerAddress, state_dir: Path, interval_s: float,
          stop: threading.Event, on_event: Callable[[str], None]) -> int:
    """Restart the servers farm started for ``devices`` whenever one dies, until ``stop`` is set.

    Reads the pid records afresh each round (so `farm down` or another `farm serve` is seen) and
    returns how many restarts it made. A restart replaces the dead server's record under the registry's lock,
    if that record is still there; if it was dropped meanwhile (`farm down`), the restart is stopped again."""
    restarts = 0
    while not stop.is_set():
        records = load_records(state_dir)
        dead = []
        for record in (r for r in records if r.role == "server" and r.name in devices):
            state = process_state(record)
            if state == "gone":
                dead.append(record)
            elif state == "unknown":  # its host did not answer: a restart could leave two servers running
                on_event(f"{record.name}: could not check server pid {record.pid} (its host did not answer); "
                         "checking again next round")
        for record in dead:
            if stop.is_set():
                break
            if record not in load_records(state_dir):  # dropped since (`farm down`): nothing to restart
                continue
            try:
                fresh = bring_up(devices[record.name], tracker, state_dir)
            except FarmError as exc:
                on_event(f"{record.name}: server pid {record.pid} is gone; restart failed: {exc.message} ({exc.hint})")
                continue
            outcome = _replace_record(state_dir, record, fresh)
            if outcome == "replaced":
                restarts += 1
                on_event(f"{record.name}: server pid {record.pid} was gone; restarted as pid {fresh[0].pid}")
            else:
                on_event(f"{record.name}: server pid {record.pid} was gone and its record was dropped meanwhile "
                         f"(`farm down`); its restart, pid {fresh[0].pid}, is {outcome}")
        collect_ended()  # the dead servers this process started: no zombies while it watches
        stop.wait(interval_s)
    return restarts


def _replace_record(state_dir: Path, old: ManagedProcess, fresh: list[ManagedProcess]) -> str:
    """Put ``fresh`` in ``old``'s place ("replaced"); when ``old`` is no longer recorded, stop ``fresh`` instead
    ("stopped"), recording what could not be stopped for `farm down` to try again ("recorded, not stopped")."""
    replaced = False

    def change(current: list[ManagedProcess]) -> list[ManagedProcess]:
        nonlocal replaced
        replaced = old in current
        return [r for r in current if r != old] + fresh if replaced else current

    update_records(state_dir, change)
    if replaced:
        return "replaced"
    unstopped = []
    for record in fresh:
        try:
            stop_process(record)
        except DeviceError:
            unstopped.append(record)
    if unstopped:
        update_records(state_dir, lambda current: current + unstopped)
        return "recorded, not stopped"
    return "stopped"


WATCHDOG_GRACE_S = 30.0  # a watchdog ends after the restart it is making (an adb push, a server start)


def bring_up_devices(inventory: Inventory, names: list[str], tracker: TrackerAddress, state: Path, wait_s: float,
                     say: Callable[[str], None] | None = None) -> tuple[list, list, list]:
    """Start each named device that has no server yet; wait for those that register at start (``farm serve``,
    ``farm worker --serve``). Returns (the records started, every record now kept, [(device name, FarmError)] of
    the devices that could not be brought up); what a person should know goes to ``say``."""
    from farm.procs.registry import load_records, update_records
    from farm.procs.supervise import process_state
    from farm.rpc.launch import exited_at_start
    from farm.rpc.tracker import wait_for_servers

    # the registry is read here and changed after the bring-ups, under its lock, as it is then: others' records
    # (a watchdog's restart, another `farm serve`) stay; only the ones found gone here are dropped, never the
    # "unknown" ones (a host that did not answer): `farm down` tries those again
    states = {r: process_state(r) for r in load_records(state)}
    running = {r.name for r, s in states.items() if r.role == "server" and s != "gone"}
    for r, s in states.items():
        if r.role == "server" and s == "unknown" and r.name in names and say:
            say(f"{r.name}: could not check server pid {r.pid} (its host did not answer); not starting another")
    started: list = []
    failures: list[tuple[str, FarmError]] = []
    for name in names:
        if name in running:
            continue
        try:
            started.extend(bring_up(inventory.devices[name], tracker, state))
        except FarmError as exc:  # one device's failure does not stop the others
            failures.append((name, exc))
    gone = {r for r, s in states.items() if s == "gone"}
    records = update_records(state, lambda current: [r for r in current if r not in gone] + started)
    waiting = {r.key: 1 for r in started if kind_of(inventory.devices[r.name]).registers_at_start}
    wait_for_servers(tracker, waiting, timeout_s=wait_s, give_up=exited_at_start(started, state))
    for r in started:
        if (note := kind_of(inventory.devices[r.name]).started_note(r)) and say:
            say(note)
    return started, records, failures


def stop_roles(state: Path, roles: tuple[str, ...]) -> tuple[list, list]:
    """Stop the recorded processes of each role in turn, the watchdog first so it restarts nothing (``farm down``,
    ``farm serve --stop``). Records are read again before each role: a watchdog that was restarting a server when
    told to stop records that server as it ends. Returns (the records that were running and are stopped,
    [(record, error)] for those that could not be); the records it handled are dropped from the state file but
    for the failed ones, kept for another try. Records added meanwhile by another command (a `farm serve` that ran
    at the same time) are kept: what was started after the stop is still recorded, for the next `farm down`."""
    from farm.procs.registry import load_records, update_records
    from farm.procs.supervise import stop_process

    stopped, failed, handled = [], [], set()
    for role in roles:
        for record in [r for r in load_records(state) if r.role == role]:
            try:
                if stop_process(record, WATCHDOG_GRACE_S if role == "watchdog" else 3.0):
                    stopped.append(record)
                handled.add(record)
            except DeviceError as exc:
                failed.append((record, exc))
    update_records(state, lambda current: [r for r in current if r not in handled])
    return stopped, failed
