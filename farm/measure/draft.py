"""A bench run's typed draft: ``RunDraft``, the BenchResult fields the steps fill."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from farm.records import CheckResult, CopyTiming, KernelProfile



@dataclass
class RunDraft:
    """The fields of the BenchResult that the steps fill, each typed as BenchResult types it and with its default;
    the result is built from it by keyword. A failing step leaves what the steps before it measured."""

    context: dict[str, Any]  # measurement_context, then what the steps learn: kernel cache, threads_by, memory
    upload_s: float | None = None  # 2 upload
    steady_clock: str = "wall"  # 3 load: what the device's steady timer measures (STEADY_CLOCK)
    threads: int | None = None  # 3 load: the session's CPU threads (session_threads)
    load_s: float | None = None  # 3 load
    rss_before_load_bytes: int | None = None  # 3 load (Memory)
    rss_after_load_bytes: int | None = None  # 3 load (Memory)
    first_run_s: float | None = None  # 4 first
    load_warm_s: float | None = None  # 5 warm
    first_run_warm_s: float | None = None  # 5 warm
    steady_number: int | None = None  # 6 steady
    steady_samples_s: tuple[float, ...] = ()  # 6 steady
    steady_wall_number: int | None = None  # 6 steady, GPUs on farm's servers
    steady_wall_samples_s: tuple[float, ...] = ()  # 6 steady, GPUs on farm's servers
    rss_peak_bytes: int | None = None  # 4 first to 6 steady (Memory)
    copies: tuple[CopyTiming, ...] = ()  # 7 copy
    check: CheckResult | None = None  # 8 check (None: not reached)
    profile: KernelProfile | None = None  # 9 profile (None: not asked for, or not reached)
