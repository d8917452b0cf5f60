#!/usr/bin/env python3
"""The dashboard's finding pages at year scale (#64): latency, size and memory of /findings and /finding/<id>.

Builds (or reuses, --keep) tools/bench_scale.py's year-scale database (50 nights × 40 devices × 25 models = 50,000
runs, --mass: half the models 10 % slower on the last night; --profiles: every run with a 60-kernel profile), stores
the last night's findings with `farm regressions`, starts `farm dashboard` on it, and, while a writer stores runs
into a PostgreSQL database beside it (a sweep's load: a fresh run every --write-every seconds, through farm's
Store), loads each page --loads times in turn: /findings, then /finding/<id> of each stored finding, /series of its
first series, /nights of the last two nights, and /api/state. Prints each page's median and worst time and its size,
and the dashboard process's RSS after the first round and after the last (its growth over the loads).

    .venv/bin/python tools/bench_pages.py --mass --profiles --keep /tmp/farm-pages     # the figures in benchmarks.md
    .venv/bin/python tools/bench_pages.py --nights 10 --devices 8 --models 5 --loads 20  # a quick look

Goals: each page within 1 s and at most 200 kB; the RSS does not grow by more than 10 % over the loads. Exit 1 when
one is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

GOAL_S, GOAL_KB, GOAL_GROWTH = 1.0, 200.0, 0.10


def fetch(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as answer:
        body = answer.read()
    return time.perf_counter() - started, len(body)


def writer(url: str, stop: threading.Event, every_s: float, counted: list[int]) -> None:
    """A sweep's writes beside the dashboard: one run stored into PostgreSQL every ``every_s``."""
    from farm.records import BenchConfig, BenchResult, CheckResult, Device, InputSpec, ModelSource
    from farm.store import Store

    device = Device("writer", "remote", "writer", {"kind": "llvm"})
    model = ModelSource("w", "builtin:w", "digest-w", b"", (InputSpec("x", (1, 8), "float32"),))
    with Store(url) as store:
        while not stop.is_set():
            store.record_result(BenchResult(device="writer", key="writer", model="w", model_digest="digest-w",
                                            status="ok", steady_number=10, steady_samples_s=tuple([1e-3] * 30),
                                            check=CheckResult("passed", 0.0), config=BenchConfig()),
                                device, model, None)
            counted[0] += 1
            stop.wait(every_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nights", type=int, default=50)
    parser.add_argument("--devices", type=int, default=40)
    parser.add_argument("--models", type=int, default=25)
    parser.add_argument("--mass", action="store_true")
    parser.add_argument("--profiles", action="store_true")
    parser.add_argument("--keep", help="folder for the database: built once, reused when it exists")
    parser.add_argument("--loads", type=int, default=200, help="rounds of page loads (default 200)")
    parser.add_argument("--write-every", type=float, default=0.2, help="seconds between the writer's runs")
    args = parser.parse_args()

    import psutil

    from bench_scale import build
    from farm.procs.supervise import free_port
    from tests.conftest import running_postgres

    work = Path(args.keep or "/tmp/farm-pages")
    work.mkdir(parents=True, exist_ok=True)
    db = work / "results.db"
    shape = {k: getattr(args, k) for k in ("nights", "devices", "models", "mass", "profiles")}
    marker = work / "shape.json"
    if not (db.exists() and marker.exists() and json.loads(marker.read_text()) == shape):
        db.unlink(missing_ok=True)
        started = time.monotonic()
        build(db, args.nights, args.devices, args.models, 30, 12, 7, args.mass, args.profiles)
        print(f"built {args.nights * args.devices * args.models} runs in {time.monotonic() - started:.0f} s",
              file=sys.stderr)
        marker.write_text(json.dumps(shape))
    env = {**os.environ, "FARM_DB": str(db), "FARM_HOME": str(work / "home")}
    review = subprocess.run([sys.executable, "-m", "farm.cli", "regressions", "--json"], env=env,
                            capture_output=True, text=True)
    findings = json.loads(review.stdout)["findings"]
    (work / "devices.toml").write_text('[devices.dev00]\nkind = "remote"\nkey = "dev00"\ntarget = { kind = "llvm" }\n')
    port = free_port()
    dashboard = subprocess.Popen([sys.executable, "-m", "farm.cli", "--devices", str(work / "devices.toml"),
                                  "dashboard", "--port", str(port)], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    pages = ["/findings"] + [f"/finding/{f['finding_id']}" for f in findings[:5]]
    if findings:
        first = findings[0]["series"][0]
        pages.append(f"/series?device={first['device']}&model={first['model']}&tuned={int(first['tuned'])}"
                     f"&runtime={first['runtime']}")
    pages += [f"/nights?a={args.nights - 1}&b={args.nights}", "/api/state"]
    stop, written = threading.Event(), [0]
    times: dict[str, list[float]] = {p: [] for p in pages}
    sizes: dict[str, int] = {}
    try:
        dashboard.stdout.readline()
        with running_postgres() as url:
            thread = threading.Thread(target=writer, args=(f"{url}/postgres", stop, args.write_every, written),
                                      daemon=True)
            thread.start()
            process = psutil.Process(dashboard.pid)
            rss_first = 0.0
            for load in range(args.loads):
                for page in pages:
                    seconds, size = fetch(base + page)
                    times[page].append(seconds)
                    sizes[page] = size
                if load == 0:
                    rss_first = process.memory_info().rss / 2**20
            rss_last = process.memory_info().rss / 2**20
            stop.set()
            thread.join(timeout=10)
    finally:
        os.killpg(dashboard.pid, signal.SIGTERM)
        dashboard.wait(timeout=10)
    ok = True
    print(f"{args.nights * args.devices * args.models} runs{' with profiles' if args.profiles else ''}, "
          f"{len(findings)} finding(s); {args.loads} rounds; {written[0]} runs written to PostgreSQL meanwhile")
    for page in pages:
        median, worst, kb = statistics.median(times[page]), max(times[page]), sizes[page] / 1024
        passed = median <= GOAL_S and kb <= GOAL_KB
        ok = ok and passed
        print(f"  {page[:60]:60s} median {median * 1e3:7.1f} ms  worst {worst * 1e3:7.1f} ms  {kb:7.1f} kB  "
              f"{'ok' if passed else 'MISSED'}")
    growth = rss_last / rss_first - 1 if rss_first else 0.0
    ok = ok and growth <= GOAL_GROWTH
    print(f"  dashboard RSS {rss_first:.0f} MB after the first round, {rss_last:.0f} MB after {args.loads}: "
          f"{growth:+.1%} ({'ok' if growth <= GOAL_GROWTH else 'MISSED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
