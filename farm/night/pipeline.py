"""A night as a library (#66): its steps in order, with typed inputs (``NightPlan``) and a typed result (``Night``).

1. measure: every cell of the spec, on this host (``sweep.run_sweep``, one sweep at a time on a file database: its
   confirmation reruns and tuning measure the devices too) or queued for the lab hosts' workers and followed
   (``lab.follow``; ``detach``: queued, then the night ends there);
2. review: the sweep's alerts grouped into findings, confirmed on the devices when asked (``confirmation``), stored;
3. notify: the webhook gets the night's digest when it has new findings (``views.digest``: never the night's fate);
4. tune: the sweep file's [tune] budget (``tuning``: here, or a job per key on its device's lab host);
5. report: the sweep's HTML report, unless ``report_dir`` is None.

`farm sweep` parses its options into a plan, calls ``run_night`` and prints the result; tools/nightly.sh runs
`farm sweep`. From Python, with an inventory and a results database (docs/nightly-and-lab.md "A night from Python")::

    from farm.inventory import load_inventory
    from farm.night import NightPlan, run_night
    from farm.records import SweepSpec

    inventory = load_inventory("devices.toml")
    night = run_night(NightPlan(inventory, SweepSpec(("x86-local",), ("mlp",), None), "results.db",
                                cache_dir=Path(".farm/cache"), tune_dir=Path(".farm/tune")))
    for finding in night.reviewed.findings:
        print(finding.sentence)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from farm.lab.jobs import HOST_WAIT_S
from farm.records import DEFAULT_BUDGET_MIN, Inventory, Progress, Say, SweepSpec

if TYPE_CHECKING:
    from farm.night.confirmation import SweepRegressions
    from farm.night.tuning import NightTuning
    from farm.sweep import SweepOutcome
    from farm.tune.config import TuneBudget



@dataclass(frozen=True)
class NightPlan:
    """What a night does: the sweep (``spec``; ``sweep_id`` to resume one), where it stores and caches, whether it
    confirms, tunes (``budget``) and reports (``report_dir``; None: no report)."""

    inventory: Inventory
    spec: SweepSpec
    db: str
    cache_dir: Path
    tune_dir: Path
    sweep_id: int | None = None
    budget: "TuneBudget | None" = None
    confirm: bool = False
    confirm_budget_min: float = DEFAULT_BUDGET_MIN  # device-minutes the confirmation's reruns may spend
    report_dir: Path | None = None
    detach: bool = False  # a lab's sweep: queued, then not followed
    host_wait_s: float = HOST_WAIT_S
    progress: Progress | None = None  # each cell's steps
    say: Say = lambda line: None


@dataclass(frozen=True)
class Night:
    """What a night did. ``outcome`` None: queued and detached (``sweep_id`` says which); ``queued``: over lab
    hosts; ``notified``: what the webhook said ('' when it was not called)."""

    sweep_id: int
    queued: bool
    outcome: "SweepOutcome | None" = None
    reviewed: "SweepRegressions | None" = None
    tuning: tuple["NightTuning", ...] = ()
    report: Path | None = None
    notified: str = ""


def run_night(plan: NightPlan) -> Night:
    """Measure, review, notify, tune and report, in that order (the module's docstring)."""
    from farm.sweep import run_sweep
    from farm.lab.follow import queued_devices
    from farm.sweep.run import one_sweep_at_a_time

    queued = queued_devices(plan.inventory.devices, plan.spec.devices)
    if queued and plan.budget:  # over lab hosts each key tunes on its device's host: the same rule for [tune]'s
        queued_devices(plan.inventory.devices, (*plan.spec.devices, *plan.budget.devices))
    if queued:
        sweep_id, outcome = _queued_sweep(plan)
        return Night(sweep_id, True) if outcome is None else _after(plan, outcome, queued)
    with one_sweep_at_a_time(plan.db):  # its --confirm reruns and its tuning measure the devices too
        outcome = run_sweep(plan.inventory.tracker, plan.inventory.devices, plan.spec, plan.db, plan.cache_dir,
                            progress=plan.progress, sweep_id=plan.sweep_id)
        return _after(plan, outcome, queued)


def _queued_sweep(plan: NightPlan) -> "tuple[int, SweepOutcome | None]":
    """A sweep over lab hosts: queued for their workers, then followed until every job ended; its id, and its
    outcome (None when detached)."""
    from farm.lab.follow import enqueue_sweep, follow_sweep

    start = time.monotonic()
    devices = plan.inventory.devices
    sweep_id, spec = enqueue_sweep(plan.db, devices, plan.spec, plan.sweep_id)
    plan.say(f"sweep {sweep_id}: queued for the workers of lab host(s) "
             f"{', '.join(sorted({str(devices[d].lab_host) for d in spec.devices}))}")
    if plan.detach:
        return sweep_id, None
    return sweep_id, follow_sweep(plan.db, devices, spec, sweep_id, plan.say, start, plan.host_wait_s)


def _after(plan: NightPlan, outcome: "SweepOutcome", queued: bool) -> Night:
    """Review, notify, tune and report a measured sweep."""
    from farm.night.confirmation import review_night
    from farm.views.digest import notify_night
    from farm.store import Store
    from farm.lab.leases import device_holds

    inventory, spec = plan.inventory, plan.spec
    report = None
    with Store(plan.db) as store:
        reviewed = review_night(store, outcome.sweep_id, plan.confirm, inventory.tracker, inventory.devices,
                                spec.config, plan.progress, plan.confirm_budget_min,
                                device_holds(plan.db, store, f"farm sweep {outcome.sweep_id} --confirm"))
        dashboard_url = inventory.dashboard_url or os.environ.get("FARM_DASHBOARD_URL")
        notified = notify_night(store, outcome.sweep_id, inventory.notify_url, dashboard_url)
        if notified:
            plan.say(f"notify: {notified}")  # the webhook ([notify] url): never the night's fate
        tuning = () if not plan.budget else tuple(_queued_tuning(plan, outcome.sweep_id) if queued
                                                  else _tuning(plan, outcome.sweep_id))
        if plan.report_dir is not None:
            from farm.views.report import render_report

            report = render_report(store, plan.report_dir / f"sweep-{outcome.sweep_id}.html",
                                   title=f"farm sweep {outcome.sweep_id}", sweep_id=outcome.sweep_id,
                                   dashboard_url=dashboard_url,  # the review's history, unless tuning stored runs
                                   history=None if plan.budget else reviewed.rows)
    # the review's history served the report: the night's result does not keep it
    return Night(outcome.sweep_id, queued, outcome, replace(reviewed, rows=None), tuning, report, notified)


def _queued_tuning(plan: NightPlan, sweep_id: int) -> list:
    from farm.night.tuning import tune_queued

    assert plan.budget is not None
    return tune_queued(plan.db, plan.inventory.devices, plan.spec, sweep_id, plan.budget,
                       lambda message: plan.say(f"tune: {message}"), plan.host_wait_s)


def _tuning(plan: NightPlan, sweep_id: int) -> list:
    """The sweep file's [tune] budget, spent after measuring and confirming (``night.tuning.tune_after_sweep``)."""
    from farm.models import load_model_variant
    from farm.night.tuning import tune_after_sweep

    assert plan.budget is not None
    spec, inventory = plan.spec, plan.inventory
    models = {}
    for name in spec.cell_models():
        model = load_model_variant(name, spec.shapes_of(name))
        models[model.name] = model
    return tune_after_sweep(inventory.tracker, inventory.devices, spec.devices, sweep_id, models, spec.config,
                            plan.budget, plan.db, plan.cache_dir, plan.tune_dir,
                            lambda message: plan.say(f"tune: {message}"))  # a few lines a night
