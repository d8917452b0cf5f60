"""The main job on an embedded default: private tracker, two local devices, built-in models, and each
device a kind offers when this host can serve it (an OpenCL device where this host has an OpenCL
implementation and TVM's OpenCL runtime sources: the GPU path).

Starts everything it needs on free loopback ports, benchmarks (untuned TVM beside onnxruntime, threads stated),
then what farm is for: a short tuning session on the host device, on the model where it pays (``DEMO_TUNING``),
and that model measured again with the new records beside its untuned run and the reference; stores, reports
(the report holds the untuned and the tuned row), and stops what it started, whatever happens (``stopped_at_end``:
on SIGTERM too).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from farm.devices import bring_up, kinds
from farm.inventory import parse_inventory
from farm.models import load_model
from farm.records import BenchConfig, Inventory, TrackerAddress
from farm.views.report import render_report, report_file
from farm.procs.supervise import free_port, stopped_at_end
from farm.rpc.launch import exited_at_start, start_tracker
from farm.rpc.tracker import wait_for_servers
from farm.store import Store
from farm.sweep import CellResult, Progress, bench_cell, run_matrix
from farm.tune.config import session_trials

DEMO_MODELS = ("mlp", "convnet")


@dataclass(frozen=True)
class DemoTuning:
    """The demo's tuning session: which device and model, for how long (a minute on 2 cores: the demo's story,
    not a tuning budget; tools/bench_tuning.py measures real ones)."""

    device: str = "host-native"
    model: str = "convnet"
    minutes: float = 0.75


DEMO_TUNING = DemoTuning()


@dataclass(frozen=True)
class TunedCell:
    """The demo's model before and after its tuning session, on the same device, in this run."""

    untuned: CellResult
    tuned: CellResult
    trials: int
    seconds: float
    status: str


@dataclass(frozen=True)
class DemoOutcome:
    db_path: str | Path
    report_path: Path
    cells: list[CellResult]
    seconds: float
    stopped_pids: list[int]
    tuning: TunedCell | None = None  # None: the demo's models leave out the tuned one, or tuning=None was asked


def run_demo(
    db_path: str | Path, report_dir: Path, state_dir: Path, cache_dir: Path, models: tuple[str, ...] = DEMO_MODELS,
    config: BenchConfig = BenchConfig(), progress: Progress | None = None, tuning: DemoTuning | None = DEMO_TUNING,
) -> DemoOutcome:
    start = time.monotonic()
    text = resources.files("farm").joinpath("demo.toml").read_text()
    text += "".join(kind.demo_entry() for kind in kinds().values())
    inventory = parse_inventory(text, "farm/demo.toml (embedded)")
    sources = [load_model(name) for name in models]  # bad model names fail before anything starts
    port = free_port()
    tracker = TrackerAddress("127.0.0.1", port)
    run_dir = state_dir / f"demo-{port}"
    with stopped_at_end() as started:
        if progress:
            progress("-", "-", "tracker", f"starting on {tracker}")
        started.start(start_tracker, tracker.host, port, run_dir)
        for device in inventory.devices.values():
            started.start(bring_up, device, tracker, run_dir)
        wait_for_servers(tracker, {d.key: 1 for d in inventory.devices.values()}, timeout_s=60, give_up=exited_at_start(started))
        with Store(db_path) as store:
            cells = run_matrix(tracker, list(inventory.devices.values()), sources, store, cache_dir, config, progress)
            tuned = _tune(tracker, inventory, cells, store, run_dir, cache_dir, config, tuning, progress)
            report = render_report(store, report_file(report_dir, "demo"), title="farm demo: local devices × built-in models")
    return DemoOutcome(db_path, report, cells, time.monotonic() - start, [r.pid for r in started], tuned)


def _tune(tracker: TrackerAddress, inventory: Inventory, cells: list[CellResult], store: Store, run_dir: Path,
          cache_dir: Path, config: BenchConfig, tuning: DemoTuning | None, progress: Progress | None) -> TunedCell | None:
    """The demo's tuning session and the tuned model's cell, beside its untuned cell of the matrix."""
    from farm.tune import TuneConfig, tune_model

    untuned = next((c for c in cells if tuning and (c.result.device, c.result.model) == (tuning.device, tuning.model)
                    and c.result.status == "ok"), None)
    if tuning is None or untuned is None:
        return None
    device = inventory.devices[tuning.device]
    model = load_model(tuning.model)
    say = (lambda message: progress(device.name, model.name, "tune", message)) if progress else None
    outcome = tune_model(tracker, device, model, store, run_dir / "tune",
                         TuneConfig(trials=session_trials(None, tuning.minutes), minutes=tuning.minutes), say)
    tuned = bench_cell(tracker, device, model, store, cache_dir, config, progress=progress)
    return TunedCell(untuned, tuned, outcome.trials_done, outcome.seconds, outcome.status)
