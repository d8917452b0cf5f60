"""The session process's memory during a run, read through the server's ``farm.MemoryStats``."""

from __future__ import annotations

import json
from typing import Callable

from farm.errors import message_line
from farm.measure.draft import RunDraft

MEMORY_MEASURED = "RSS of the process serving the session (VmRSS, VmHWM); GPU driver allocations are not in it"
MEMORY_EMULATED = "RSS of qemu's process (its translator and code cache too): emulated, never compare with hardware"
MEMORY_UNMEASURED = "not measured: the device's server has no farm.MemoryStats (a stock TVM server, iOS)"


class Memory:
    """The session process's memory through the server's ``farm.MemoryStats`` (JSON: rss_bytes, peak_bytes,
    total_bytes), into the run's draft and its context; without it (a stock TVM server, iOS) nothing is read and
    the context says "not measured", never a guess. ``rss_peak_bytes`` is the highest peak (VmHWM) of the readings
    marked ``peak``, each covering the time since the reset before it."""

    def __init__(self, stats: Callable[[int], str] | None, draft: RunDraft, emulated: bool) -> None:
        self.stats, self.draft, self.emulated = stats, draft, emulated
        self.peak_known = True  # False once a reset of the peak failed: the peak would then span earlier steps
        draft.context["memory"] = MEMORY_UNMEASURED if stats is None else MEMORY_EMULATED if emulated else MEMORY_MEASURED

    def read(self, reset_peak: bool = False, peak: bool = False) -> int | None:
        """One reading: the process's RSS now, for the caller's field (None: not measured). A server whose reading
        fails leaves memory "not measured" with the reason, and no reading of the run; the run goes on."""
        if self.stats is None:
            return None
        draft, context = self.draft, self.draft.context
        try:
            reading = json.loads(self.stats(int(reset_peak)))
        except Exception as exc:  # RPC or JSON: memory is a side figure, never the run's failure
            self.stats = None
            context["memory"] = f"not measured: reading the server's memory failed ({message_line(exc, 200)})"
            draft.rss_before_load_bytes = draft.rss_after_load_bytes = draft.rss_peak_bytes = None
            return None
        if not self.emulated:  # under qemu-user /proc/meminfo is this host's, not the device's: no guess
            context.setdefault("memory_total_bytes", reading.get("total_bytes"))  # the device's RAM: will it fit?
        if reset_peak and reading.get("peak_reset") is False and self.peak_known:
            self.peak_known = False
            draft.rss_peak_bytes = None
            context["memory"] += "; peak not measured: the server could not reset it (no /proc/self/clear_refs)"
        if peak and self.peak_known and reading.get("peak_bytes") is not None:
            draft.rss_peak_bytes = max(reading["peak_bytes"], draft.rss_peak_bytes or 0)
        return reading.get("rss_bytes")
