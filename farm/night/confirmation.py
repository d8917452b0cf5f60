"""A sweep's regressions: its verdicts stored as alerts, grouped into findings (``farm.analysis.findings``) and, when
asked, each finding confirmed on its devices by rerunning a few representative series' baseline and tonight's
artifacts interleaved, within a device-time budget; the findings stored with their triage state.

A night's pipeline (``night.pipeline``, `farm sweep`) and ``farm regressions`` call ``review_night``: it judges the
night and stores its findings, with or without the reruns of ``--confirm``; the CLI only parses and prints. Works on
records: the artifacts and the model's signature come back from the store as ``Artifact`` and ``ModelSource``.

Confirmation on a budget (#22): 600 steady candidates of a mass regression, each rerun for 8-16 rounds, are hours of
device time. A finding is confirmed by its representatives (``findings.representatives``: the largest z, spread over
its devices or models), findings in rank order, until ``budget_min`` device-minutes are spent; what was left
unconfirmed is stored with the sweep (``Store.save_budget``) and the report says so. Upgrade findings are never rerun
(a device's server runs one TVM): "unconfirmable: runtime changed".
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable

from farm.errors import FarmError
from farm.analysis.findings import (DEFAULT_BUDGET_MIN, UNCONFIRMABLE, Finding, record, stored_findings, sweep_findings,
                                   sweep_verdicts)
from farm.records import Alert, BenchConfig, Device, Progress, TrackerAddress
from farm.analysis.regress import METHOD, SeriesVerdict, confirm
from farm.analysis.results import run_rows
from farm.analysis.runs import Run
from farm.analysis.series import by_sweep
from farm.store import Store

# what a rerun holds its device with while it measures (#61: a lab's --confirm reruns ran beside its workers'
# cells on the same device): ``lab.leases.device_holds``, the device's lease where a lab's workers share it
DeviceHold = Callable[[Device], AbstractContextManager[object]]


@dataclass(frozen=True)
class SweepRegressions:
    """What ``review_night`` found in a sweep: its alerts, its findings (best first, with triage state) and
    the confirmation budget (budget_s, spent_s, rerun, left_unconfirmed)."""

    sweep_id: int
    alerts: list[Alert]
    findings: list[Finding]
    budget: dict[str, Any]
    rows: list[Run] | None = field(default=None, repr=False, compare=False)  # the history it judged (None: not read)


def review_night(store: Store, sweep_id: int | None, confirm_candidates: bool = False,
                 tracker: TrackerAddress | None = None, devices: dict[str, Device] | None = None,
                 config: BenchConfig = BenchConfig(), progress: Progress | None = None,
                 budget_min: float = DEFAULT_BUDGET_MIN, hold: DeviceHold | None = None,
                 judged_as_stored: bool = False) -> SweepRegressions:
    """Store the sweep's (the latest's when ``sweep_id`` is None) candidate and improved verdicts as alerts, upgrade
    verdicts beside them (``findings.sweep_verdicts``); group them into findings; with ``confirm_candidates``,
    rerun each finding's representatives on their devices (``tracker``, ``devices``; each held by ``hold`` while
    it measures) while ``budget_min`` device-minutes last; store the findings and the budget. With
    ``judged_as_stored`` (`farm regressions` without --confirm), a night already judged (``Store.judged``) is read as
    its review stored it, never judged again."""
    sweep = store.sweep(sweep_id)
    if sweep is None:
        raise FarmError("no sweep in the database yet" if sweep_id is None else f"no sweep {sweep_id}",
                        "run farm sweep first; regressions compare sweeps")
    sweep_id = int(sweep["id"])
    if judged_as_stored and not confirm_candidates and store.judged(sweep_id):
        stored, stored_alerts = stored_findings(store, sweep_id), store.alerts(sweep_id)
        if stored is not None and _as_judged(stored, stored_alerts):
            return SweepRegressions(sweep_id, stored_alerts, stored, _budget(store, sweep_id, stored))
    rows = run_rows(store)
    verdicts = sweep_verdicts(rows, sweep_id, by_sweep(rows, keep_unstable_of=sweep_id))
    moved = [v for v in verdicts if v.status in ("candidate", "improved", "changed")]  # changed: planned memory
    upgrades = [(verdict.baseline or {}).get("context_change") for verdict in moved]
    store.save_alerts(moved, METHOD.to_json(), [verdict.status if up else None for verdict, up in zip(moved, upgrades)],
                      [{"reason": f"{UNCONFIRMABLE} ({up})"} if up else None for up in upgrades])
    findings = sweep_findings(store, sweep_id, rows, verdicts)
    budget_s, spent_s, rerun = budget_min * 60.0, 0.0, 0
    if confirm_candidates:
        by_series = {_series(v): v for v in moved}
        alerts = {a.id: a for a in store.alerts(sweep_id)}
        for finding in findings:
            for alert_id in finding.representatives if finding.direction == "slower" else ():
                alert = alerts[alert_id]
                rerunnable = by_series.get(_series(alert))
                if rerunnable is None or "rounds" in alert.confirmation or spent_s >= budget_s:
                    continue
                started = time.monotonic()
                status, detail = _confirm_one(store, tracker, devices or {}, rerunnable, config, progress, hold)
                spent_s += time.monotonic() - started
                rerun += 1
                store.save_alert(rerunnable, METHOD.to_json(), status, detail)
        spent_s, rerun = _rerun_the_rest(store, tracker, devices or {}, verdicts, findings, config, progress,
                                         budget_s, spent_s, rerun, hold)
        findings = sweep_findings(store, sweep_id, rows, verdicts)  # confirmation moves their evidence and rank
    if confirm_candidates:  # a review without reruns keeps what an earlier one spent
        store.save_budget(sweep_id, budget_s, spent_s, rerun, _left_unconfirmed(findings))
    budget = _budget(store, sweep_id, findings)
    return SweepRegressions(sweep_id, store.alerts(sweep_id), record(store, sweep_id, findings), budget, rows)


def _as_judged(findings: list[Finding], alerts: list[Alert]) -> bool:
    """Whether the stored findings still say what their alerts say: each one's alerts there, with the reruns it
    counted (a rerun stored since, outside a review, is judged again)."""
    by_id = {a.id: a for a in alerts}
    for finding in findings:
        held = [by_id.get(i) for i in finding.alerts]
        reruns = [a for a in held if a is not None and "rounds" in a.confirmation]
        if None in held or (len(reruns), sum(a.status == "confirmed" for a in reruns),
                            sum(a.status == "rejected" for a in reruns)) != (finding.reruns, finding.confirmed,
                                                                            finding.rejected):
            return False
    return True


def _left_unconfirmed(findings: list[Finding]) -> int:
    return sum(1 for f in findings if f.direction == "slower" and f.representatives and not f.reruns)


def _budget(store: Store, sweep_id: int, findings: list[Finding]) -> dict[str, Any]:
    """The sweep's stored confirmation budget (none spent when none was stored) and what its findings left
    unconfirmed."""
    spent = store.budget(sweep_id) or {"budget_s": 0.0, "spent_s": 0.0, "rerun": 0}
    return {**spent, "left_unconfirmed": _left_unconfirmed(findings)}


def _rerun_the_rest(store: Store, tracker: TrackerAddress | None, devices: dict[str, Device],
                    verdicts: list[SeriesVerdict], findings: list[Finding], config: BenchConfig,
                    progress: Progress | None, budget_s: float, spent_s: float, rerun: int,
                    hold: DeviceHold | None = None) -> tuple[float, int]:
    """What the budget has left goes to the slower steady series no finding holds, largest z first: candidates left
    alone (under a single series' bound), then the screen's second tier (``Method.rescreen``: "screened", never an
    alert). A rerun candidate keeps its verdict in its alert; a screened series is stored only when confirmed (a
    confirmed alert, a finding by itself), so a quiet night's reruns leave nothing but the budget they spent."""
    held = {i for f in findings for i in f.alerts}
    stored = {_series(a): a for a in store.alerts(verdicts[0].sweep_id)} if verdicts else {}
    rest = [v for v in verdicts if v.metric == "steady" and v.runtime == "tvm"
            and not (v.baseline or {}).get("context_change") and (  # an upgrade is never rerun
        v.status == "screened" or v.status == "candidate" and (a := stored.get(_series(v))) is not None
        and a.id not in held and "rounds" not in a.confirmation)]
    for verdict in sorted(rest, key=lambda v: (v.status != "candidate", -(v.z or 0.0))):
        if spent_s >= budget_s:
            break
        started = time.monotonic()
        status, detail = _confirm_one(store, tracker, devices, verdict, config, progress, hold)
        spent_s += time.monotonic() - started
        rerun += 1
        if verdict.status == "candidate" or status == "confirmed":
            store.save_alert(verdict, METHOD.to_json(), status,
                             {**detail, "screen": f"second tier (z >= {METHOD.rescreen['steady'].z:g})"}
                             if verdict.status == "screened" else detail)
    return spent_s, rerun


def _series(row: Alert | SeriesVerdict) -> tuple:
    return row.device, row.model, row.tuned, row.runtime, row.metric


def _confirm_one(store: Store, tracker: TrackerAddress | None, devices: dict[str, Device], verdict: SeriesVerdict,
                 config: BenchConfig, progress: Progress | None,
                 hold: DeviceHold | None = None) -> tuple[str, dict[str, Any]]:
    from farm.measure import interleaved_rounds  # here: TVM (and the model libraries) take seconds to import,
    from farm.models import make_inputs  # and only a rerun on the device needs them

    if verdict.artifact_key == verdict.baseline_artifact_key:
        return "drift", {"reason": "same artifact as the baseline: the device changed, not the model"}
    old, new = (store.artifact_record(key or "", verdict.model)
                for key in (verdict.baseline_artifact_key, verdict.artifact_key))
    if old is None or new is None or not (Path(old.path).exists() and Path(new.path).exists()):
        return "unknown", {"reason": "an artifact is no longer in the cache; cannot rerun"}
    device = devices.get(verdict.device)
    if device is None or tracker is None:
        return "unknown", {"reason": f"device {verdict.device!r} is not in the inventory"}
    # inputs from the stored signature of tonight's model: the file may have changed since
    model = store.model_signature(verdict.model_digest, verdict.model)
    if model is None:
        return "unknown", {"reason": "the model's input signature is not in the store"}
    inputs = make_inputs(model, config.seed)
    if progress:
        progress(device.name, verdict.model, "confirm", "old and new artifacts interleaved")
    try:
        with (hold or (lambda _device: nullcontext()))(device):  # a device held past LEASE_WAIT_S: unknown
            status, comparison = confirm(lambda n: interleaved_rounds(tracker, device, old, new, inputs, n, config))
            detail = {"method": "rounds: a fresh load of both artifacts per round, interleaved; Wilcoxon signed-rank "
                                "on the per-round log ratios", **asdict(comparison)}
            if status == "confirmed" and verdict.baseline_run_id is not None and \
                    (baseline := store.profile(verdict.baseline_run_id)) is not None and baseline.status == "ok":
                detail["kernels"] = _rerun_kernels(tracker, device, old, new, inputs, config, progress, verdict.model)
    except FarmError as exc:
        return "unknown", {"reason": exc.message}
    return status, detail


def _rerun_kernels(tracker: TrackerAddress, device: Device, old, new, inputs, config: BenchConfig,
                   progress: Progress | None, model: str) -> dict[str, Any]:
    """A confirmed change whose baseline run was profiled: both artifacts profiled again on the device, one after the
    other, and which kernels moved (``kernel_diff``); or why not."""
    from farm.analysis.kernel_diff import kernel_diff
    from farm.measure.profile import profile_artifact

    if progress:
        progress(device.name, model, "confirm", "profile of the old and new artifacts")
    before, after = (profile_artifact(tracker, device, artifact, inputs, config) for artifact in (old, new))
    missing = next((p for p in (before, after) if p.status != "ok"), None)
    if missing is not None:
        return {"status": "not available", "reason": missing.reason}
    return {"status": "ok", **kernel_diff(before, after, same_artifact=False, sessions_apart=False).to_json()}
