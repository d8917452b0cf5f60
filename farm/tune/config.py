"""What a tuning session is asked to do (``TuneConfig``), and the numbers its defaults come from.

Every default of ``farm tune`` and of a sweep file's ``[tune]`` table is read from here (the CLI, ``night.tuning``)."""

from __future__ import annotations

from dataclasses import dataclass

from farm.records import Device
from farm.tune.task_profile import DEFAULT_MIN_SHARE

# Trials a session searches when not told: enough for every batch of a small model's tasks to be measured once or
# more (TRIALS_PER_RUNNER a batch); a night or an hour of tuning is asked for with --trials or minutes.
DEFAULT_TRIALS = 64

# The trials of a session bounded by minutes alone: more than any session measures, so its minutes end it (a user
# who gives minutes expects to spend them; with --trials too, whichever is spent first ends it).
UNBOUNDED_TRIALS = 1_000_000


def session_trials(trials: int | None, minutes: float | None) -> int:
    """The trials a session is given: as asked; else as many as ``minutes`` allow (``UNBOUNDED_TRIALS``), else
    ``DEFAULT_TRIALS``. 0: no session."""
    if trials is not None:
        return trials
    return UNBOUNDED_TRIALS if minutes else DEFAULT_TRIALS


# Seconds a candidate may take on the device (upload, load, runs, clean-up): MetaSchedule's own 10 s is short for a
# phone's first load. A device's runner_timeout_s in devices.toml overrides it (``runner_timeout_for``).
RUNNER_TIMEOUT_S = 60.0

# A candidate whose request found every server of the key taken asks again this many times (each waits
# request_timeout_s) before its measurement fails: busy devices are not a bad schedule.
BUSY_RETRIES = 4

# Searching by share, the tasks take turns in passes: each pass credits every task with its share of this many
# trials, and a task is searched when its credit makes a whole batch (the rest carries over), biggest first (a
# session's first pass: the tasks never searched first, a batch each), until their allotments or the minutes are
# spent. One search per task at once would give a time-bounded session's whole budget
# to the biggest task (it plateaus, the others wait).
PASS_TRIALS = 256

# Candidates a batch for each runner measuring at once. MetaSchedule generates a task's next batch only after the
# last candidate of the batch is measured, so every device waits for the generation (and the last candidate's)
# once a batch: K runners get K times the batch, and that wait is shared by as many candidates as at K = 1
# (tools/bench_tuning.py --scaling, 48 trials: 29 % idle at K = 2 with 16 candidates a batch, 25 % with 32).
# On this host's CPU too, though generating a batch costs ~50 s there against ~8 s to build and measure 16
# candidates: batches of 64 (MetaSchedule's own) measured twice the candidates in the same minutes but tuned
# squeezenet less well, fewer searches learning from fewer rounds of measurements (14.7 against 12.1 ms after 30
# minutes; tools/bench_tuning.py --batches 16,64, docs/benchmarks.md).
TRIALS_PER_RUNNER = 16

# Schedules MetaSchedule's evolutionary search keeps a batch (its EvolutionarySearch default is 512): it samples
# about 0.8 × this many new ones, evolves them four times by the cost model and measures the batch's best.
# Generating a batch costs CPU in proportion (a convnet conv on a 2-core host: ~60 s at 512, whether 8 or 64 are
# then measured). On this host's CPU, 128 measured 2.4-2.9× the trials of 512 in the same minutes and tuned
# squeezenet as well or better at every point (20 minutes: 2.77 against 3.14 ms in the model's layout, 2.09 against
# 2.09 in NHWC; tools/bench_tuning.py --populations 512,128 --layouts model,NHWC, docs/benchmarks.md).
# A device's search_population in devices.toml overrides it, --population a session's; never below the batch.
SEARCH_POPULATION = 128


@dataclass(frozen=True)
class TuneConfig:
    trials: int = DEFAULT_TRIALS
    per_task: int | None = None
    minutes: float | None = None
    tasks: str | None = None  # only tasks whose name contains this
    trials_per_iter: int | None = None  # candidates a batch (None: TRIALS_PER_RUNNER × the runners)
    builder_timeout_s: float = 120.0  # the first batch can be slow: workers import TVM
    runner_timeout_s: float = RUNNER_TIMEOUT_S  # per candidate on the device
    request_timeout_s: float = 30.0  # wait for a free device per candidate (then asked again: BUSY_RETRIES)
    seed: int = 0
    max_runners: int = 1  # candidates measured at once, each on its own server of the key (K = min(free, this))
    fresh_cost_model: bool = False  # ignore the cost model earlier sessions saved for this target
    candidate_cooldown_s: float = 0.0  # the device rests this long after each candidate, session held (phones)
    by_share: bool = True  # profile each task untuned on the device first, share the trials by its time
    builds_ahead: bool | None = None  # build while the devices measure (None: unless the device measures on this host's CPU)
    take_turns: bool = True  # builds ahead: a pass's tasks take turns in one search (False: one task a search)
    min_share: float = DEFAULT_MIN_SHARE  # the smallest tasks, together under this share of the model's time, are not searched
    population: int | None = None  # the evolutionary search's population (None: search_population_for the device)


def search_population_for(device: Device, config: TuneConfig, batch: int) -> int:
    """The evolutionary search's population: the session's, else the device's ``search_population`` in devices.toml,
    else ``SEARCH_POPULATION``; at least ``batch`` (a batch is picked from the population)."""
    asked = config.population or device.options.get("search_population") or SEARCH_POPULATION
    return max(int(asked), batch)


def runner_timeout_for(device: Device) -> float:
    """Seconds a candidate may take on ``device``: its ``runner_timeout_s`` in devices.toml, else ``RUNNER_TIMEOUT_S``."""
    return float(device.options.get("runner_timeout_s", RUNNER_TIMEOUT_S))


@dataclass(frozen=True)
class TuneBudget:
    """A sweep file's ``[tune]`` table: what a night's tuning spends (``farm.night.tuning``); its fields are the table's keys
    (``farm.night.sweep_file``)."""

    minutes: float
    trials: int = DEFAULT_TRIALS
    devices: tuple[str, ...] = ()
    models: int | None = None  # at most this many models per key a night
