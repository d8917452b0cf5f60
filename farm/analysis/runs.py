"""The read model's record of one stored run: ``Run``, frozen, with its summaries. No TVM, no database.

``results.run_rows`` builds them from the store; ``series`` groups them, ``regress`` judges them, and
review, report, drift, dashboard, confirmation and the CLI read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from farm.records import Record
from farm.stats import Summary


@dataclass(frozen=True, slots=True)
class Run(Record):
    """One stored run and its summaries. ``steady``: the steady-state repeats (what ``steady_clock`` measures);
    ``steady_wall``: wall-clock repeats where the steady figure is a GPU's kernel time; ``copies``: each output's
    get_output summary. The flat ``steady_median_s``-style names (``VIEWS``) read these, for CSV and JSON."""

    run_id: int
    started_at: str
    device: str
    key: str
    model: str
    model_digest: str
    status: str
    failed_step: str
    reason: str
    upload_s: float | None
    load_s: float | None
    first_run_s: float | None
    load_warm_s: float | None
    first_run_warm_s: float | None
    steady_clock: str
    steady_number: int | None
    steady_wall_number: int | None
    fallback_of: int | None
    check: str
    max_abs_err: float | None
    emulated: bool
    tuned: bool
    tuned_tasks: int
    total_tasks: int
    sweep_id: int | None
    attempt: int
    artifact_key: str
    tvm_version: str
    farm_version: str
    runtime: str  # tvm, or a reference runtime timed beside it (onnxruntime | litert | torch): no artifact
    runtime_version: str
    context: dict[str, Any]
    series_context: str  # what must not change inside a baseline (series.context_of)
    steady: Summary | None
    steady_wall: Summary | None
    copy_s: tuple[float | None, ...]  # each output's median get_output time
    copy_bytes: tuple[int, ...]
    # planned memory (its artifact's) and the session process's RSS (None: not known, not measured)
    params_bytes: int | None = None
    planned_host_bytes: int | None = None
    planned_device_bytes: int | None = None
    rss_before_load_bytes: int | None = None
    rss_after_load_bytes: int | None = None
    rss_peak_bytes: int | None = None
    threads: int | None = None  # the CPU threads the run used (BenchResult.threads); None: stored before farm knew
    manifest: str | None = None  # the digest of its manifest (farm.manifest; Store.manifests); None: none read

    VIEWS = ("steady_n", "steady_median_s", "steady_p10_s", "steady_p90_s", "steady_ci_low_s", "steady_ci_high_s",
             "steady_cv", "unstable", "steady_wall_n", "steady_wall_median_s", "steady_wall_p10_s",
             "steady_wall_p90_s", "copy_share", "planned_bytes", "rss_load_increase_bytes", "rss_peak_increase_bytes",
             "memory_total_bytes")

    steady_n = property(lambda self: self.steady.n if self.steady else 0)
    steady_median_s = property(lambda self: self.steady.median if self.steady else None)
    steady_p10_s = property(lambda self: self.steady.p10 if self.steady else None)
    steady_p90_s = property(lambda self: self.steady.p90 if self.steady else None)
    steady_ci_low_s = property(lambda self: self.steady.ci_low if self.steady else None)
    steady_ci_high_s = property(lambda self: self.steady.ci_high if self.steady else None)
    steady_cv = property(lambda self: self.steady.cv if self.steady else None)
    unstable = property(lambda self: self.steady.unstable if self.steady else False)
    steady_wall_n = property(lambda self: self.steady_wall.n if self.steady_wall else 0)
    steady_wall_median_s = property(lambda self: self.steady_wall.median if self.steady_wall else None)
    steady_wall_p10_s = property(lambda self: self.steady_wall.p10 if self.steady_wall else None)
    steady_wall_p90_s = property(lambda self: self.steady_wall.p90 if self.steady_wall else None)

    @property
    def planned_bytes(self) -> int | None:
        """Relax's planned activations, host and device (GPU) memory together."""
        if self.planned_host_bytes is None and self.planned_device_bytes is None:
            return None
        return (self.planned_host_bytes or 0) + (self.planned_device_bytes or 0)

    @property
    def rss_load_increase_bytes(self) -> int | None:
        """What loading the model added to the session process's RSS."""
        if self.rss_after_load_bytes is None or self.rss_before_load_bytes is None:
            return None
        return self.rss_after_load_bytes - self.rss_before_load_bytes

    @property
    def rss_peak_increase_bytes(self) -> int | None:
        """The process's peak RSS over load, first run and steady runs, above its RSS before load (regress: peak_rss)."""
        if self.rss_peak_bytes is None or self.rss_before_load_bytes is None:
            return None
        return self.rss_peak_bytes - self.rss_before_load_bytes

    @property
    def memory_total_bytes(self) -> int | None:
        """The device's RAM, where its server could read it."""
        return self.context.get("memory_total_bytes")

    @property
    def copy_share(self) -> float | None:
        """get_output's cost against one run's: the wall time where a GPU has one, else the steady figure."""
        per_run = self.steady_wall_median_s or self.steady_median_s
        if not per_run or not self.copy_s or None in self.copy_s:
            return None
        return sum(self.copy_s) / per_run  # type: ignore[arg-type]

    @property
    def is_reference(self) -> bool:
        """A run of the reference runtime (onnxruntime …), not of TVM: the control beside TVM's runs."""
        return self.runtime != "tvm"

    @property
    def copy_pairs(self) -> list[tuple[int, float | None]]:
        return list(zip(self.copy_bytes, self.copy_s))
