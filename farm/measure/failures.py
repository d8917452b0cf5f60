"""How a failed step is told: the reason (TVM's message line and the driver's own error lines), the hint, and
whether it is farm's own bug (stored as step "farm") rather than the device's failure."""

from __future__ import annotations

import os

import farm
from farm.errors import message_line

# What OpenCL drivers and TVM's OpenCL runtime say when a device has no usable OpenCL (no libOpenCL.so, no ICD,
# no GPU) or cannot build a kernel; the hint says what it means for the user.
NO_PLATFORM = ("cannot open libopencl", "cl_platform_not_found", "no opencl platform", "cl_device_not_found",
               "cl_invalid_platform")


class StepFailed(Exception):
    """A step that failed in a way farm knows: the run ends as failed at ``step`` with ``reason`` and ``hint``."""

    def __init__(self, step: str, reason: str, hint: str = "") -> None:
        super().__init__(reason)
        self.step, self.reason, self.hint = step, reason, hint


def raised_in_farm(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by farm's own code (its innermost frame is in the farm package), not by TVM,
    the RPC session or the device: a bug to show, not a device failure to store quietly."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(os.path.dirname(os.path.abspath(farm.__file__)) + os.sep)


def failure_reason(exc: BaseException) -> str:
    """The message line of a device-side error (``errors.message_line``), plus the driver's own error lines when TVM
    quotes a build log."""
    text = str(exc)
    head = message_line(exc)
    driver = [line.strip() for line in text.splitlines()[1:]
              if "error" in line.lower() and "traceback" not in line.lower() and line.strip() not in head][:3]
    return " | ".join([head, *driver]) if driver else head


def device_hint(exc: BaseException, reason: str) -> str:
    """What to do about a device-side failure: a dropped session, a GPU driver's words, else its server's log."""
    if is_connection_error(exc):
        return "the device dropped the session; check `farm devices`"
    return driver_hint(reason) or "see the device's server log; the failure is stored with its reason"


def driver_hint(reason: str) -> str:
    text = reason.lower()
    if any(marker in text for marker in NO_PLATFORM):
        return ("the device has no usable OpenCL platform (no libOpenCL.so, ICD or GPU driver): install its GPU driver, "
                'or set fallback = "cpu" to measure its CPU instead')
    if "cl_build_program_failure" in text:
        return ("the device's OpenCL compiler rejected a kernel (the driver's words are in the reason): the model uses "
                'something this GPU lacks; fallback = "cpu" measures its CPU instead')
    return ""


def is_connection_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    if "error caught from rpc call" in text:  # the device answered with its own error: it is there
        return False
    return isinstance(exc, (ConnectionError, OSError)) or "socket" in text or "connection" in text or "rpc" in text
