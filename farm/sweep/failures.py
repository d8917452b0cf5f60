"""The stored result of a cell that failed before anything was measured: its compile failed, farm raised what it
does not expect, or (``run.offline_cell``) its device was offline."""

from __future__ import annotations

from farm.errors import FarmError, message_line
from farm.records import BenchConfig, BenchResult, CheckResult, Device, ModelSource, utc_now


def unmeasured_result(device: Device, model: ModelSource, config: BenchConfig, step: str, reason: str, hint: str,
                      check_detail: str) -> BenchResult:
    """The stored result of a cell that failed before anything was measured."""
    return BenchResult(
        device=device.name, key=device.key, model=model.name, model_digest=model.digest, status="failed",
        reason=reason, failed_step=step, hint=hint, config=config, check=CheckResult("skipped", detail=check_detail),
        context={"device_kind": device.kind, "emulated": device.emulated, "target": device.target},
        started_at=utc_now(),
    )


def compile_failure(device: Device, model: ModelSource, config: BenchConfig, exc: FarmError) -> BenchResult:
    return unmeasured_result(device, model, config, "compile", exc.message, exc.hint, "not reached: failed at compile")


def crashed_cell(device: Device, model: ModelSource, config: BenchConfig, exc: Exception) -> BenchResult:
    """The stored result of a cell whose measurement raised what farm does not expect (a farm bug, or a library
    error farm does not translate): failed at step "farm", with the exception; its traceback is in the log."""
    return unmeasured_result(device, model, config, "farm", f"unexpected {type(exc).__name__}: {message_line(exc)}",
                             "a farm bug or an untranslated library error: rerun with -v for the traceback and report it",
                             "not reached: farm failed")
