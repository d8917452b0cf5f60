"""What a session found and decided before its search: the device and tasks it tunes (``Tuning``, step 1), where
the trials go (``Plan``, step 3), and the passes a by-share search takes (``search_passes``, ``overlapped_calls``)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import takewhile
from typing import Any, Iterator

from farm.records import TuningSet
from farm.tune.task_profile import TaskShare
from farm.tune.config import PASS_TRIALS


@dataclass(frozen=True)
class Tuning:
    """What the check found: the device can be tuned, for this target, with these tasks and runners."""

    target: dict[str, Any]  # the device's effective target
    tvm_target: Any  # ... as TVM's Target
    toolchain: str  # what links a candidate (compile.toolchain_for)
    key: str  # the tuning key: effective target and TVM version
    tasks: tuple  # MetaSchedule's extracted tasks (only those --tasks names)
    runners: int  # servers of the key measuring candidates at once: min(free servers, max_runners)
    batch: int  # candidates a batch
    ahead: bool  # candidates are built while the devices measure earlier ones
    population: int  # the evolutionary search's population (config.search_population_for)


@dataclass(frozen=True)
class Plan:
    """Where the trials go: each task's share of the model's time now (its untuned time, or its best stored
    record's once earlier sessions tuned it) and the trials that share gives it."""

    prior: TuningSet  # the store's records for the target when the session began
    known: Any  # those records as MetaSchedule databases (exact, anchor block), or None: no records yet
    untuned: tuple[float, ...] | None  # each task's untuned time on the device (None: not profiled)
    recorded: tuple[float | None, ...]  # each task's best stored record's time (None: no schedule of its own)
    searched_before: tuple[bool, ...]  # each task has a measured candidate of its own in the store
    shares: tuple[TaskShare, ...]

    @property
    def by_share(self) -> bool:
        """Whether the trials are shared by the profile (else MetaSchedule's gradient scheduler shares them)."""
        return self.shares[0].share is not None

    @property
    def searched(self) -> list[int]:
        """The tasks the profile gives trials to (none when not sharing by the profile)."""
        return [i for i, share in enumerate(self.shares) if share.trials] if self.by_share else []

    def untuned_s(self, task: int) -> float | None:
        return self.untuned[task] if self.untuned is not None else None


def search_passes(allotted: dict[int, int], shares: dict[int, float], batch: int,
                  pass_trials: int = PASS_TRIALS, exhausted: set[int] | None = None,
                  first: set[int] | frozenset[int] = frozenset()) -> Iterator[list[tuple[int, int]]]:
    """The by-share plan, pass after pass: each pass is a list of (task, trials), biggest share first. Each pass
    credits every task with ``pass_trials`` × its share, and a task is searched when its credit makes a whole
    ``batch`` (or the rest of its allotment): what a pass does not spend carries over to the next, so a task of
    1 % is searched a batch every few passes and the trials go by share, not a batch a task a pass (which gave
    squeezenet's fifteen smallest tasks more than half of an hour's trials, and its last conv, a quarter of its
    time, a sixth). The tasks ``first`` (never searched) lead the first pass with a batch at least, biggest share
    first: a task's first batch buys more than a tuned task's next one (untuned code is naive loops), and a
    session bounded by minutes may end within its first pass. A task the caller adds to ``exhausted`` (its search
    measured fewer than it was given: no new candidate left) is not in the passes after."""
    done = exhausted if exhausted is not None else set()
    left = {i: n for i, n in allotted.items() if n > 0}
    total = sum(shares[i] for i in left) or 1.0
    # a task's credit a pass (never nothing: a task with an allotment is searched in the end)
    rate = {i: max(pass_trials * shares[i] / total, 1e-3) for i in left}
    credit = {i: 0.0 for i in left}
    order = sorted(left, key=lambda i: (i not in first, -shares[i]))
    opening = True
    while any(n for i, n in left.items() if i not in done):
        searches = []
        for i in order:
            if left[i] and i not in done:
                credit[i] += rate[i]
                take = left[i] if credit[i] >= left[i] else batch * int(credit[i] // batch)
                if opening and i in first:
                    take = min(left[i], max(take, batch))
                if take and left[i] - take < batch:
                    take = left[i]  # not a search of its own for less than a batch
                if take:
                    credit[i] -= take
                    left[i] -= take
                    searches.append((i, take))
        if searches:
            yield searches
        if opening:
            opening = False
            order.sort(key=lambda i: -shares[i])


def overlapped_calls(searches: list[tuple[int, int]], batch: int) -> list[list[tuple[int, int]]]:
    """A pass's searches as ``tune_tasks`` calls: the searches of whole batches together in one call (``PassScheduler``
    takes their turns, so one task's batch is generated while another's is measured), each other search alone: those
    the pass lists before its first whole one (a never-searched task's few trials) before that call, the rest after."""
    whole = [(i, n) for i, n in searches if n % batch == 0]
    lead = list(takewhile(lambda search: search[1] % batch, searches))
    rest = [(i, n) for i, n in searches[len(lead):] if n % batch]
    return [[one] for one in lead] + ([whole] if whole else []) + [[one] for one in rest]
