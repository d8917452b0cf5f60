"""A sweep's regressions: its verdicts stored as alerts and, when asked, each steady-latency candidate
confirmed on its device by rerunning the baseline's and tonight's artifacts interleaved.

``farm sweep --confirm`` and ``farm regressions`` call ``detect_and_confirm``; the CLI only parses and
prints. Works on records: the artifacts and the model's signature come back from the store as
``Artifact`` and ``ModelSource``.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from farm.errors import FarmError
from farm.records import Alert, BenchConfig, Device, TrackerAddress
from farm.regress import METHOD, SeriesVerdict, confirm, detect
from farm.results import run_rows
from farm.store import Store

Progress = Callable[[str, str, str, str], None]  # device, model, step, detail


def detect_and_confirm(store: Store, sweep_id: int | None, confirm_candidates: bool = False,
                       tracker: TrackerAddress | None = None, devices: dict[str, Device] | None = None,
                       config: BenchConfig = BenchConfig(), progress: Progress | None = None) -> tuple[list[Alert], int]:
    """Store the sweep's (the latest's when ``sweep_id`` is None) candidate and improved verdicts as alerts;
    with ``confirm_candidates``, rerun each steady candidate on its device (``tracker``, ``devices``) and store
    the confirmation. Returns the sweep's alerts and its id."""
    sweep = store.sweep(sweep_id)
    if sweep is None:
        raise FarmError("no sweep in the database yet" if sweep_id is None else f"no sweep {sweep_id}",
                        "run farm sweep first; regressions compare sweeps")
    verdicts = [v for v in detect(run_rows(store), sweep["id"]) if v.status in ("candidate", "improved")]
    for verdict in verdicts:
        store.save_alert(verdict, METHOD.to_json())
        if not (confirm_candidates and verdict.status == "candidate" and verdict.metric == "steady"):
            continue
        if verdict.runtime != "tvm":  # a reference runtime's series has no artifacts to rerun: the control, left
            continue                     # as the candidate it is (it says whether the device or the model moved)
        status, detail = _confirm_one(store, tracker, devices or {}, verdict, config, progress)
        store.save_alert(verdict, METHOD.to_json(), status, detail)
    return store.alerts(sweep["id"]), sweep["id"]


def _confirm_one(store: Store, tracker: TrackerAddress | None, devices: dict[str, Device], verdict: SeriesVerdict,
                 config: BenchConfig, progress: Progress | None) -> tuple[str, dict[str, Any]]:
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
        status, comparison = confirm(lambda n: interleaved_rounds(tracker, device, old, new, inputs, n, config))
    except FarmError as exc:
        return "unknown", {"reason": exc.message}
    return status, {"method": "rounds: a fresh load of both artifacts per round, interleaved; Wilcoxon signed-rank "
                              "on the per-round log ratios", **asdict(comparison)}
