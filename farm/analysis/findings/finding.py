"""A finding as a record, its noise floor and its sentence. No TVM, no database."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from farm.records import Alert, Record
from farm.analysis.regress import BYTE_METRICS, PLANNED_METRICS
from farm.stats import MAD_TO_SD

if TYPE_CHECKING:
    from farm.analysis.runs import Run

# The smallest change farm can tell from its clocks: a figure is a mean over ``number`` calls between two reads of
# a ns clock (std::chrono on the device, perf_counter here), but OpenCL profiling events report µs on mobile GPUs
# and a sub-µs difference of one call is below what any of farm's timers resolves. A choice, stated.
TIMER_RESOLUTION_S = 1e-6
PAGE_BYTES = 4096  # the measured memory's resolution: RSS is counted in pages
PLANNED_BYTE = 1.0  # planned memory's: read from the built module, exact; any change is a change (regress)
NOISE_MADS = 3.0  # ... and three times the run's own MAD of its samples (the rule)
Z_CAP = 10.0  # one series' z counts at most this much in a finding's evidence: a huge z is not more evidence
# A series alone is a finding when its night passes Bonferroni's bound at this family-wise level over the night's
# judged series (group._alone): a lone series reaches the report's first screen, so at most one quiet night in 100
# may put one there. At 0.05 tools/bench_findings.py's 50-night × 40 × 25 A/A night showed one (4.2 %, t = 5.26 past
# 4.90; 5.63 at 0.01), where the planted single series of 10 % have t ≈ 7–8
SINGLE_ALPHA = 0.01
REPRESENTATIVES = 3  # series rerun to confirm a finding (largest z, spread over its devices or models)
UNCONFIRMABLE = "unconfirmable: runtime changed"
SLOWER_STATUSES = ("candidate", "confirmed", "unknown", "rejected", "unconfirmable")
KINDS = ("upgrade", "tuning", "sweep", "model", "device", "block", "scatter", "series")


@dataclass(frozen=True)
class Finding(Record):
    """A group of one sweep's alerts with one cause. ``key`` names it across nights (kind, metric, direction,
    scope); ``state`` is its triage state (new | acknowledged | expected | fixed), carried by the store. ``subject``
    and ``where`` are its block's sides in words ("models with DepthwiseConv (6/25)", "on devices of target kind
    opencl (8/40)"); ``p`` the test that preferred it (a block's G test, a scatter's homogeneity test)."""

    key: str
    kind: str  # upgrade | tuning | sweep | model | device | block | scatter | series
    metric: str
    direction: str  # slower | faster
    cause: str  # what changed, in words ('' when nothing in the runs' context says)
    change: float  # geometric mean of value / baseline centre, minus 1: +0.10 = 10 % slower
    ci: tuple[float, float] | None  # bootstrap 95 % interval of that geometric mean (its run's for one series)
    k: int  # series moved
    n: int  # series judged in the finding's scope
    devices: tuple[str, ...]
    models: tuple[str, ...]  # model labels (model_label)
    devices_judged: int  # devices with a judged series in the scope
    series: tuple[dict[str, Any], ...]  # device, model, tuned, runtime, change, z, alert
    alerts: tuple[int, ...]  # alert ids
    z: float  # median z of its alerts
    evidence: float
    cost_s: float  # sum of |value − baseline centre| over its alerts (bytes for a memory metric)
    confirmed: int  # representatives rerun and confirmed
    reruns: int  # representatives rerun
    rejected: int  # representatives rerun whose rounds found no change (status rejected)
    confidence: str
    control: str = ""  # what the reference runtime's series say (upgrades)
    split: str = ""  # upgrades: "tuning records dropped" | "same tuning coverage"
    representatives: tuple[int, ...] = ()  # alert ids to rerun
    state: str = "new"
    finding_id: int | None = None
    first_sweep: int | None = None
    subject: str = ""  # what moved, in words (its models; a scatter's share of all series)
    where: str = ""  # where it moved, in words (its devices)
    note: str = ""  # what the statistics say beside it (a scatter: no device or model explains it, p = …)
    p: float | None = None
    kernels: str = ""  # which kernels moved, where its runs have profiles: "mlp on cpu: 92 % of the +1.3 ms is …"

    VIEWS = ("sentence", "rank_score")

    @property
    def rank_score(self) -> float:
        """Evidence × cost: cost in the metric's resolutions (a µs, a page), on a log scale."""
        return self.evidence * (1.0 + math.log10(1.0 + self.cost_s / resolution(self.metric)))

    @property
    def sentence(self) -> str:
        return sentence(self)


def noise_floor(alert: Alert, run: "Run | None") -> float:
    """The smallest absolute change of ``alert`` that can be a finding: the timer's resolution, or three times the
    run's own MAD (its steady samples'; for a metric of one value per run, the MAD of its baseline's nights). Both
    stored spreads are MADs scaled to a normal SD (``stats.MAD_TO_SD``): divided back, so 3 × MAD is 3 × MAD."""
    mad = None
    if alert.metric == "steady" and run is not None and run.steady is not None:
        mad = run.steady.mad / MAD_TO_SD
    elif alert.baseline is not None:
        mad = alert.baseline["spread"] / MAD_TO_SD
    return max(resolution(alert.metric), NOISE_MADS * (mad or 0.0))


def resolution(metric: str) -> float:
    """The smallest change of ``metric`` its measurement resolves: a byte for planned memory, a page for measured
    memory, the timer's for times."""
    if metric in PLANNED_METRICS:
        return PLANNED_BYTE
    return PAGE_BYTES if metric in BYTE_METRICS else TIMER_RESOLUTION_S


def absolute_change(alert: Alert) -> float:
    return abs(alert.value - alert.baseline["centre"]) if alert.baseline else 0.0


def percent(change: float) -> str:
    return f"{abs(change) * 100:.1f} %"


def fraction(k: int, n: int) -> str:
    """k of n as farm writes counts: "78/1,000"."""
    return f"{k:,}/{n:,}"


def sentence(f: Finding) -> str:
    """A finding in one sentence: "models with DepthwiseConv (6/25) are 9.8 % slower (CI 9.5–10.1 %) on devices of
    target kind opencl (8/40) (48/48 series); unconfirmed"; "52 % of all series (520/1,000), across 40/40 devices
    and 25/25 models, are 10.0 % slower; no device or model explains it (p = 0.41)"."""
    what = "" if f.metric == "steady" else f" in {f.metric.replace('_', ' ')}"
    ci = ""
    if f.ci is not None and f.ci[0] * f.ci[1] > 0:
        low, high = sorted(abs(c) for c in f.ci)
        ci = f" (CI {low * 100:.1f}–{high * 100:.1f} %)"
    elif f.ci is not None:
        ci = f" (CI {f.ci[0] * 100:+.1f} to {f.ci[1] * 100:+.1f} %)"
    direction = {"slower": "larger", "faster": "smaller"}[f.direction] if f.metric in BYTE_METRICS else f.direction
    moved = f"{percent(f.change)} {direction}{what}{ci}"
    subject = f.subject or (f"{len(f.models)} models" if len(f.models) > 1 else f.models[0])
    where = f.where or f"on {fraction(len(f.devices), f.devices_judged)} devices"
    if f.kind == "scatter":
        text = f"{subject}, {where}, are {moved}"
    elif f.kind == "device" and len(f.devices) == 1:
        text = f"{f.devices[0]}: {fraction(f.k, f.n)} series are {moved}"
    elif f.kind == "series":
        text = f"{subject} on {f.devices[0]} is {moved}"
    else:
        verb = "are" if len(f.models) > 1 else "is"
        text = f"{subject} {verb} {moved} {where}"
        if f.kind not in ("model", "device"):
            text += f" ({fraction(f.k, f.n)} series)"
    for part in (f.note, f" since {f.cause}" if f.kind == "upgrade" and f.cause else f.cause):
        if part:
            text += part if part.startswith(" since") else f"; {part}"
    if f.split:
        text += f" ({f.split})"
    text += f"; {f.confidence}"
    if f.control:
        text += f"; control: {f.control}"
    if f.kernels:
        text += f"; kernels: {f.kernels}"
    return text
