#!/usr/bin/env python3
"""The house's figures (#66): one cell's path from `farm sweep` to its review, counted by tracing it.

Three nights of one cell (``mlp`` on a local server, two untraced nights first so the third has a history to be
judged against), then the third night traced with ``sys.setprofile`` in every thread of the `farm sweep` process:

- **the cell's path**: the farm modules on the stack from `farm sweep` to where the cell is stored whole
  (``record_cell``) and to where its night's findings are stored (``record_findings``), each change of module a
  step, and how many distinct library modules the CLI called into along them;
- **module pairs**: the distinct (caller module → callee module) pairs among farm's modules the night's calls took
  (a caller is the nearest farm frame on the stack; a module calling itself is no step);
- **CLI entries**: the distinct library functions that `farm/cli/` called directly;
- **history reads**: calls to ``run_rows`` over the whole store (no ``sweep_id``), and those of one night;
- the lines of the largest modules.

With ``--review DB --sweep N`` it times instead a night's review and report steps on a copy of a store (a year-scale
one: tools/bench_pages.py builds it): the night judged and its findings stored (``review_night``), then its report
drawn, with the history the review read where the commit passes it forward; one line of seconds.

The same script runs at any commit since the night moved into a library and before it (it finds the tracker and
server starters, and the review, where that commit has them)::

    .venv/bin/python tools/bench_house.py [--json]
    .venv/bin/python tools/bench_house.py --review /tmp/copy-of-results.db --sweep 50
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FARM = REPO / "farm"


def _module(filename: str) -> str | None:
    path = Path(filename)
    try:
        rel = path.resolve().relative_to(FARM)
    except ValueError:
        return None
    parts = rel.with_suffix("").parts
    return ".".join(["farm", *(parts[:-1] if parts[-1] == "__init__" else parts)])


class Tracer:
    def __init__(self) -> None:
        self.edges: collections.Counter = collections.Counter()
        self.cli_calls: set[str] = set()
        self.history_reads = 0
        self.night_reads = 0
        self._names: dict[str, str | None] = {}
        self.paths: dict[str, list[str]] = {}  # a landmark of the cell's path -> the farm modules on its stack

    def _of(self, filename: str) -> str | None:
        if filename not in self._names:
            self._names[filename] = _module(filename)
        return self._names[filename]

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        callee = self._of(frame.f_code.co_filename)
        if callee is None:
            return
        caller_frame = frame.f_back
        while caller_frame is not None and self._of(caller_frame.f_code.co_filename) is None:
            caller_frame = caller_frame.f_back
        if frame.f_code.co_name in (*PATH_ENDS, THREAD_START) and frame.f_code.co_name not in self.paths:
            stack, up = [], frame
            while up is not None:
                if (name := self._of(up.f_code.co_filename)) is not None and (not stack or stack[-1] != name):
                    stack.append(name)
                up = up.f_back
            self.paths[frame.f_code.co_name] = stack[::-1]
        if frame.f_code.co_name == "run_rows" and callee.endswith("results"):
            if frame.f_locals.get("sweep_id") is None:
                self.history_reads += 1
            else:
                self.night_reads += 1
        if caller_frame is None:
            return
        caller = self._of(caller_frame.f_code.co_filename)
        if caller != callee:
            self.edges[(caller, callee)] += 1
            if caller.startswith("farm.cli") and not callee.startswith("farm.cli") and not frame.f_code.co_name.startswith("<"):
                self.cli_calls.add(f"{callee}.{frame.f_code.co_name}")


# where one cell's path ends: stored whole, then its night's findings stored (the stack from the CLI to each)
PATH_ENDS = ("record_cell", "record_findings")
THREAD_START = "run_sweep"  # a cell is stored in a device's worker thread: its path goes on from run_sweep's stack


def _starters():
    """start_tracker, start_server, stop_process, free_port: in farm.rpc.launch and farm.procs since #66, in
    farm.rpc.processes before."""
    try:
        from farm.procs.supervise import free_port, stop_process
        from farm.rpc.launch import start_server, start_tracker
    except ImportError:
        from farm.rpc.processes import free_port, start_server, start_tracker, stop_process  # type: ignore
    return start_tracker, start_server, stop_process, free_port


def largest(n: int = 8) -> list[tuple[str, int]]:
    sizes = [(str(p.relative_to(REPO)), len(p.read_text().splitlines())) for p in FARM.rglob("*.py")]
    return sorted(sizes, key=lambda s: -s[1])[:n]


def review_and_report(db: str, sweep_id: int) -> tuple[float, float]:
    """Seconds of a night's review step and of its report step on ``db`` (written: give a copy)."""
    import time

    from farm.store import Store
    try:
        from farm.night.confirmation import review_night
        from farm.views.report import render_report
    except ImportError:  # before #66's rooms
        from farm.confirmation import detect_and_confirm as review_night  # type: ignore
        from farm.report import render_report  # type: ignore
    out = Path(tempfile.mkdtemp(prefix="farm-bench-house-")) / "report.html"
    with Store(db) as store:
        started = time.perf_counter()
        reviewed = review_night(store, sweep_id)
        reviewed_s = time.perf_counter() - started
        started = time.perf_counter()
        rows = getattr(reviewed, "rows", None)
        if rows is not None:
            render_report(store, out, sweep_id=sweep_id, history=rows)
        else:
            render_report(store, out, sweep_id=sweep_id)
        return reviewed_s, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--review", metavar="DB", help="time a night's review and report on this store (a copy)")
    parser.add_argument("--sweep", type=int, default=None, help="with --review: the night")
    args = parser.parse_args()
    if args.review:
        reviewed_s, report_s = review_and_report(args.review, args.sweep)
        print(f"review {reviewed_s:.2f} s, report {report_s:.2f} s, both {reviewed_s + report_s:.2f} s")
        return 0
    from farm.cli import main as farm_main
    from farm.records import TrackerAddress
    from farm.rpc.tracker import wait_for_servers

    start_tracker, start_server, stop_process, free_port = _starters()
    work = Path(tempfile.mkdtemp(prefix="farm-bench-house-"))
    port = free_port()
    tracker = TrackerAddress("127.0.0.1", port)
    inventory = work / "devices.toml"
    inventory.write_text(f'[tracker]\nhost = "127.0.0.1"\nport = {port}\n\n'
                         '[devices.dev0]\nkind = "local"\nkey = "bench-house"\ntarget = { kind = "llvm" }\nthreads = 1\n')
    argv = ["--devices", str(inventory), "--db", str(work / "r.db"), "sweep", "--device", "dev0", "--model", "mlp",
            "--repeat", "3", "--min-repeat-ms", "5", "--tvm-only", "--report-dir", str(work / "reports")]
    started = []
    tracer = Tracer()
    try:
        started.append(start_tracker("127.0.0.1", port, work))
        started.append(start_server(tracker, "dev0", "bench-house", work))
        wait_for_servers(tracker, {"bench-house": 1}, timeout_s=60)
        for _ in range(2):
            with contextlib.redirect_stdout(io.StringIO()):
                assert farm_main(argv) == 0
        threading.setprofile(tracer)
        sys.setprofile(tracer)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                code = farm_main(argv)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
        assert code == 0, code
    finally:
        for record in reversed(started):
            stop_process(record)
    paths = {end: tracer.paths.get(end, []) for end in PATH_ENDS}
    start = tracer.paths.get(THREAD_START, [])
    for end, stack in paths.items():  # a stack that began in a worker thread goes on from where the sweep started
        if stack and not stack[0].startswith("farm.cli") and start:
            paths[end] = start + stack[1:] if stack[0] == start[-1] else start + stack
    figures = {"path_steps": sum(max(len(stack) - 1, 0) for stack in paths.values()),
               "path_cli_entries": len({stack[stack.index(m) + 1] for stack in paths.values() for m in stack
                                        if m.startswith("farm.cli") and stack.index(m) + 1 < len(stack)
                                        and not stack[stack.index(m) + 1].startswith("farm.cli")}),
               "paths": paths,
               "steps": len(tracer.edges),
               "cli_entries": sorted(tracer.cli_calls),
               "history_reads": tracer.history_reads, "night_reads": tracer.night_reads,
               "largest": largest()}
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        for end, stack in paths.items():
            print(f"to {end}: {len(stack) - 1} steps: {' → '.join(m.removeprefix('farm.') for m in stack)}")
        print(f"the cell's path: {figures['path_steps']} module-to-module steps, entering the library from the CLI "
              f"{figures['path_cli_entries']} time(s)")
        print(f"module pairs the night's calls took: {figures['steps']}")
        print(f"library functions the CLI called: {len(figures['cli_entries'])}: {', '.join(figures['cli_entries'])}")
        print(f"history reads: {figures['history_reads']} whole, {figures['night_reads']} of one night")
        print("largest modules: " + ", ".join(f"{p} {n}" for p, n in figures["largest"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
