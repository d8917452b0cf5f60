"""Which kernels account for a change, and TVM's op classes beside the reference runtime's. Which kernels account for
a change: two runs' profiles (``records.KernelProfile``) set side by side, kernel by
kernel where they are the same kernels, by op class where they are not (two artifacts fused differently: the
comparison says so).

The change is the kernels' (their sum per run, the VM's own calls left out: those are not kernels, and on a small
model their noise would blur every share), from the old profile to the new. A shift every kernel shares (the device's
clock, a neighbour's load, a session that ran warmer) is taken out first (#63): the *common factor* is the median of
the kernels' new/old ratios (``common_factor``), and each kernel's share is its change beyond that factor, new −
factor × old, over the sum of those: so a planted kernel keeps its share when the two sessions differ by 20 %, where
before every kernel's 20 % diluted it (a plant got 32 % and 63 % of two changes). Where every kernel moved alike, none
stands out, and the headline says so. Kernels are matched by name: a tuning record removed or replaced keeps a
kernel's name and moves its time, and a kernel whose record packed its weights (``fused_conv2d_add_relu_prepacked``)
is the same kernel as its unpacked self (``fused_conv2d_add_relu``), the record gone; a fusion change makes kernels
appear and disappear, and those are listed. Ranked by how much of the change each one carries (a slowdown's largest
increases first, a speedup's largest decreases).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from farm.records import Alert, KernelProfile
from farm.stats import format_duration

MATCHED_NAMES = 0.5  # kernels compared by name when at least this share of them is in both profiles; else op classes
# The common factor is the median new/old ratio of the kernels (or op classes) in both profiles that hold at least
# COMMON_MIN_SHARE of the old time, when there are COMMON_MIN_KERNELS of them (fewer: no factor, 1.0): a median of
# five is still right with two of them planted or noisy
COMMON_MIN_KERNELS = 5
COMMON_MIN_SHARE = 0.005
COMMON_SHOWN = 0.02  # a common factor further than this from 1 is said in the headline
STANDS_OUT = 0.02  # ... and when what is left beyond it is under this share of the kernels' time, none stands out
PREPACKED = "_prepacked"  # a kernel whose tuning record packed its weights (compile.frontends.prepack_calls)


@dataclass(frozen=True)
class KernelMove:
    name: str  # a kernel's name, or an op class when compared by class
    op_class: str
    old_s: float | None  # per run of main; None: not in the old profile (appeared)
    new_s: float | None  # None: not in the new one (disappeared)
    share: float  # of the kernels' change beyond the common factor (signed: one that moved against it is negative)

    @property
    def delta_s(self) -> float:
        return (self.new_s or 0.0) - (self.old_s or 0.0)


@dataclass(frozen=True)
class KernelDiff:
    by: str  # "kernel" | "op class"
    note: str  # why op classes, or '' (same kernels)
    old_main_s: float
    new_main_s: float
    moves: tuple[KernelMove, ...]  # most of the change first
    appeared: tuple[str, ...] = ()
    disappeared: tuple[str, ...] = ()

    old_kernels_s: float = 0.0  # the kernels' sum per run (the VM's calls left out)
    new_kernels_s: float = 0.0
    common: float = 1.0  # the shift every kernel shared (common_factor): new/old

    @property
    def change_s(self) -> float:
        """The kernels' change per run."""
        return self.new_kernels_s - self.old_kernels_s

    @property
    def attributed_s(self) -> float:
        """The change beyond the common factor: what the shares divide."""
        return self.new_kernels_s - self.common * self.old_kernels_s

    spread_s: float = 0.0  # the sum of each kernel's |change beyond the common factor|

    @property
    def common_shown(self) -> bool:
        return abs(self.common - 1.0) >= COMMON_SHOWN

    def headline(self, top: int = 1) -> str:
        """'92 % of the +1.3 ms is fused_conv2d16 (1.06 → 1.31 ms)'; with a common factor '92 % of the +1.1 ms beyond
        every kernel's +20 % is …'; the op class when compared by class."""
        if not self.moves:
            return "no kernel moved"
        beyond = f" beyond every kernel's {self.common - 1:+.0%}" if self.common_shown else ""
        if self.common_shown and self.spread_s < STANDS_OUT * self.old_kernels_s:
            return (f"every kernel moved alike ({self.common - 1:+.0%}, {_signed(self.change_s)}): none stands out"
                    + (f" ({self.note})" if self.note else ""))
        parts = [f"{m.share:.0%} of the {_signed(self.attributed_s)}{beyond} is {m.name} "
                 f"({_time(m.old_s)} → {_time(m.new_s)})" for m in self.moves[:top]]
        return "; ".join(parts) + (f" ({self.note})" if self.note else "")

    def to_json(self) -> dict:
        return {"by": self.by, "note": self.note, "old_main_s": self.old_main_s, "new_main_s": self.new_main_s,
                "old_kernels_s": self.old_kernels_s, "new_kernels_s": self.new_kernels_s,
                "change_s": self.change_s, "common": self.common, "attributed_s": self.attributed_s,
                "headline": self.headline(),
                "moves": [{"name": m.name, "op_class": m.op_class, "old_s": m.old_s, "new_s": m.new_s,
                           "delta_s": m.delta_s, "share": m.share} for m in self.moves],
                "appeared": list(self.appeared), "disappeared": list(self.disappeared)}


def kernel_diff(old: KernelProfile, new: KernelProfile, same_artifact: bool | None = None,
                sessions_apart: bool = True) -> KernelDiff:
    """How ``new`` differs from ``old``, kernel by kernel (or by op class where the kernels are not the same ones).
    ``same_artifact``: both runs ran one library (then kernels are compared by name whatever their overlap).
    ``sessions_apart``: the two profiles come from sessions apart (two nights, two benches), so a shift every kernel
    shared is taken out first (``common_factor``); False for two profiled back to back (a confirmation's rerun),
    and never for a comparison by op class (another fusion: a broad change is the change)."""
    old_k = _by_kernel(old)
    new_k = _by_kernel(new)
    both = old_k.keys() & new_k.keys()
    overlap = len(both) / max(1, len(old_k.keys() | new_k.keys()))
    if same_artifact or overlap >= MATCHED_NAMES:
        names = sorted(old_k.keys() | new_k.keys())
        rows = [(_shown(old_k.get(n), new_k.get(n)), (old_k.get(n) or new_k[n]).op_class,
                 old_k[n].time_s if n in old_k else None, new_k[n].time_s if n in new_k else None) for n in names]
        note = "" if same_artifact or overlap == 1 else \
            f"different libraries: {len(both)} of {len(names)} kernels in both, matched by name"
        by, appeared, disappeared = "kernel", tuple(sorted(new_k[n].name for n in new_k.keys() - old_k.keys())), \
            tuple(sorted(old_k[n].name for n in old_k.keys() - new_k.keys()))
    else:
        old_c, new_c = _by_class(old), _by_class(new)
        rows = [(c, c, old_c.get(c), new_c.get(c)) for c in sorted(old_c.keys() | new_c.keys())]
        note = (f"different kernels ({len(both)} of {len(old_k.keys() | new_k.keys())} names in both: another "
                "schedule or fusion), compared by op class")
        by, appeared, disappeared = "op class", (), ()
    if old.clock != new.clock:  # a cold first run against warm runs, another timer: said beside the moves
        note = "; ".join(n for n in (note, f"the profiles were timed differently ({old.clock} against {new.clock})")
                         if n)
    common = common_factor([(a, b) for _, _, a, b in rows], old.kernel_sum_s) if sessions_apart and by == "kernel" \
        else 1.0
    change = new.kernel_sum_s - old.kernel_sum_s
    attributed = new.kernel_sum_s - common * old.kernel_sum_s
    if attributed * change < 0 and abs(attributed) >= STANDS_OUT * old.kernel_sum_s:
        common, attributed = 1.0, change  # what is left beyond it clearly goes against the change: no shared shift

    def beyond(a: float | None, b: float | None) -> float:
        return (b or 0.0) - common * (a or 0.0)

    moves = [KernelMove(name, cls, a, b, beyond(a, b) / attributed if attributed else 0.0) for name, cls, a, b in rows]
    sign = 1.0 if attributed >= 0 else -1.0
    moves.sort(key=lambda m: -sign * beyond(m.old_s, m.new_s))
    return KernelDiff(by, note, old.main_s, new.main_s, tuple(moves), appeared, disappeared, old.kernel_sum_s,
                      new.kernel_sum_s, common, sum(abs(beyond(a, b)) for _, _, a, b in rows))


def common_factor(pairs: Iterable[tuple[float | None, float | None]], old_total_s: float) -> float:
    """The shift every kernel shared: the median new/old ratio of the (old, new) times in both profiles whose old time
    is at least ``COMMON_MIN_SHARE`` of ``old_total_s``; 1.0 with fewer than ``COMMON_MIN_KERNELS`` of them."""
    ratios = sorted(b / a for a, b in pairs if a and b is not None and a >= COMMON_MIN_SHARE * old_total_s)
    if len(ratios) < COMMON_MIN_KERNELS:
        return 1.0
    middle = len(ratios) // 2
    return ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2


def kernel_key(name: str) -> str:
    """A kernel's name as the same kernel is named with or without its weights packed by a record."""
    return name[: -len(PREPACKED)] if name.endswith(PREPACKED) else name


def _by_kernel(profile: KernelProfile) -> dict:
    return {kernel_key(k.name): k for k in profile.kernels if k.op_class != "vm"}


def _shown(old, new) -> str:
    """The name a move shows: one name, or 'old → new' where the record that packed its weights came or went."""
    if old is None or new is None or old.name == new.name:
        return (new or old).name
    return f"{old.name} → {new.name}"


def _by_class(profile: KernelProfile) -> dict[str, float]:
    return {c: s for c, s in profile.by_class().items() if c != "vm"}


def _time(value: float | None) -> str:
    return "absent" if value is None else format_duration(value)


def _signed(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + format_duration(abs(seconds))


def class_versus(tvm: KernelProfile, reference: KernelProfile) -> list[tuple[str, float, float]]:
    """(op class, TVM's seconds per run, the reference runtime's) for each class either spent time in, TVM's largest
    first: kernels do not map one to one across runtimes (each fuses its own way); op classes do."""
    ours, theirs = _by_class(tvm), _by_class(reference)
    return sorted(((c, ours.get(c, 0.0), theirs.get(c, 0.0)) for c in ours.keys() | theirs.keys()),
                  key=lambda row: -max(row[1], row[2]))


def class_versus_text(tvm: KernelProfile, reference: KernelProfile, runtime: str, most: int = 4) -> str:
    """'conv: TVM 40.7 ms, onnxruntime 48.9 ms (0.83×); layout/copy/concat: TVM 2.4 ms, onnxruntime 1 ms (2.4×)'."""
    parts = []
    for label, ours, theirs in class_versus(tvm, reference)[:most]:
        ratio = f" ({ours / theirs:.2g}×)" if ours and theirs else ""
        parts.append(f"{label}: TVM {_time(ours)}, {runtime} {_time(theirs)}{ratio}")
    return "; ".join(parts)


def alert_headlines(alerts: Iterable[Alert],
                    read_profiles: Callable[[Sequence[int]], Mapping[int, KernelProfile]]) -> dict[int, str]:
    """alert id -> which kernels moved from its baseline run to its run (``KernelDiff.headline``), for the time alerts
    whose two runs both have a profile "ok": what a finding's sentence and the dashboard's alerts say of kernels.
    ``read_profiles`` (``Store.profiles``) reads those runs' profiles only, in one call."""
    pairs = {a.id: (a.baseline_run_id, a.run_id) for a in alerts if a.metric == "steady" and a.baseline_run_id is not None}
    if not pairs:
        return {}
    profiles = {i: p for i, p in read_profiles(sorted({i for pair in pairs.values() for i in pair})).items()
                if p.status == "ok"}
    return {alert: kernel_diff(profiles[old], profiles[new]).headline() for alert, (old, new) in pairs.items()
            if old in profiles and new in profiles}
