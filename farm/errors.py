"""The one tree of errors farm raises. Only ``cli.py`` catches them.

::

    FarmError                 every error carries a message and a hint (what to do next)
    ├─ InventoryError         bad devices.toml (file, device, field, what to write instead)
    ├─ TrackerError           tracker unreachable, not a TVM tracker, or failed to start
    ├─ DeviceError
    │  ├─ DeviceUnavailable   no free server for a key within the timeout
    │  └─ DeviceLost          dropped mid-session
    ├─ ModelError             missing, corrupt or unsupported model file
    ├─ BuildError             TVM could not compile or export for a target
    ├─ MeasurementError       a measurement step failed on the device
    └─ StoreError             the results database cannot be opened or written
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


class ModelError(FarmError):
    """A model file is missing, corrupt, or cannot be imported."""


class BuildError(FarmError):
    """Compiling or exporting a model for a target failed."""


class MeasurementError(FarmError):
    """A measurement step failed on the device."""


class StoreError(FarmError):
    """The results database cannot be opened, migrated or written."""


def first_line(exc: BaseException, limit: int = 400) -> str:
    """The most telling line of a third-party error (TVM puts the message last)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:limit]
