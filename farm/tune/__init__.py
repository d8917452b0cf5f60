"""``farm tune``: MetaSchedule tuning on a device through the tracker; records kept in the store.

The only package that drives ``tvm.s_tir.meta_schedule``'s search. Candidates are built here for the device's
target (exported with the device's toolchain, ``compile.export_library``), measured on the device by MetaSchedule's
RPC runner, ranked by the XGBoost cost model.

The store is the source of truth for records: each session starts by writing the store's records for the device's
tuning key (effective target + TVM version) into a fresh MetaSchedule JSON database, and copies every new record
back after each measured batch and at its end. Ctrl-C, a crash or a lost device keeps every measured record;
running the same command again continues from them (trials add up).

=================  ==========================================================================================
``config``         ``TuneConfig`` and the numbers its defaults come from (``DEFAULT_TRIALS``, ``RUNNER_TIMEOUT_S``)
``steps``          ``tune_model``: check, profile, plan, search, finish; ``list_tasks``
``plan``           what the check found (``Tuning``), where the trials go (``Plan``), the passes of a search
``session``        ``TuneSession`` (status, stop reason, each task's progress; ``stopping``, ``on_batch``),
                   ``TuneStatus``, ``TuneOutcome``, and the MetaSchedule callback that hands it each batch
``search``         step 4: MetaSchedule's ``tune_tasks`` calls, pass after pass
``metaschedule``   the plumbing: builders, runner, ``PassScheduler``, the session factory, workers' pools
``database``       the store's records into MetaSchedule's database and back, the untuned guard, the seeds,
                   and the one rule for a record's time (``record_s``)
``tuning_set``     the store's records for a device (``tuning_set``), what compiles and sessions start from
``task_profile``   each task's untuned time on the device, and the trials it gets
``costmodel``      MetaSchedule's XGBoost cost model as plain data, kept in the store between sessions
``packs``          records packs: ``export_database``, ``import_database``
=================  ==========================================================================================

Importing this package imports no TVM: ``config``'s defaults are read by the CLI's parser; the rest is loaded
when first named (``from farm.tune import tune_model``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from farm.tune.config import DEFAULT_TRIALS, RUNNER_TIMEOUT_S, TuneConfig, runner_timeout_for

if TYPE_CHECKING:
    from farm.tune.metaschedule import BUILD_FAILED, load_tensor_intrinsics
    from farm.tune.packs import PACK_FORMAT, PACK_MANIFEST, export_database, import_database
    from farm.tune.plan import overlapped_calls, search_passes
    from farm.tune.session import TaskProgress, TuneOutcome, TuneSession, TuneStatus
    from farm.tune.steps import list_tasks, tune_model

_LAZY = {
    "BUILD_FAILED": "metaschedule", "load_tensor_intrinsics": "metaschedule",
    "PACK_FORMAT": "packs", "PACK_MANIFEST": "packs", "export_database": "packs", "import_database": "packs",
    "overlapped_calls": "plan", "search_passes": "plan",
    "TaskProgress": "session", "TuneOutcome": "session", "TuneSession": "session", "TuneStatus": "session",
    "list_tasks": "steps", "tune_model": "steps",
}

__all__ = ["DEFAULT_TRIALS", "RUNNER_TIMEOUT_S", "TuneConfig", "runner_timeout_for",  # and, loaded when named:
           "BUILD_FAILED", "load_tensor_intrinsics", "PACK_FORMAT", "PACK_MANIFEST", "export_database",
           "import_database", "overlapped_calls", "search_passes", "TaskProgress", "TuneOutcome", "TuneSession",
           "TuneStatus", "list_tasks", "tune_model"]


def __getattr__(name: str) -> Any:
    """The public names of the modules that import TVM, imported when first asked for."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
