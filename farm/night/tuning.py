"""A sweep's nightly tuning: after measuring, spend the sweep file's ``[tune]`` budget on each device key.

    [tune]
    minutes = 20             # per device key, each night, after the sweep's measurements (and --confirm)
    trials = 64              # at most per model and session (default: tune.DEFAULT_TRIALS)
    models = 2               # optional: at most this many models per key a night (default: while minutes last)
    devices = ["x86-local"]  # optional: only these devices' keys (default: every device of the sweep)

Which models: on a device where a reference runtime ran, those whose TVM time is furthest from it (TVM ÷
reference, largest first); elsewhere those with the most untuned time (steady median × the share of tasks
without records). Each is tuned (``tune.tune_model``) while the key's minutes last; the next night compiles
with the new records (the artifact cache is keyed by the tuning digest).

A record set that makes the tuned model slower is not shipped. After a session added records the model is
compiled with the record set as it was before the session and with the new one; the new one must run and pass
the output check, then both are measured on the device in interleaved rounds (each a fresh load of both);
unless the new set is not slower across the rounds, the session is marked ``rejected`` and its records compile
into nothing from then on (``Store.tuning_lines``). A session whose records change none of the model's code (the
same library with either set) is kept unmeasured: measuring one library twice would judge noise. Records are per
target and shared by every model on it: only the tuned model is validated (and for a replay, the first ranked
model), so another model that shares a workload is not checked here; the next night's sweep and its regressions
are.

A TVM upgrade does not wipe the farm's tuning. Records are keyed by target and TVM version, so on the night of
an upgrade a key has none. The newest records of the same target under an earlier TVM version are then
replayed into it (a session of their own: ``replay_earlier_records``) and validated the same way, against the
untuned model: compiled, checked, measured, kept only if not slower. They are also the warm start of that night's
search.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from farm.compile import TVM_VERSION, compile_model, device_tuning_key, effective_target, tuning_key
from farm.errors import FarmError
from farm.records import (Artifact, BenchConfig, Device, ModelSource, SweepSpec, TrackerAddress, TuningSet,
                          layout_setting, threads_setting, weight_prepack_setting)
from farm.analysis.results import run_rows, versus_reference
from farm.analysis.runs import Run
from farm.store import Store
from farm.stats import median, nonempty_median
from farm.measure import interleaved_rounds
from farm.analysis.regress import not_slower
from farm.lab.jobs import HOST_WAIT_S, TUNE, Job
from farm.lab.queue import LabQueue
from farm.sweep import cell_inputs, measure_cell
from farm.tune.tuning_set import tuning_set
from farm.lab.follow import follow_jobs
from farm.lab.worker import LabWorker
from farm.tune import TuneConfig, TuneStatus, tune_model
from farm.tune.config import TuneBudget

log = logging.getLogger("farm.nightly")  # the name its warnings have always carried

MIN_SESSION_S = 60.0  # a key's budget with less than this left starts no new session
VALIDATION_ROUNDS = 5  # interleaved rounds comparing a record set with the previous one (each a fresh load of both)
Say = Callable[[str], None]


@dataclass(frozen=True)
class NightTuning:
    """What one night's tuning did for one device key and model."""

    device: str
    model: str
    why: str  # why this model was picked (its distance from the reference, or its untuned time)
    status: str  # kept | rejected | no-new-records | failed | replayed-kept | replayed-rejected
    session_id: int | None = None
    new_records: int = 0
    trials: int = 0
    before_s: float | None = None  # steady median with the record set before the session
    after_s: float | None = None  # ... and with the new set
    reason: str = ""


@dataclass(frozen=True)
class Replay:
    """An earlier TVM version's records copied into this version's tuning key, as a session of their own."""

    session_id: int
    copied: int  # records copied
    from_version: str  # the TVM version they were tuned with
    key: str  # this version's tuning key they were copied into


@dataclass(frozen=True)
class Validation:
    """Whether a session's record set is kept (``_validate``), with the figures that decided it."""

    kept: bool
    before_s: float | None  # the median of the rounds with the set before the session (None: not measured)
    after_s: float | None  # ... with the new set
    reason: str


def rank_models(runs: list[Run], device: str) -> list[tuple[str, str]]:
    """(model, why) for ``device``'s measured models, the most worth tuning first: furthest from the reference
    runtime where one ran, then the others by untuned time (steady median × share of tasks without records)."""
    tvm_runs, versus = versus_reference([r for r in runs if r.device == device])
    ok = [r for r in tvm_runs if r.status == "ok" and r.steady_median_s and r.fallback_of is None]
    by_ratio = sorted((r for r in ok if versus[r.run_id].ratio is not None),
                      key=lambda r: -(versus[r.run_id].ratio or 0.0))
    rest = [r for r in ok if versus[r.run_id].ratio is None]
    untuned = {r.run_id: (r.steady_median_s or 0.0) * (1 - r.tuned_tasks / r.total_tasks if r.total_tasks else 1.0)
               for r in rest}
    ranked = [(r.model, f"{versus[r.run_id].reference.runtime}: {versus[r.run_id].text}")  # type: ignore[union-attr]
              for r in by_ratio]  # 'onnxruntime: TVM 2.9× slower, 2 threads each'
    ranked += [(r.model, f"{untuned[r.run_id] * 1e3:.3g} ms untuned") for r in sorted(rest, key=lambda r: -untuned[r.run_id])]
    seen: set[str] = set()
    return [(m, why) for m, why in ranked if not (m in seen or seen.add(m))]  # type: ignore[func-returns-value]


def tune_after_sweep(tracker: TrackerAddress, devices: dict[str, Device], sweep_devices: tuple[str, ...],
                     sweep_id: int, models: dict[str, ModelSource], config: BenchConfig, budget: TuneBudget,
                     db_path: str | Path, cache_dir: Path, work_root: Path, say: Say | None = None) -> list[NightTuning]:
    """Spend ``budget`` on each device key of the sweep (one device per key: its servers are alike), after its
    measurements, one key after another (a sweep over lab hosts gives each key a job on its host instead:
    ``tuning_jobs``). ``models``: the sweep's models by stored name (variant and shapes included). Never raises
    for a device: a failure is a line of the outcome."""
    tell = say or (lambda message: None)
    done: list[NightTuning] = []
    with Store(db_path) as store:
        runs = run_rows(store, sweep_id=sweep_id)
        for device in tuning_devices(devices, sweep_devices, budget, tell).values():
            done += tune_key(tracker, device, sweep_id, runs, models, config, budget, store, cache_dir, work_root, tell)
    return done


def tuning_devices(devices: dict[str, Device], sweep_devices: tuple[str, ...], budget: TuneBudget,
                   tell: Say) -> dict[str, Device]:
    """The device that tunes each key: the first of the budget's devices (or the sweep's) with that key that
    exports a shared library."""
    chosen: dict[str, Device] = {}
    for name in budget.devices or sweep_devices:
        device = devices[name]
        if device.export == "so":
            chosen.setdefault(device.key, device)
        else:
            tell(f"{name}: not tuned (exports {device.export!r}; tuning measures shared libraries)")
    return chosen


def tune_key(tracker: TrackerAddress, device: Device, sweep_id: int, runs: list[Run], models: dict[str, ModelSource],
             config: BenchConfig, budget: TuneBudget, store: Store, cache_dir: Path, work_root: Path,
             tell: Say) -> list[NightTuning]:
    """One device key's night of sweep ``sweep_id``: ``budget.minutes`` on the sweep's models by need
    (``rank_models`` over the sweep's ``runs``), an earlier TVM version's records replayed first on a key that has
    none; what it did stored (``Store.save_night_tuning``), an empty night too."""
    done = _tune_key(tracker, device, runs, models, config, budget, store, cache_dir, work_root, tell)
    store.save_night_tuning(sweep_id, device.name, [dataclasses.asdict(t) for t in done])
    return done


def _tune_key(tracker: TrackerAddress, device: Device, runs: list[Run], models: dict[str, ModelSource],
              config: BenchConfig, budget: TuneBudget, store: Store, cache_dir: Path, work_root: Path,
              tell: Say) -> list[NightTuning]:
    deadline = time.monotonic() + budget.minutes * 60
    ranked = [(m, why) for m, why in rank_models(runs, device.name) if m in models]
    if not ranked:
        tell(f"{device.name}: nothing to tune (no model measured ok tonight)")
        return []
    tell(f"{device.name}: tuning for {budget.minutes:g} min, models by need: "
         + ", ".join(f"{m} ({why})" for m, why in ranked))
    done: list[NightTuning] = []
    replayed = _replay_earlier(tracker, device, models[ranked[0][0]], ranked[0][1], store, cache_dir, config, tell)
    if replayed is not None:
        done.append(replayed)
    for name, why in ranked[:budget.models]:
        left = deadline - time.monotonic()
        if left < MIN_SESSION_S:
            break
        done.append(_tune_one(tracker, device, models[name], why, store, cache_dir, work_root, config,
                              TuneConfig(trials=budget.trials, minutes=left / 60), tell))
    return done


def tuning_jobs(devices: dict[str, Device], sweep_devices: tuple[str, ...], sweep_id: int, budget: TuneBudget,
                tell: Say) -> list[Job]:
    """A sweep over lab hosts: one nightly-tuning job per device key (``tuning_devices``), on the queue of its
    device's host under its device's lock, so keys on different devices tune at the same time (``LabTuning``)."""
    return [Job(TUNE, str(device.lab_host), device.name,
                {"sweep_id": sweep_id, "device": device.name, "budget": dataclasses.asdict(budget)},
                f"tune:{sweep_id}:{key}") for key, device in tuning_devices(devices, sweep_devices, budget, tell).items()]


def tune_queued(db_url: str, devices: dict[str, Device], spec: SweepSpec, sweep_id: int, budget: TuneBudget,
                say: Say | None = None, host_wait_s: float = HOST_WAIT_S) -> list[NightTuning]:
    """A sweep over lab hosts: its keys' tuning jobs (``tuning_jobs``) queued on their hosts and followed to the
    end (``follow_jobs``); what each did as its worker stored it (``LabTuning``), and a "failed" line for a key
    whose job failed or was cancelled (its host gone)."""
    tell = say or (lambda message: None)
    jobs = tuning_jobs(devices, spec.devices, sweep_id, budget, tell)
    lab = LabQueue(db_url)
    lab.defer(jobs)
    tell(f"{len(jobs)} key(s) tuning at once on their hosts: " + ", ".join(f"{j.device} ({j.lab_host})" for j in jobs))
    follow_jobs(db_url, devices, spec, sweep_id, say, host_wait_s)
    with Store(db_url) as store:
        done = [NightTuning(**body) for body in store.night_tunings(sweep_id)]
        stored = store.night_tuned(sweep_id)
    ended = lab.task_statuses(sweep_id, TUNE)
    for job in jobs:
        if job.device not in stored:
            status = ended.get(job.device, "not run")
            done.append(NightTuning(job.device, "", "", "failed", reason=f"its tuning job on lab host {job.lab_host} "
                                    f"ended {status} (the worker's log says why)"))
    return done


@dataclass
class LabTuning:
    """``farm worker``'s nightly-tuning job (``TUNE``): one key's budget, spent on its host by ``tune_key`` with
    the worker's tracker, devices, models and caches; what it did goes to the store (its sessions) and the log."""

    worker: LabWorker
    work_root: Path
    say: Say

    def __call__(self, sweep_id: int, device: str, budget: dict) -> str:
        """The key's tuning while its device's lease is held (#61: a job delivered again tuned the same key twice at
        once, and replayed its records twice): a second delivery waits for the first, then finds its night stored."""
        tuner = self.worker.device(device)
        with self.worker.store() as store:
            if device in store.night_tuned(sweep_id):  # the job delivered again: its key's night is stored
                return "done before"
            with self.worker.leases.hold(store, tuner.name, self.worker.holder(sweep_id, device, "tuning"), None):
                if device in store.night_tuned(sweep_id):  # its first delivery ended while this one waited
                    return "done before"
                spec, _ = self.worker.context(store, sweep_id)
                models = {}
                for name in spec.cell_models():  # a model this host does not load is not tuned; the others are
                    source, problem = self.worker.model_or_problem(spec, name)
                    if problem:
                        self.say(f"{device}: {name} is not tuned: {problem}")
                    else:
                        models[source.name] = source
                done = tune_key(self.worker.tracker, tuner, sweep_id, run_rows(store, sweep_id=sweep_id), models,
                                spec.config, TuneBudget(**{**budget, "devices": tuple(budget.get("devices", ()))}),
                                store, self.worker.cache_dir, self.work_root, self.say)
        return ", ".join(f"{t.model}: {t.status}" for t in done) or "nothing to tune"


def _tune_one(tracker: TrackerAddress, device: Device, model: ModelSource, why: str, store: Store, cache_dir: Path,
              work_root: Path, bench: BenchConfig, config: TuneConfig, tell: Say) -> NightTuning:
    tell(f"{device.name} · {model.name}: tuning ({why})")
    try:
        outcome = tune_model(tracker, device, model, store, work_root, config, progress=lambda m: log.info("%s", m))
    except FarmError as exc:
        tell(f"{device.name} · {model.name}: tuning failed: {exc.message}")
        return NightTuning(device.name, model.name, why, "failed", reason=exc.message)
    if outcome.new_records == 0:
        tell(f"{device.name} · {model.name}: {outcome.trials_done} trial(s), no new records")
        return NightTuning(device.name, model.name, why, "no-new-records", outcome.session_id, 0, outcome.trials_done)
    checked = _validate(tracker, device, model, bench, cache_dir,
                        tuning_set(store, device, without_session=outcome.session_id), tuning_set(store, device))
    store.judge_tune_session(outcome.session_id, checked.kept, checked.reason)
    tell(f"{device.name} · {model.name}: {outcome.trials_done} trial(s), {outcome.new_records} new record(s): "
         f"{checked.reason}")
    return NightTuning(device.name, model.name, why, "kept" if checked.kept else "rejected", outcome.session_id,
                       outcome.new_records, outcome.trials_done, checked.before_s, checked.after_s, checked.reason)


def _replay_earlier(tracker: TrackerAddress, device: Device, model: ModelSource, why: str, store: Store,
                    cache_dir: Path, bench: BenchConfig, tell: Say) -> NightTuning | None:
    """On a key with no records (the night of a TVM upgrade), the same target's records under the newest earlier
    TVM version (``replay_earlier_records``), validated on ``model`` against the untuned model; None when there
    is nothing to replay."""
    replayed = replay_earlier_records(store, device, model)
    if replayed is None:
        return None
    now = (store.tune_session(replayed.session_id) or {}).get("tvm_version", "")
    tell(f"{device.name}: no records for TVM {now}; replaying {replayed.copied} record(s) of TVM "
         f"{replayed.from_version} on {model.name}")
    checked = _validate(tracker, device, model, bench, cache_dir, TuningSet(replayed.key, (), ()),
                        tuning_set(store, device))
    reason = f"TVM {replayed.from_version} → {now}: {checked.reason}"
    store.judge_tune_session(replayed.session_id, checked.kept, reason)
    tell(f"{device.name} · {model.name}: {reason}")
    return NightTuning(device.name, model.name, why, "replayed-kept" if checked.kept else "replayed-rejected",
                       replayed.session_id, replayed.copied, 0, checked.before_s, checked.after_s, reason)


def replay_earlier_records(store: Store, device: Device, model: ModelSource) -> Replay | None:
    """On a tuning key that never had records (the night of a TVM upgrade: keys include the TVM version), the same
    target's records for the same threads and weight prepacking under the newest older TVM version, copied into this
    version's key as a session of their own;
    None when the key has records or nothing earlier exists. The caller validates them and rejects the session if
    they make the model slower."""
    from packaging.version import InvalidVersion, Version

    def older(version: str) -> bool:  # a farm sharing one database across TVM versions never replays a newer one's
        try:
            return Version(version) < Version(TVM_VERSION)
        except InvalidVersion:
            return False

    target = effective_target(device)
    key = device_tuning_key(device, target)
    if store.ever_had_records(key):  # records of its own, or a replay that was rejected: never replayed (again)
        return None
    threads, prepack, layout = (threads_setting(device, target), weight_prepack_setting(device, target),
                                layout_setting(device, target))
    # only the same settings' records under another version: records measured on other threads, or for other
    # workloads (prepacking), neither apply nor mix (#33)
    earlier = next(((k, v) for k, v in store.other_tunings(target, TVM_VERSION)
                    if older(v) and k == tuning_key(target, threads, prepack, tvm=v, layout=layout)), None)
    if earlier is None:
        return None
    from_key, version = earlier
    session_id = store.start_tune_session(device, model, key, target, TVM_VERSION, 0)
    copied = store.copy_tuning(from_key, key, session_id)
    store.finish_tune_session(session_id, TuneStatus.DONE.value, f"replayed {copied} record(s) of TVM {version}", 0)
    return Replay(session_id, copied, version, key)


def _validate(tracker: TrackerAddress, device: Device, model: ModelSource, bench: BenchConfig, cache_dir: Path,
              before: TuningSet, after: TuningSet) -> Validation:
    """Compile ``model`` with each record set. The new set's artifact must run and pass its output check (one
    measurement); then both are measured in ``VALIDATION_ROUNDS`` interleaved rounds (``measure.interleaved_rounds``:
    each round a fresh session and load of both, alternating, so a night's drift hits both alike) and the new set is
    kept when it is not slower across the rounds (``not_slower``). When both sets compile into the same library (the
    session's records beat none of the model's best ones), the set is kept unmeasured."""
    prepared = cell_inputs(model, bench)
    try:
        new = compile_model(model, device, cache_dir, after)
    except FarmError as exc:
        return Validation(False, None, None, f"rejected: the new records do not compile ({exc.message})")
    old_error = ""  # why the previous set did not compile or run (then ``old`` is None)
    try:
        old: Artifact | None = compile_model(model, device, cache_dir, before)
    except FarmError as exc:
        old, old_error = None, exc.message
    if old is not None and old.file_digest == new.file_digest:  # measuring one library twice would judge noise
        return Validation(True, None, None, "kept: the new records change none of this model's code (the same "
                                            "library with either set): nothing to validate")
    checked = measure_cell(tracker, device, model, new, bench, prepared=prepared)
    if checked.status != "ok" or (checked.check is not None and checked.check.status == "failed"):
        why = checked.reason if checked.status != "ok" else f"its output check failed ({checked.check.detail})"
        return Validation(False, None, None, f"rejected: measured with the new records, {why[:300]}")
    if old is not None:
        try:
            old_rounds, new_rounds = interleaved_rounds(tracker, device, old, new, prepared[0], VALIDATION_ROUNDS,
                                                        bench)
        except FarmError as exc:
            old, old_error = None, exc.message
    if old is None:  # the previous set does not compile or run: the new one, which does, is better
        after_s = median(checked.steady_samples_s)
        return Validation(True, None, after_s,
                          f"kept: {after_s * 1e3:.3g} ms (the previous set did not run: {old_error})")  # type: ignore[operator]
    kept = not_slower(old_rounds, new_rounds)
    before_s, after_s = nonempty_median(old_rounds), nonempty_median(new_rounds)
    change = f"{before_s / after_s:.2f}× faster" if kept else f"{after_s / before_s:.2f}× slower: records not used"
    return Validation(kept, before_s, after_s, f"{'kept' if kept else 'rejected'}: {before_s * 1e3:.3g} ms → "
                                               f"{after_s * 1e3:.3g} ms ({change}; {len(old_rounds)} interleaved rounds)")
