"""The one tree of errors farm raises. ``farm/cli`` catches them to end a command (``error:`` and ``hint:`` on
stderr, exit 1); library code catches one only to turn it into a result (a stored failed run, a probe's state, an
alert left "unknown") or to wait and retry: docs/ARCHITECTURE.md lists where, and tests/test_layers.py keeps it so.

::

    FarmError                 every error carries a message and a hint (what to do next)
    ├─ InventoryError         bad devices.toml (file, device, field, what to write instead)
    ├─ TrackerError           tracker unreachable, not a TVM tracker, or failed to start
    ├─ DeviceError
    │  ├─ DeviceUnavailable   no free server for a key within the timeout
    │  ├─ DeviceLost          dropped mid-session
    │  └─ LeaseLost           another holder took the device's lease: this holder's result is refused
    ├─ ModelError             missing, corrupt or unsupported model file
    ├─ BuildError             TVM could not compile or export for a target
    ├─ MeasurementError       a measurement step failed on the device
    └─ StoreError             the results database cannot be opened or written
       └─ ConnectionLost      its server went away (a restart, a failover) and did not come back in time
"""

from __future__ import annotations


class FarmError(Exception):
    """Base of every farm error: ``message`` says what happened, ``hint`` what to do."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class InventoryError(FarmError):
    """devices.toml is missing, malformed, or describes a device wrongly."""


class TrackerError(FarmError):
    """The TVM RPC tracker is unreachable, is not a tracker, or would not start."""


class DeviceError(FarmError):
    """A device could not be brought up or used."""


class DeviceUnavailable(DeviceError):
    """No free server registered under a key within the timeout."""


class DeviceLost(DeviceError):
    """The device's RPC session dropped while farm was using it."""


class LeaseLost(DeviceError):
    """The device's lease passed to another holder (this one froze or lost the database): what it measured since
    is refused, never stored over the new holder's."""


class ModelError(FarmError):
    """A model file is missing, corrupt, or cannot be imported."""


class BuildError(FarmError):
    """Compiling or exporting a model for a target failed."""


class MeasurementError(FarmError):
    """A measurement step failed on the device."""


class StoreError(FarmError):
    """The results database cannot be opened, migrated or written."""


class ConnectionLost(StoreError):
    """The database server dropped the connection (restarted, failed over) and farm could not reconnect within
    its bound (``store.backends.RECONNECT_S``)."""


def message_line(exc: BaseException, limit: int = 400) -> str:
    """The one line of ``exc`` that says what went wrong, for an error message or a stored reason.

    Its first line, where Python, torch, onnx and the database drivers put the message, unless that line only
    introduces what follows (it ends with ':', as TVM's "RPCError: Error caught from RPC call:" and a quoted
    "Traceback (most recent call last):" do): then its last line, where TVM puts the message. The exception's
    type name when it has no text; at most ``limit`` characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__[:limit]
    return (lines[-1] if lines[0].endswith(":") else lines[0])[:limit]


