"""Frozen records passed between farm's modules, by subject; every name is also importable from here
(``from farm.records import Device``). Imports nothing from farm but the error tree (``errors.py``).

Named ``records`` rather than ``model`` so it is never confused with the ML models that ``models/`` loads.

    targets.py      the target kinds and tags, ``target_kind``, ``cpu_arch``
    alerts.py       the read side's ``Record`` base, ``Alert``, ``TRIAGE_STATES``
    device.py       ``Device``, ``Inventory``, ``TrackerAddress``, ``HostCPU``
    settings.py     a device's settings rules (threads, weight prepacking, layout, cold weights)
    builds.py       ``ModelSource``, variants, ``Artifact``, ``TuningSet``
    measurement.py  ``BenchConfig``, ``BenchResult``, profiles, copies, checks
    sweeps.py       ``SweepSpec``, a cell's standing, leases, stored attempts
"""

from farm.records.targets import (CPU_TARGETS, EXPORT_FORMATS, GPU_TARGETS, TAG_KINDS, TARGET_HINT, TARGET_KINDS,
                                  cpu_arch, describe_target, tag_kind, target_kind)
from farm.records.alerts import Alert, Record, TRIAGE_STATES
from farm.records.device import Device, HostCPU, Inventory, TrackerAddress, split_address
from farm.records.settings import (COLD_RUNS, COLD_TIMING, COLD_WEIGHTS_RULE, CandidateTiming, LAYOUTS, LAYOUT_RULE,
                                   PREPACK_RULE, THREADS_RULE, Threads, WARM_TIMING, candidate_timing, cold_weights,
                                   layout_setting, online_cpus, threads_setting, weight_prepack_setting)
from farm.records.builds import (Artifact, CALIBRATION_METHODS, InputSpec, ModelSource, SavedCostModel, TuningSet,
                                 VARIANTS, split_variant)
from farm.records.measurement import (BenchConfig, BenchResult, CheckResult, CopyCurve, CopyPoint, CopyTiming,
                                      KernelProfile, KernelTime, Progress, Say, StepProgress, utc_now)
from farm.records.sweeps import (CellStanding, DEFAULT_BUDGET_MIN, Lease, OFFLINE_ATTEMPT, RETRYABLE_STEPS,
                                 RunToStore, StoredAttempt, SweepBuild, SweepSpec)

__all__ = [
    "CPU_TARGETS", "EXPORT_FORMATS", "GPU_TARGETS", "TAG_KINDS", "TARGET_HINT", "TARGET_KINDS", "cpu_arch",
    "describe_target", "tag_kind", "target_kind", "Alert", "Record", "TRIAGE_STATES", "Device", "HostCPU",
    "Inventory", "TrackerAddress", "split_address", "COLD_RUNS", "COLD_TIMING", "COLD_WEIGHTS_RULE",
    "CandidateTiming", "LAYOUTS", "LAYOUT_RULE", "PREPACK_RULE", "THREADS_RULE", "Threads", "WARM_TIMING",
    "candidate_timing", "cold_weights", "layout_setting", "online_cpus", "threads_setting", "weight_prepack_setting",
    "Artifact", "CALIBRATION_METHODS", "InputSpec", "ModelSource", "SavedCostModel", "TuningSet", "VARIANTS",
    "split_variant", "BenchConfig", "BenchResult", "CheckResult", "CopyCurve", "CopyPoint", "CopyTiming",
    "KernelProfile", "KernelTime", "Progress", "Say", "StepProgress",
    "utc_now", "CellStanding", "DEFAULT_BUDGET_MIN", "Lease", "OFFLINE_ATTEMPT",
    "RETRYABLE_STEPS", "RunToStore", "StoredAttempt", "SweepBuild", "SweepSpec"
]
