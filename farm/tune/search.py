"""Step 4 of a session, the search: MetaSchedule's ``tune_tasks`` calls over the session's tasks, all sharing one
database, cost model, builder and runner.

Searching by share, the tasks are searched in passes (``plan.search_passes``): a task's search a call, or, when
builds run ahead of a device that is not this host, a pass's tasks taking turns in one call (``PassScheduler``).
Otherwise one call over every task lets MetaSchedule's gradient scheduler share the trials.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from tvm.s_tir import meta_schedule as ms

from farm.tune.costmodel import samples_of
from farm.errors import message_line
from farm.records import Device, TrackerAddress, cold_weights
from farm.tune.config import TuneConfig
from farm.tune.metaschedule import (PassScheduler, logs_to_file_only, make_builder, make_runner,
                                    session_log_dir)
from farm.tune.plan import Plan, Tuning, overlapped_calls, search_passes
from farm.tune.database import commit_untuned, record_s, seed_by_anchor
from farm.tune.session import SessionCallback, TuneSession

log = logging.getLogger(__name__)


@dataclass
class Search:
    """The session's MetaSchedule side: its tune contexts (one a task), database, cost model, builder and runner."""

    session: TuneSession
    tuning: Tuning
    plan: Plan
    config: TuneConfig
    contexts: list
    weights: list
    log_dir: Path
    database: Any
    cost_model: Any
    builder: Any = None
    runner: Any = None
    seeds: dict[int, list[float]] = field(default_factory=dict)  # tasks started from an anchor block's record
    baselines: list[int] = field(default_factory=list)  # tasks given their untuned code as a record
    exhausted: set[int] = field(default_factory=set)  # tasks whose search ran out of new candidates

    @property
    def seeded(self) -> int:
        return sum(1 for secs in self.seeds.values() if secs)

    def run(self) -> None:
        """The whole search: pass after pass by share, else MetaSchedule's gradient scheduler over every task."""
        if not self.plan.by_share:
            self._call(list(range(len(self.contexts))), self.config.trials, self.config.per_task)
            return
        for call in self._calls():
            if self.session.stopping():  # a new call starts with a search: none begins once the time is spent
                break
            self._search(call)

    def _calls(self) -> Iterator[list[tuple[int, int]]]:
        shares = self.plan.shares
        allotted = {i: s.trials - int(i in self.seeds) - int(i in self.baselines) for i, s in enumerate(shares)}
        passes = search_passes(allotted, {i: s.share or 0.0 for i, s in enumerate(shares)}, self.tuning.batch,
                               exhausted=self.exhausted,
                               first={i for i in self.plan.searched if not self.plan.searched_before[i]})
        turns = self.tuning.ahead and self.config.take_turns and not self.config.per_task
        for searches in passes:
            yield from overlapped_calls(searches, self.tuning.batch) if turns else [[one] for one in searches]

    def _search(self, call: list[tuple[int, int]]) -> None:
        """The searches ``call`` (task, trials) of a pass in one call: one task, or tasks taking turns."""
        tasks = self.session.tasks
        chosen = [i for i, _ in call]
        quotas = [min(self.config.per_task or n, n) for _, n in call]
        before = [tasks[i].trials for i in chosen]
        turns = PassScheduler(quotas, self.tuning.batch, lambda j: tasks[chosen[j]].trials - before[j],
                              self.session.stopping) if len(call) > 1 else None
        self._call(chosen, sum(quotas), max(quotas), turns)
        for j, ((i, trials), trials_before) in enumerate(zip(call, before)):
            ended_by_quota = turns is not None and j in turns.ended
            if self.session.going and not ended_by_quota and tasks[i].trials - trials_before < trials:
                self.exhausted.add(i)  # MetaSchedule ends a task's search when it finds no candidate not measured

    def _call(self, chosen: list[int], max_trials: int, per_task: int | None, turns: PassScheduler | None = None) -> None:
        """One MetaSchedule ``tune_tasks`` call over the tasks ``chosen`` with the session's builder, runner, database,
        cost model and callbacks: MetaSchedule's gradient scheduler, or ``turns``."""
        self.session.calling[:], self.session.takes_turns = chosen, turns is not None
        logs_to_file_only()
        ms.tune.tune_tasks(
            tasks=[self.contexts[i] for i in chosen], task_weights=[self.weights[i] for i in chosen],
            work_dir=str(self.log_dir), max_trials_global=max_trials, max_trials_per_task=per_task,
            num_trials_per_iter=min(self.tuning.batch, max_trials), builder=self.builder, runner=self.runner,
            database=self.database, cost_model=self.cost_model,
            measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), SessionCallback(self.session)],
            task_scheduler=turns or "gradient")

    def close(self) -> list[float]:
        """Stop the builder's and runner's workers; returns each measured candidate's time on its device."""
        busy = self.runner.busy_seconds() if self.runner is not None else []
        if self.runner is not None:
            self.runner.shutdown()
        if self.builder is not None:
            self.builder.shutdown()
        return busy


def open_search(tracker: TrackerAddress, device: Device, tuning: Tuning, plan: Plan, session: TuneSession,
                cost_model, work_root: Path, config: TuneConfig) -> Search:
    """The search's database (the store's records, written by the session), tune contexts and logs, the records
    farm adds before it (seeds, untuned guards: each a trial), then its builder and runner."""
    say = session.say
    database = ms.database.JSONDatabase(str(session.work_dir / "database_workload.json"),
                                        str(session.work_dir / "database_tuning_record.json"))
    logs_to_file_only()  # the contexts set up MetaSchedule's loggers ("Logging directory: …")
    log_dir = session_log_dir(work_root, device, session.session_id)  # the database's folder is rewritten each session
    strategy = ms.search_strategy.EvolutionarySearch(population_size=tuning.population)  # each context clones it
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(list(tuning.tasks), str(log_dir),
                                                                              strategy=strategy, seed=config.seed)
    search = Search(session, tuning, plan, config, contexts, weights, log_dir, database, cost_model)
    search.seeds = seed_by_anchor(tracker, device, tuning, plan, contexts, database, config, say)
    for task, secs in search.seeds.items():  # a seed timed and refused (slower than untuned) counts a trial too
        session.count(task, record_s(secs) if secs else None)
    try:
        search.baselines = commit_untuned(database, contexts, plan, tuning.tvm_target)
    except Exception as exc:  # TVM's errors: the guard is lost for this session, never the session itself
        log.info("untuned records failed", exc_info=True)
        say(f"no untuned records: {message_line(exc)}")
    for task in search.baselines:  # the profile measured it on the device: a trial, as a seed is
        session.count(task)
    session.note_trajectory()
    say(f"MetaSchedule's own log: {log_dir / 'logs'}")
    say(f"{len(tuning.tasks)} task(s), {len(plan.prior.records)} record(s) already in the store for this target; "
        f"cost model: {samples_of(cost_model)} sample(s) from earlier sessions; {tuning.runners} runner(s) on key "
        f"{device.key!r}; {'builds run ahead of the measurements' if tuning.ahead else 'each batch is built, then measured'}")
    # made after the seeds were timed: their pools start their processes at once (warm_pool)
    search.runner = make_runner(tracker, device, config, tuning.runners, tuning.ahead, cold_weights(tuning.target))
    search.builder = make_builder(tuning.toolchain, config, tuning.ahead, session.deadline)
    return search
