"""The main job on an embedded default: private tracker, two local devices, built-in models, and each
device a kind offers when this host can serve it (an OpenCL device where this host has an OpenCL
implementation and TVM's OpenCL runtime sources: the GPU path).

Starts everything it needs on free loopback ports, benchmarks, stores, reports, and
stops what it started (in ``finally``), whatever happens in between.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from farm.devices import bring_up, kinds
from farm.inventory import parse_inventory
from farm.models import load_model
from farm.records import BenchConfig, TrackerAddress
from farm.report import render_report, report_file
from farm.rpc.processes import free_port, start_tracker, stop_process
from farm.rpc.tracker import wait_for_servers
from farm.store import Store
from farm.sweep import CellResult, Progress, run_matrix

DEMO_MODELS = ("mlp", "convnet")


@dataclass(frozen=True)
class DemoOutcome:
    db_path: str | Path
    report_path: Path
    cells: list[CellResult]
    seconds: float
    stopped_pids: list[int]


def run_demo(
    db_path: str | Path, report_dir: Path, state_dir: Path, cache_dir: Path, models: tuple[str, ...] = DEMO_MODELS,
    config: BenchConfig = BenchConfig(), progress: Progress | None = None,
) -> DemoOutcome:
    start = time.monotonic()
    text = resources.files("farm").joinpath("demo.toml").read_text()
    text += "".join(kind.demo_entry() for kind in kinds().values())
    inventory = parse_inventory(text, "farm/demo.toml (embedded)")
    sources = [load_model(name) for name in models]  # bad model names fail before anything starts
    port = free_port()
    tracker = TrackerAddress("127.0.0.1", port)
    run_dir = state_dir / f"demo-{port}"
    started = []
    try:
        if progress:
            progress("-", "-", "tracker", f"starting on {tracker}")
        started.append(start_tracker(tracker.host, port, run_dir))
        for device in inventory.devices.values():
            started.extend(bring_up(device, tracker, run_dir))
        wait_for_servers(tracker, {d.key: 1 for d in inventory.devices.values()}, timeout_s=60)
        with Store(db_path) as store:
            cells = run_matrix(tracker, list(inventory.devices.values()), sources, store, cache_dir, config, progress)
            report = render_report(store, report_file(report_dir, "demo"), title="farm demo: local devices × built-in models")
    finally:
        for record in reversed(started):
            stop_process(record)
    return DemoOutcome(db_path, report, cells, time.monotonic() - start, [r.pid for r in started])
