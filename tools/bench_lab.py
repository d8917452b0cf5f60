"""A lab host's sweep through the lab's queue (#30), counted: N native RPC servers of one lab host, W `farm worker`
processes, one real PostgreSQL, and a queued `farm sweep` over every device.

Starts a private PostgreSQL (Debian's, in a temporary folder, on a free loopback port), a private tracker and N
copies of farm's native RPC server (each a `remote` device with lab_host = "lab1"), then W workers (`farm worker
--lab-host lab1 --slots S`), each in its own process group with its log in the work folder. While `farm sweep`
queues one cell per device and follows them, the tracker's summary is read every 0.2 s: the sessions open at once
are the registered servers that are not free (counted from the tracker, not inferred from wall time: N servers
on 2 cores compete for the CPU). Then, from the queue's own events, each job's wait from being queued to starting.

    .venv/bin/python tools/bench_lab.py                  # N = 100, W = 4, S = 24: goal a peak >= 96 sessions
    .venv/bin/python tools/bench_lab.py -n 20 -w 2 --json

Goals (exit 1 when missed): every cell ok and stored once; a peak of min(N, W × S) sessions at once (#30: >= 96).

--queue-load N: the queue's own overhead per cell at N queued cells (#30), without devices: W worker processes
serve a lab host's queue through farm's `LabQueue.serve` with a cell handler that returns at once, and N cell jobs
(one device each, so no device lock holds one back) are deferred by `LabQueue.defer` as `farm sweep` defers them.
Figures: the deferring's time per job, each job's wait from queued to started (procrastinate's events), and the
time until all N succeeded. A farm cell job adds its own reads to this (the sweep's spec, its attempts).
With --hosts H and --cell-s S (#50: a lab of 1,000 devices on one PostgreSQL at its default settings), W worker
processes serve each of H lab hosts' queues (W a host, default 1), and each cell is simulated as a worker's cell job
is: it takes its device's lease (``lab.leases``), reads the sweep's attempts, holds the device S seconds, and stores
its run whole under the lease (``Store.record_cell``), all on the worker's one shared store. The server keeps its
default max_connections (100); the peak of its client connections is read every 0.2 s (pg_stat_activity). Goals
(exit 1 when missed): every cell stored once, and the peak within max_connections.

    .venv/bin/python tools/bench_lab.py --queue-load 1000 [-w 4 --slots 24]
    .venv/bin/python tools/bench_lab.py --queue-load 1920 --hosts 40 -w 1 --slots 24 --cell-s 3

--builds N: compiles as jobs (#30), N cold compiles (default 8 of --build-model, default onnx:resnet50, for N x86
devices whose targets differ in mcpu only, so every artifact key differs and nothing is cached), two ways:
  1. today's single compile loop: one process compiles the N artifacts one after another (``compile_cell``, as a
     sweep on one host does), from a fresh cache;
  2. a queued sweep's build jobs (``farm sweep --detach``) taken by W ``farm worker --builds`` processes (default
     2), each with a fresh cache of its own, timed from the workers' start until every build is recorded.
Both as processes, TVM's import included. Goal (exit 1 when missed): 2 build workers >= 1.6x the loop's rate on 2
cores. No device is measured: the sweep's cells wait for a lab host that has no worker.

    .venv/bin/python tools/bench_lab.py --builds 8 [-w 2]

--faults: a lab of two hosts under faults (#50; tools/lab_faults.py says how): this host and a network namespace, one
PostgreSQL, one tracker, 3 local devices a host, two workers on one host and one on the other; a sweep a scenario
(a baseline, kill -9 of a worker, SIGSTOP of a worker for 60 s with a second worker on its host and with none, a
PostgreSQL restart with cells running, a duplicate delivery, a resume while jobs are in flight). Goals (exit 1 when
missed), after each: every cell stored exactly once with both its runtimes, no failed run, the sweep done without a
manual resume, no worker exited; the time each fault added is printed. Outages of PostgreSQL within the bound its
clients wait (60 s, ``store.backends.RECONNECT_S``) are scenarios too (#61): down 5 s, 25 s and 55 s while cells are
measured. --only SCENARIO runs one of them (after the warm-up and the baseline). Needs root, iproute2 and PostgreSQL.

    .venv/bin/python tools/bench_lab.py --faults
    .venv/bin/python tools/bench_lab.py --faults --only "PostgreSQL down 25 s" --only "PostgreSQL down 55 s"

--phones: phones on another host (#30), the whole path once (tests/phone_lab.py, which tests/test_android.py
asserts): host A, a network namespace, runs the lab's tracker, queues a sweep (`mlp`) and builds its artifacts
(`farm worker --builds`); host B, this host, has the stand-in phone (its own namespace, under qemu) on B's own adb
server, a local CPU device and the PostgreSQL. `farm serve` on B relays the phone to A's tracker; B's `farm worker`
measures both cells. Goals: the sweep ends done; each cell measured on B (B's worker log), its output checked,
with A's artifact (B compiles nothing). Needs root, iproute2, adb, qemu-user, the aarch64 g++ and PostgreSQL.

    .venv/bin/python tools/bench_lab.py --phones
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from farm.devices.native import ensure_native_server, start_native_server
from farm.records import TrackerAddress
from farm.signing import KEY_ENV
from farm.procs.registry import ManagedProcess
from farm.procs.supervise import free_port, stop_process
from farm.rpc.launch import exited_at_start, start_tracker
from farm.rpc.tracker import query_summary, wait_for_servers

REPO = Path(__file__).resolve().parent.parent


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def postgres(work: Path, max_connections: int | None = 400) -> Iterator[str]:
    """Debian's PostgreSQL in ``work``, on a free loopback port, as the postgres user when run as root; its URL.
    ``max_connections`` None: the server's default (100)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    if not found:
        raise SystemExit("needs PostgreSQL: apt-get install postgresql (bash tools/setup.sh --test)")
    bin_dir = found[-1].parent
    base = Path(tempfile.mkdtemp(prefix="farm-lab-pg-"))  # not under a root-only folder: the server runs as postgres
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:
        shutil.chown(base, "postgres")
    subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(base / "data"), "-A", "trust", "-U", "farm"],
                   check=True, capture_output=True)
    port = free_port()
    with open(work / "postgres.log", "wb") as log:
        proc = subprocess.Popen([*as_user, str(bin_dir / "postgres"), "-D", str(base / "data"), "-p", str(port),
                                 "-k", str(base), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                                 *(["-c", f"max_connections={max_connections}"] if max_connections else [])],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                             capture_output=True).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"PostgreSQL did not start: {(work / 'postgres.log').read_text()[-2000:]}")
            time.sleep(0.2)
        subprocess.run([str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "farm", "farm"], check=True)
        yield f"postgresql://farm@127.0.0.1:{port}/farm"
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        shutil.rmtree(base, ignore_errors=True)


def inventory(tracker: TrackerAddress, n: int) -> str:
    lines = [f'[tracker]\nhost = "{tracker.host}"\nport = {tracker.port}\n']
    for i in range(n):
        lines.append(f'[devices.dev{i:03d}]\nkind = "remote"\nkey = "lab1-{i:03d}"\nlab_host = "lab1"\n'
                     'target = { kind = "llvm", num-cores = 1 }\n')
    return "\n".join(lines)


def count_sessions(tracker: TrackerAddress, stop: threading.Event, peak: list[int]) -> None:
    """Every 0.2 s: the registered servers that are not free (in a session), over all keys; the peak in ``peak``."""
    while not stop.wait(0.2):
        try:
            summary = query_summary(tracker)
        except Exception:  # a busy tracker: the next reading counts
            continue
        peak[0] = max(peak[0], sum(s.servers - s.free for s in summary.keys.values()))


def job_waits(url: str) -> list[float]:
    """Each cell job's seconds from being queued to starting, from procrastinate's events."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        rows = db.execute("""SELECT EXTRACT(EPOCH FROM s.at - d.at) FROM procrastinate_events d
                             JOIN procrastinate_events s ON s.job_id = d.job_id AND s.type = 'started'
                             WHERE d.type = 'deferred' ORDER BY 1""").fetchall()
    return [float(r[0]) for r in rows]


def stop_workers(workers: list[subprocess.Popen]) -> None:
    """SIGTERM to each worker's process group (a worker finishes its jobs), SIGKILL after a minute."""
    for p in workers:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in workers:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def noop_worker(url: str, slots: int, host: str = "load", cell_s: float = 0.0) -> None:
    """A worker process of --queue-load: lab host ``host``'s queue, each cell job done at once, or (``cell_s``) a
    simulated cell: its device's lease, the sweep's attempts read, the device held ``cell_s``, its run stored whole
    under the lease on the worker's one shared store (as ``LabWorker.cell`` does, without a device)."""
    from farm.lab.jobs import CELL, queue_of
    from farm.lab.queue import LabQueue

    handler = (lambda **_: "ok") if not cell_s else simulated_cell(url, cell_s)
    LabQueue(url).serve([queue_of(host)], {CELL: handler}, slots, f"{host}-{os.getpid()}")


def simulated_cell(url: str, cell_s: float):
    from farm.models import load_model
    from farm.records import BenchConfig, BenchResult, CheckResult, Device, RunToStore, StoredAttempt
    from farm.store import shared_store
    from farm.lab.leases import LeaseKeeper

    keeper, mlp = LeaseKeeper(url), load_model("mlp")

    def cell(sweep_id: int, device: str, model: str, first: bool) -> str:
        store = shared_store(url)
        with keeper.hold(store, device, f"{os.getpid()}:{device}") as lease:
            if StoredAttempt(1, "ok", "") in store.sweep_attempts(sweep_id).get((device, model), []):
                return "done before"
            time.sleep(cell_s)  # the device measures
            result = BenchResult(device=device, key=device, model=model, model_digest=mlp.digest, status="ok",
                                 steady_number=10, steady_samples_s=(0.002, 0.001, 0.003),
                                 check=CheckResult("passed", 0.0, 1e-4, 1e-4, "onnxruntime"), config=BenchConfig(),
                                 context={"simulated": True}, started_at="2026-11-28T00:00:00+00:00")
            target = Device(device, device, "remote", {"kind": "llvm"}, lab_host="load")
            store.record_cell(RunToStore(result, target, mlp, None, 1), sweep_id=sweep_id, lease=lease)
        return "ok"

    return cell


def count_connections(url: str, stop: threading.Event, peak: list[int]) -> None:
    """Every 0.2 s: the server's client connections but this one (pg_stat_activity); the peak in ``peak``."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        while not stop.wait(0.2):
            n = db.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE backend_type = 'client backend'").fetchone()[0]
            peak[0] = max(peak[0], int(n) - 1)


def queue_load(args: argparse.Namespace, work: Path) -> int:
    from farm.lab.jobs import CELL, Job, cell_lock
    from farm.lab.queue import LabQueue
    from farm.store import Store

    workers: list[subprocess.Popen] = []
    hosts = [f"host{h:02d}" for h in range(args.hosts)] if args.hosts else ["load"]
    stop, peak = threading.Event(), [0]
    with postgres(work, None) as url:
        lab = LabQueue(url)
        lab.install()
        with Store(url) as store:  # the results' tables; the simulated cells' sweep
            sweep_id = store.start_sweep({"devices": [], "models": ["mlp"]})
        counter = threading.Thread(target=count_connections, args=(url, stop, peak), daemon=True)
        counter.start()
        try:
            for h, host in enumerate(hosts):
                for w in range(args.workers):
                    with open(work / f"noop-worker-{h}-{w}.log", "wb") as log:
                        workers.append(subprocess.Popen(
                            [sys.executable, __file__, "--noop-worker", url, "--slots", str(args.slots),
                             "--host", host, "--cell-s", str(args.cell_s)], cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
            deadline = time.monotonic() + 600
            while lab.live_workers() < len(workers):
                if time.monotonic() > deadline or any(p.poll() is not None for p in workers):
                    raise SystemExit(f"the workers did not start: {(work / 'noop-worker-0-0.log').read_text()[-2000:]}")
                time.sleep(0.5)
            say(f"{len(workers)} workers of {len(hosts)} lab host(s) beat; {peak[0]} connections so far")
            devices = [f"dev{i:04d}" for i in range(args.queue_load)]
            jobs = [Job(CELL, hosts[i % len(hosts)], d, {"sweep_id": sweep_id, "device": d, "model": "mlp",
                                                        "first": True}, cell_lock(sweep_id, d, "mlp"))
                    for i, d in enumerate(devices)]
            start = time.perf_counter()
            lab.defer(jobs)
            defer_s = time.perf_counter() - start
            while (done := lab.sweep_jobs(sweep_id).count("succeeded")) < args.queue_load:
                failed = lab.sweep_jobs(sweep_id).count("failed")
                if time.perf_counter() - start > 3600 or any(p.poll() is not None for p in workers) or failed:
                    raise SystemExit(f"{done}/{args.queue_load} jobs done, {failed} failed; worker log: "
                                     f"{(work / 'noop-worker-0-0.log').read_text()[-2000:]}")
                time.sleep(0.2)
            all_s = time.perf_counter() - start
            waits = job_waits(url)
            with Store(url) as store:
                stored = store.count("runs") if args.cell_s else args.queue_load
                cells = len(store.sweep_attempts(sweep_id)) if args.cell_s else args.queue_load
        finally:
            stop.set()
            stop_workers(workers)
    figures = {"jobs": args.queue_load, "hosts": len(hosts), "workers": len(workers), "slots": args.slots,
               "cell_s": args.cell_s, "peak_connections": peak[0], "max_connections": 100,
               "runs_stored": stored, "cells_stored": cells,
               "defer_ms_per_job": round(defer_s / args.queue_load * 1e3, 2), "defer_s": round(defer_s, 2),
               "wait_s_median": round(waits[len(waits) // 2], 3), "wait_s_p95": round(waits[int(len(waits) * 0.95)], 3),
               "wait_s_max": round(waits[-1], 3), "all_done_s": round(all_s, 1),
               "jobs_per_s": round(args.queue_load / all_s, 1)}
    goals = {"every cell stored once": stored == cells == args.queue_load,
             "the peak within max_connections (100)": peak[0] <= 100}
    handlers = "handlers that return at once" if not args.cell_s else f"cells of {args.cell_s:g} s, stored whole"
    lines = [f"{args.queue_load} cell jobs, {len(hosts)} lab host(s) × {args.workers} worker(s) × {args.slots} slots, "
             f"{handlers}; PostgreSQL at its default max_connections (100):",
             f"  peak client connections: {peak[0]} ({len(workers)} workers)",
             f"  deferring: {figures['defer_ms_per_job']} ms a job ({figures['defer_s']} s in all)",
             f"  a job's wait from queued to started: median {figures['wait_s_median']} s, p95 "
             f"{figures['wait_s_p95']} s, max {figures['wait_s_max']} s",
             f"  all {args.queue_load} done {figures['all_done_s']} s after the first was queued: "
             f"{figures['jobs_per_s']} jobs/s; runs stored {stored}, cells {cells}"]
    return conclude(figures, goals, args.json, lines)


BUILD_MCPUS = ("x86-64", "x86-64-v2", "x86-64-v3", "haswell", "broadwell", "skylake", "znver1", "znver2", "znver3",
               "icelake-server", "cascadelake", "nehalem")


def build_inventory(n: int) -> str:
    """N x86 devices of lab host "nobody" (no worker measures them), each its own mcpu: N artifact keys."""
    if n > len(BUILD_MCPUS):
        raise SystemExit(f"--builds takes at most {len(BUILD_MCPUS)} compiles (one per mcpu)")
    return "\n".join(f'[devices.build{i}]\nkind = "remote"\nkey = "build-{i}"\nlab_host = "nobody"\n'
                     f'target = {{ kind = "llvm", mcpu = "{mcpu}", num-cores = 2 }}\n'
                     for i, mcpu in enumerate(BUILD_MCPUS[:n]))


def compile_loop(inventory_path: str, model: str, cache: str) -> None:
    """--builds' single loop (its own process): the inventory's artifacts compiled one after another."""
    from farm.inventory import load_inventory
    from farm.models import load_model_variant
    from farm.store import Store
    from farm.sweep.cell import compile_cell

    devices = load_inventory(inventory_path).devices
    source = load_model_variant(model, None)
    with Store(Path(cache) / "results.db") as store:
        for name in sorted(devices):
            start = time.perf_counter()
            artifact = compile_cell(devices[name], source, store, Path(cache) / "cache")
            say(f"  {name}: {artifact.cache_key[:12]} built in {time.perf_counter() - start:.1f} s")


def builds(args: argparse.Namespace, work: Path) -> int:
    from farm.store import Store

    n, model = args.builds, args.build_model
    (work / "devices.toml").write_text(build_inventory(n))
    env = {**os.environ, "FARM_DEVICES": str(work / "devices.toml"), "PYTHONPATH": str(REPO)}
    say(f"1. the single compile loop: {n} cold compiles of {model}, one process")
    start = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--compile-loop", str(work / "devices.toml"), model, str(work / "loop")],
                   cwd=REPO, env=env, check=True, timeout=3600)
    loop_s = time.perf_counter() - start
    workers: list[subprocess.Popen] = []
    with postgres(work) as url:
        env = {**env, "FARM_DB": url}
        queued = subprocess.run([sys.executable, "-m", "farm.cli", "sweep", "--model", model, "--tvm-only",
                                 "--reference", "none", "--no-report", "--detach", "--json"], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=600)
        if queued.returncode != 0:
            raise SystemExit(queued.stderr[-3000:])
        sweep_id = json.loads(queued.stdout)["sweep_id"]
        say(f"2. {args.workers} build worker(s), each its own cache: sweep {sweep_id}'s {n} build jobs")
        try:
            start = time.perf_counter()
            for w in range(args.workers):
                with open(work / f"build-worker-{w}.log", "wb") as log:
                    workers.append(subprocess.Popen(
                        [sys.executable, "-m", "farm.cli", "worker", "--builds", "--until-empty", "--progress"],
                        cwd=REPO, env={**env, "FARM_HOME": str(work / f"builder-{w}")}, stdout=log,
                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
            with Store(url) as store:
                while len(made := store.sweep_builds(sweep_id)) < n:
                    if time.perf_counter() - start > 3600 or all(p.poll() is not None for p in workers):
                        raise SystemExit(f"{len(made)}/{n} builds recorded; worker log: "
                                         f"{(work / 'build-worker-0.log').read_text()[-2000:]}")
                    time.sleep(0.2)
            jobs_s = time.perf_counter() - start
        finally:
            stop_workers(workers)
    errors = [f"{d}: {b.error}" for (d, _), b in made.items() if b.error]
    by_worker: dict[str, int] = {}
    for b in made.values():
        by_worker[b.builder] = by_worker.get(b.builder, 0) + 1
    speedup = loop_s / jobs_s
    figures = {"compiles": n, "model": model, "build_workers": args.workers, "loop_s": round(loop_s, 1),
               "jobs_s": round(jobs_s, 1), "speedup": round(speedup, 2), "builds_per_worker": sorted(by_worker.values()),
               "errors": errors, "cpus": os.cpu_count()}
    return conclude(figures, {f"{args.workers} build workers >= 1.6x the loop's rate, no error": speedup >= 1.6
                              and not errors}, args.json, [
        f"{n} cold compiles of {model} on {os.cpu_count()} CPUs, each figure from process start (TVM's import "
        "included):",
        f"  single compile loop: {loop_s:.1f} s ({n / loop_s * 60:.1f} builds/min)",
        f"  {args.workers} build workers: {jobs_s:.1f} s ({n / jobs_s * 60:.1f} builds/min), builds per worker "
        f"{sorted(by_worker.values())}" + (f"; errors: {errors}" if errors else ""),
        f"  {speedup:.2f}x the loop's rate"])




def faults(args: argparse.Namespace, work: Path) -> int:
    sys.path.insert(0, str(REPO))  # the scenarios' second host and restartable server come from the tests' helpers
    from tools.lab_faults import run_faults

    return run_faults(args, work)


def conclude(figures: dict, goals: dict[str, bool], as_json: bool, lines: list[str]) -> int:
    """A mode's end: its goals into its figures, printed as JSON or as ``lines`` and each goal met or missed; the
    exit code (1: a goal missed)."""
    figures["goals_met"] = goals
    if as_json:
        print(json.dumps(figures, indent=2))
    else:
        print("\n".join([*lines, *(f"  {'met' if met else 'MISSED'}: {goal}" for goal, met in goals.items())]))
    return 0 if all(goals.values()) else 1


def one(db, sql: str, params: tuple = ()):
    """The first column of the query's one row."""
    row = db.execute(sql, params).fetchone()
    assert row is not None, sql
    return row[0]


def phones(args: argparse.Namespace, work: Path) -> int:
    sys.path.insert(0, str(REPO))  # the stand-in phone and the scenario live with the tests that assert it
    from tests.phone_lab import phone_lab, standin_phone

    with standin_phone(work) as phone:
        lab = phone_lab(work, phone, {"FARM_HOME": str(work / "home-b")})
    cells = {c["device"]: c["status"] for c in lab.sweep.get("cells", [])}
    on_b = {device: {"checked": f"{device} · mlp · check: passed" in lab.measured,
                     "artifact from A": f"{device} · mlp · artifact: built by builds:" in lab.measured}
            for device in ("phone", "b-cpu")}
    figures = {"failed_step": lab.failed(), "sweep_status": lab.sweep.get("status"), "cells": cells, "on_b": on_b,
               "compiled_on_b": "· compile:" in lab.measured, "relay": bool(lab.relay), "seconds": lab.seconds}
    goals = {"the sweep ends done, both cells ok": figures["sweep_status"] == "done"
             and cells == {"phone": "ok", "b-cpu": "ok"},
             "each cell measured on B, output checked": all(c["checked"] for c in on_b.values()),
             "with A's artifacts, nothing compiled on B": all(c["artifact from A"] for c in on_b.values())
             and not figures["compiled_on_b"]}
    return conclude(figures, goals, args.json, [
        *([f"failed: {lab.failed()}"] if lab.failed() else []),
        f"phones on another host: sweep {figures['sweep_status']}, cells {cells}; relay started: {bool(lab.relay)}",
        *(f"  {device}: measured on B with its output checked: {seen['checked']}; A's artifact: "
          f"{seen['artifact from A']}" for device, seen in on_b.items()),
        "  seconds: " + ", ".join(f"{step} {secs}" for step, secs in lab.seconds.items())])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--servers", type=int, default=100, help="devices of the lab host (default 100)")
    parser.add_argument("-w", "--workers", type=int, default=None,
                        help="farm worker processes (default 4; with --builds, build workers: default 2)")
    parser.add_argument("--slots", type=int, default=24, help="sessions each worker holds at once (default 24)")
    parser.add_argument("--repeat", type=int, default=20, help="repeats of each cell (default 20)")
    parser.add_argument("--min-repeat-ms", type=int, default=100, help="each repeat's length (default 100)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--keep", help="work folder to keep (default: a temporary one)")
    parser.add_argument("--queue-load", type=int, metavar="N", help="the queue's overhead at N queued cells, no devices")
    parser.add_argument("--builds", type=int, metavar="N", nargs="?", const=8,
                        help="N cold compiles: the single loop against -w build workers (default 8; use -w 2)")
    parser.add_argument("--build-model", default="onnx:resnet50", help="--builds' model (default onnx:resnet50)")
    parser.add_argument("--faults", action="store_true", help="a worker killed mid-sweep; a job redelivered after commit")
    parser.add_argument("--only", action="append", metavar="SCENARIO",
                        help="--faults: only this scenario (repeatable; the warm-up and the baseline always run), "
                             "e.g. 'PostgreSQL down 25 s'")
    parser.add_argument("--phones", action="store_true", help="a sweep queued on host A measures host B's phone")
    parser.add_argument("--hosts", type=int, default=0, help="--queue-load: lab hosts, each with -w workers")
    parser.add_argument("--cell-s", type=float, default=0.0,
                        help="--queue-load: each cell holds its device this long and is stored (default: returns at once)")
    parser.add_argument("--host", default="load", help=argparse.SUPPRESS)  # a --noop-worker's lab host
    parser.add_argument("--noop-worker", metavar="URL", help=argparse.SUPPRESS)  # --queue-load's worker processes
    parser.add_argument("--compile-loop", nargs=3, help=argparse.SUPPRESS)  # --builds' single loop
    args = parser.parse_args()
    if args.builds is None:
        args.workers = args.workers or 4
    if args.noop_worker:
        noop_worker(args.noop_worker, args.slots, args.host, args.cell_s)
        return 0
    if args.compile_loop:
        compile_loop(*args.compile_loop)
        return 0
    work = Path(args.keep or tempfile.mkdtemp(prefix="farm-lab-"))
    work.mkdir(parents=True, exist_ok=True)
    if not os.environ.get(KEY_ENV):  # the bench's lab hosts share a lab key, as a lab's do (farm/signing.py)
        (work / "lab.key").write_text(secrets.token_hex(32))
        os.environ[KEY_ENV] = str(work / "lab.key")
    if args.queue_load is not None:
        if args.queue_load < 1:
            parser.error("--queue-load needs at least 1 job")
        return queue_load(args, work)
    if args.builds is not None:
        args.workers = args.workers or 2
        return builds(args, work)
    if args.faults:
        return faults(args, work)
    if args.phones:
        return phones(args, work)
    server = ensure_native_server()
    started: list[ManagedProcess] = []
    workers: list[subprocess.Popen] = []
    figures: dict = {"servers": args.servers, "workers": args.workers, "slots": args.slots}
    with postgres(work) as url:
        try:
            port = free_port()
            started.append(start_tracker("127.0.0.1", port, work))
            tracker = TrackerAddress("127.0.0.1", port)
            say(f"PostgreSQL at {url}; tracker at {tracker}; starting {args.servers} native servers")
            for i in range(args.servers):
                started.append(start_native_server(server, tracker, f"dev{i:03d}", f"lab1-{i:03d}", work))
            wait_for_servers(tracker, {f"lab1-{i:03d}": 1 for i in range(args.servers)}, timeout_s=180,
                             give_up=exited_at_start(started))
            (work / "devices.toml").write_text(inventory(tracker, args.servers))
            env = {**os.environ, "FARM_DEVICES": str(work / "devices.toml"), "FARM_DB": url,
                   "FARM_HOME": str(work / "home")}
            for w in range(args.workers):
                with open(work / f"worker-{w}.log", "wb") as log:
                    workers.append(subprocess.Popen(
                        [sys.executable, "-m", "farm.cli", "worker", "--lab-host", "lab1", "--slots", str(args.slots)],
                        env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        start_new_session=True))
            stop, peak = threading.Event(), [0]
            counter = threading.Thread(target=count_sessions, args=(tracker, stop, peak), daemon=True)
            counter.start()
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "farm.cli", "sweep", "--model", "mlp", "--reference", "none",
                                   "--repeat", str(args.repeat), "--min-repeat-ms", str(args.min_repeat_ms),
                                   "--no-report", "--json"], cwd=REPO, env=env, capture_output=True, text=True,
                                  timeout=3600)
            seconds = time.perf_counter() - start
            stop.set()
            counter.join()
            out = json.loads(proc.stdout) if proc.returncode == 0 else {}
            cells = out.get("cells", [])
            waits = job_waits(url)
            figures.update({
                "sweep_s": round(seconds, 1), "exit": proc.returncode, "status": out.get("status"),
                "cells": len(cells), "ok": sum(c["status"] == "ok" for c in cells),
                "stored_once": all(c["attempts"] == 1 for c in cells), "peak_sessions": peak[0],
                "wait_s_median": round(waits[len(waits) // 2], 2) if waits else None,
                "wait_s_max": round(waits[-1], 2) if waits else None})
            if proc.returncode != 0:
                say(proc.stderr[-3000:])
        finally:
            stop_workers(workers)
            for record in reversed(started):
                stop_process(record)
    want = min(args.servers, args.workers * args.slots)
    goals = {"every cell ok, stored once": figures.get("ok") == args.servers and figures.get("stored_once", False),
             f"peak sessions >= {want}": figures.get("peak_sessions", 0) >= want}
    figures["goals_met"] = goals
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"{args.servers} devices of one lab host, {args.workers} workers × {args.slots} slots: sweep "
              f"{figures.get('sweep_s')} s, {figures.get('ok')}/{figures.get('cells')} cells ok, status "
              f"{figures.get('status')}")
        print(f"  peak sessions at once (tracker): {figures.get('peak_sessions')}")
        print(f"  a job's wait from queued to started: median {figures.get('wait_s_median')} s, "
              f"max {figures.get('wait_s_max')} s")
        for goal, met in goals.items():
            print(f"  goal {goal}: {'ok' if met else 'MISSED'}")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
