"""``tools/bench_lab.py --faults`` (#50): a lab of two hosts under the faults a lab meets, one scenario a sweep.

Host lab1 is this host, host lab2 a network namespace joined to it by a veth pair; one PostgreSQL (restartable:
``tests.conftest.postgres_server_at``) and one tracker, both on this host's veth address. Each host serves
``DEVICES_PER_HOST`` devices of kind ``local`` (``farm serve`` on the host: real RPC servers, with onnxruntime timed
beside TVM on the same host), lab1 has two ``farm worker`` processes and lab2 one. Every scenario is a fresh
``farm sweep`` over ``MODELS`` on every device, followed to its end (no manual resume), with its fault injected while
cells are measured:

- ``warm-up``: no fault; it compiles the artifacts the others find cached (judged, not compared);
- ``baseline``: no fault (the time the others are compared with);
- ``kill -9``: a lab1 worker killed while it measures; a new worker started on lab1 at once;
- ``SIGSTOP, a second worker``: a lab1 worker stopped ``FREEZE_S`` while it measures, the host's other worker alive;
- ``SIGSTOP, no other worker``: lab2's only worker stopped ``FREEZE_S`` while it measures;
- ``PostgreSQL restart``: the server shut down fast (its sessions end with AdminShutdown) and started again while
  cells are measured;
- ``duplicate delivery``: after the sweep, a finished cell's job put back as a worker killed between its commit and
  its acknowledgement leaves it: it runs again and stores nothing;
- ``resume in flight``: the sweep queued with --detach, then ``farm sweep --resume`` while its jobs run;
- ``PostgreSQL down 5 s``, ``25 s``, ``55 s``: the server shut down fast while cells are measured and started again
  that much later (#61): within the 60 s farm's clients wait (``store.backends.RECONNECT_S``); at 55 s the leases
  (``lab.leases.LEASE_S``) lapse by construction, so a cell may be measured again, stored once.

After each: every cell stored exactly once with both its runtimes (TVM's run and onnxruntime's, each once, ok), no
failed run, the sweep ``done`` with exit 0, no worker exited, and the time the fault added over the baseline. Needs root (the
namespace), iproute2 and PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
DEVICES_PER_HOST = 3
MODELS = ("mlp", "convnet")
FREEZE_S = 60.0  # how long a frozen worker stays stopped (#50's trial: 60 s)
# outages shorter than a lease (lab.leases.LEASE_S, 30 s): no job may be put back, no write refused
OUTLASTED = ("PostgreSQL restart", "PostgreSQL down 5 s", "PostgreSQL down 25 s")
SWEEP_ARGS = ("--model", "mlp", "--model", "convnet", "--reference", "none", "--repeat", "20", "--min-repeat-ms", "50",
              "--no-report", "--json")


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Lab:
    """The two hosts: their environments, the tracker, the workers (by name, each a process group logging to a
    file) and the PostgreSQL server."""

    def __init__(self, work: Path, ns: str, host_addr: str, server) -> None:
        self.work, self.ns, self.server = work, ns, server
        port = server.url.rsplit(":", 1)[1]
        self.url = f"postgresql://farm@127.0.0.1:{port}/lab"
        self.env = {"lab1": {**os.environ, "FARM_HOME": str(work / "home-lab1"), "FARM_DB": self.url,
                             "FARM_DEVICES": str(work / "devices.toml")},
                    "lab2": {**os.environ, "FARM_HOME": str(work / "home-lab2"),
                             "FARM_DB": f"postgresql://farm@{host_addr}:{port}/lab",
                             "FARM_DEVICES": str(work / "devices.toml")}}
        self.workers: dict[str, tuple[str, subprocess.Popen]] = {}
        self.count = 0

    def prefix(self, host: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns] if host == "lab2" else []

    def farm(self, host: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([*self.prefix(host), sys.executable, "-m", "farm.cli", *args], cwd=REPO,
                              env=self.env[host], capture_output=True, text=True, timeout=timeout)

    def start_worker(self, host: str) -> str:
        name = f"{host}-w{self.count}"
        self.count += 1
        with open(self.work / f"{name}.log", "wb") as log:
            proc = subprocess.Popen([*self.prefix(host), sys.executable, "-m", "farm.cli", "worker", "--lab-host", host,
                                     "--progress"], cwd=REPO, env=self.env[host], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.workers[name] = (host, proc)
        return name

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")

    def marks(self) -> dict[str, int]:
        """Each worker's log length now: what a scenario reads is what comes after."""
        return {name: len(self.log(name)) for name in self.workers}

    def measuring(self, marks: dict[str, int], host: str | None = None, timeout_s: float = 600) -> str:
        """The first live worker (of ``host``) whose log shows a steady measurement after ``marks``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, (where, proc) in self.workers.items():
                if proc.poll() is None and (host is None or where == host) and "· steady" in self.log(name)[marks.get(name, 0):]:
                    return name
            time.sleep(0.2)
        raise SystemExit(f"no worker{' of ' + host if host else ''} started measuring within {timeout_s:g} s")

    def signal(self, name: str, sig: int) -> None:
        os.killpg(self.workers[name][1].pid, sig)

    def stop_all(self) -> None:
        for _, proc in self.workers.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in self.workers.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def cells(self, sweep_id: int) -> dict:
        """The sweep's stored runs by cell and runtime: [(status, attempt)], and its status."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as db:
            rows = db.execute("SELECT device, model, runtime, status, attempt FROM runs WHERE sweep_id = %s ORDER BY id",
                              (sweep_id,)).fetchall()
            status = db.execute("SELECT status FROM sweeps WHERE id = %s", (sweep_id,)).fetchone()[0]
        cells: dict = {}
        for device, model, runtime, run_status, attempt in rows:
            cells.setdefault((device, model), {}).setdefault(runtime, []).append((run_status, attempt))
        return {"cells": cells, "status": status}


def inventory(tracker_host: str, port: int) -> str:
    lines = [f'[tracker]\nhost = "{tracker_host}"\nport = {port}\n']
    for host in ("lab1", "lab2"):
        for i in range(DEVICES_PER_HOST):
            lines.append(f'[devices.{host}-{i}]\nkind = "local"\nkey = "{host}-{i}"\nlab_host = "{host}"\n'
                         'target = { kind = "llvm", num-cores = 1 }\n')
    return "\n".join(lines)


def run_sweep(lab: Lab, fault: Callable[[Lab, int, dict[str, int]], str], detach: bool = False) -> dict:
    """One sweep from lab1 with ``fault`` injected once its id is known; its outcome and the stored cells."""
    marks, before = lab.marks(), latest_sweep(lab)
    start = time.monotonic()
    if detach:
        queued = lab.farm("lab1", "sweep", *SWEEP_ARGS, "--detach")
        sweep_id = json.loads(queued.stdout)["sweep_id"]
        note = fault(lab, sweep_id, marks)
        proc = subprocess.Popen([sys.executable, "-m", "farm.cli", "sweep", "--resume", str(sweep_id), "--no-report",
                                 "--json"], cwd=REPO, env=lab.env["lab1"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    else:
        proc = subprocess.Popen([sys.executable, "-m", "farm.cli", "sweep", *SWEEP_ARGS], cwd=REPO, env=lab.env["lab1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sweep_id = wait_for_sweep(lab, before)
        note = fault(lab, sweep_id, marks)
    out, err = proc.communicate(timeout=3600)
    seconds = time.monotonic() - start
    stored = lab.cells(sweep_id)
    return {"sweep_id": sweep_id, "exit": proc.returncode, "seconds": round(seconds, 1), "note": note,
            "json_status": json.loads(out)["status"] if out.strip() else None, "stderr_tail": err[-600:], **stored}


def latest_sweep(lab: Lab) -> int:
    import psycopg

    with psycopg.connect(lab.url, autocommit=True) as db:
        exists = db.execute("SELECT to_regclass('sweeps')").fetchone()[0] is not None
        return int(db.execute("SELECT COALESCE(MAX(id), 0) FROM sweeps").fetchone()[0]) if exists else 0


def wait_for_sweep(lab: Lab, before: int, timeout_s: float = 300) -> int:
    """The id of the sweep a ``farm sweep`` just started stored (the first after ``before``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (latest := latest_sweep(lab)) > before:
            return latest
        time.sleep(0.2)
    raise SystemExit("the sweep did not start")


def no_fault(lab: Lab, sweep_id: int, marks: dict[str, int]) -> str:
    return ""


def kill_worker(lab: Lab, sweep_id: int, marks: dict[str, int]) -> str:
    name = lab.measuring(marks, "lab1")
    lab.signal(name, signal.SIGKILL)
    lab.workers[name][1].wait()
    del lab.workers[name]
    fresh = lab.start_worker("lab1")
    return f"{name} killed (-9) while it measured; {fresh} started on lab1"


def freeze(host: str) -> Callable[[Lab, int, dict[str, int]], str]:
    def stop(lab: Lab, sweep_id: int, marks: dict[str, int]) -> str:
        name = lab.measuring(marks, host)
        lab.signal(name, signal.SIGSTOP)
        time.sleep(FREEZE_S)
        lab.signal(name, signal.SIGCONT)
        return f"{name} stopped {FREEZE_S:g} s while it measured"

    return stop


def restart_postgres(lab: Lab, sweep_id: int, marks: dict[str, int]) -> str:
    lab.measuring(marks)
    start = time.monotonic()
    lab.server.stop()
    lab.server.start()
    return f"PostgreSQL shut down fast and started again: {time.monotonic() - start:.2f} s without a server"


def postgres_down(seconds: float) -> Callable[[Lab, int, dict[str, int]], str]:
    """PostgreSQL shut down fast while cells are measured, and started again ``seconds`` later (#61: within the 60 s
    its clients wait, a sweep must end done with nothing false and no worker exited)."""
    def down(lab: Lab, sweep_id: int, marks: dict[str, int]) -> str:
        lab.measuring(marks)
        lab.server.stop()
        time.sleep(seconds)
        lab.server.start()
        return f"PostgreSQL down {seconds:g} s while cells were measured"

    return down


def resume_in_flight(lab: Lab, sweep_id: int, marks: dict[str, int]) -> str:
    lab.measuring(marks)
    return "queued with --detach; farm sweep --resume started while its cells ran"


def redeliver(lab: Lab, sweep_id: int) -> dict:
    """A finished cell's job put back as a worker killed after its commit leaves it: it must run again (on a live
    worker of its host) and store nothing."""
    import psycopg

    from farm.lab.jobs import RETRY_WITHIN_S

    with psycopg.connect(lab.url, autocommit=True) as db:
        before = db.execute("SELECT id FROM runs WHERE sweep_id = %s ORDER BY id", (sweep_id,)).fetchall()
        job = db.execute("SELECT id FROM procrastinate_jobs WHERE task_name = 'farm.cell' AND status = 'succeeded' AND "
                         "args->>'sweep_id' = %s ORDER BY id LIMIT 1", (str(sweep_id),)).fetchone()[0]
        put_back = db.execute("UPDATE procrastinate_jobs SET status = 'doing', worker_id = NULL WHERE id = %s "
                              "RETURNING NOW()", (job,)).fetchone()[0]
        deadline = time.monotonic() + RETRY_WITHIN_S + 120
        while db.execute("SELECT status::text FROM procrastinate_jobs WHERE id = %s", (job,)).fetchone()[0] != \
                "succeeded" and time.monotonic() < deadline:
            time.sleep(0.2)
        ran = db.execute("SELECT EXTRACT(EPOCH FROM MIN(at) - %s) FROM procrastinate_events WHERE job_id = %s AND "
                         "type = 'started' AND at > %s", (put_back, job, put_back)).fetchone()[0]
        after = db.execute("SELECT id FROM runs WHERE sweep_id = %s ORDER BY id", (sweep_id,)).fetchall()
    return {"ran_again_after_s": None if ran is None else round(float(ran), 1), "rows_unchanged": before == after}


def judge(result: dict, baseline_s: float | None) -> dict:
    cells = result["cells"]
    want = {(f"{h}-{i}", m) for h in ("lab1", "lab2") for i in range(DEVICES_PER_HOST) for m in MODELS}
    whole = set(cells) == want and all(
        set(runs) == {"tvm", "onnxruntime"} and all(len(v) == 1 and v[0][0] == "ok" for v in runs.values())
        for runs in cells.values())
    failed = sum(s != "ok" for runs in cells.values() for v in runs.values() for s, _ in v)
    return {"every cell once, both runtimes ok": whole, "no failed run": failed == 0,
            "the sweep done, exit 0": result["status"] == "done" and result["exit"] == 0,
            "added_s": None if baseline_s is None else round(result["seconds"] - baseline_s, 1)}


def run_faults(args: argparse.Namespace, work: Path) -> int:
    from farm.procs.supervise import free_port
    from tests.conftest import network_namespace, postgres_server_at

    if os.geteuid() != 0:
        raise SystemExit("--faults needs root: its second lab host is a network namespace")
    scenarios: list[tuple[str, Callable, bool]] = [
        ("warm-up", no_fault, False), ("baseline", no_fault, False), ("kill -9", kill_worker, False),
        ("SIGSTOP, a second worker", freeze("lab1"), False), ("SIGSTOP, no other worker", freeze("lab2"), False),
        ("PostgreSQL restart", restart_postgres, False), ("duplicate delivery", no_fault, False),
        ("resume in flight", resume_in_flight, True), ("PostgreSQL down 5 s", postgres_down(5), False),
        ("PostgreSQL down 25 s", postgres_down(25), False), ("PostgreSQL down 55 s", postgres_down(55), False)]
    if getattr(args, "only", None):
        unknown = [name for name in args.only if name not in {s[0] for s in scenarios}]
        if unknown:
            raise SystemExit(f"no scenario {unknown[0]!r}: {', '.join(s[0] for s in scenarios)}")
        scenarios = [s for s in scenarios if s[0] in ("warm-up", "baseline", *args.only)]
    results: dict[str, dict] = {}
    with network_namespace("farmf", 214) as (ns, host_addr, lab_addr), \
            postgres_server_at(f"127.0.0.1,{host_addr}", f"{lab_addr}/32") as server:
        import psycopg

        with psycopg.connect(f"{server.url}/postgres", autocommit=True) as db:
            db.execute("CREATE DATABASE lab")
        port = free_port(host_addr)
        (work / "devices.toml").write_text(inventory(host_addr, port))
        lab = Lab(work, ns, host_addr, server)
        try:
            started = lab.farm("lab1", "tracker", "start", "--host", host_addr)
            if started.returncode != 0:
                raise SystemExit(started.stderr)
            for host in ("lab1", "lab2"):
                served = lab.farm(host, "serve", *(f"--device={host}-{i}" for i in range(DEVICES_PER_HOST)))
                if served.returncode != 0:
                    raise SystemExit(f"{host}: {served.stderr}")
            for host in ("lab1", "lab1", "lab2"):
                lab.start_worker(host)
            say(f"two lab hosts ({ns} at {lab_addr}), {2 * DEVICES_PER_HOST} devices, workers {sorted(lab.workers)}")
            baseline_s = None
            for name, fault, detach in scenarios:
                say(f"scenario: {name}")
                marks = lab.marks()
                result = run_sweep(lab, fault, detach)
                if name == "duplicate delivery":
                    result["redelivery"] = redeliver(lab, result["sweep_id"])
                    result.update(lab.cells(result["sweep_id"]))
                result["goals"] = {**judge(result, baseline_s),
                                   "no worker exited": all(p.poll() is None for _, p in lab.workers.values())}
                if name in OUTLASTED:  # within the lease: no job put back, no write refused (#61)
                    said = "".join(lab.log(worker)[marks.get(worker, 0):] for worker in lab.workers)
                    result["goals"]["no job put back"] = "stalled on a silent worker" not in said
                    result["goals"]["no write refused"] = "is refused" not in said and "lost device" not in said
                if name == "warm-up":  # its compiles fill the caches: the baseline after it measures only
                    result["goals"] = {"added_s": None, **{k: v for k, v in result["goals"].items() if k != "added_s"}}
                if name == "baseline":
                    baseline_s = result["seconds"]
                results[name] = result
                say(f"  {result['seconds']} s, {result['note'] or 'no fault'}; {result['goals']}")
        finally:
            lab.stop_all()
            for host in ("lab2", "lab1"):
                lab.farm(host, "down", timeout=120)
    return report(results, args.json)


def report(results: dict[str, dict], as_json: bool) -> int:
    goals = {f"{name}: {goal}": met for name, r in results.items() for goal, met in r["goals"].items()
             if goal != "added_s"}
    if "duplicate delivery" in results:
        redelivered = results["duplicate delivery"]["redelivery"]
        goals["duplicate delivery: ran again, stored nothing"] = bool(
            redelivered["ran_again_after_s"] is not None and redelivered["rows_unchanged"])
    if as_json:
        print(json.dumps({"scenarios": {n: {k: v for k, v in r.items() if k not in ("cells", "stderr_tail")}
                                        for n, r in results.items()}, "goals_met": goals}, indent=2, default=str))
    else:
        print(f"{len(results)} sweeps over 2 lab hosts × {DEVICES_PER_HOST} devices × {len(MODELS)} models "
              "(TVM and onnxruntime each cell):")
        for name, r in results.items():
            added = r["goals"]["added_s"]
            print(f"  {name:26s} {r['seconds']:7.1f} s" + (f" ({added:+.1f} s)" if added is not None else "")
                  + f"  sweep {r['status']}, exit {r['exit']}" + (f"; {r['note']}" if r["note"] else "")
                  + (f"; redelivered: {r['redelivery']}" if "redelivery" in r else ""))
        print("\n".join(f"  {'met' if met else 'MISSED'}: {goal}" for goal, met in goals.items()))
    return 0 if all(goals.values()) else 1
