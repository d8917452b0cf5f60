"""A farm of N devices on one tracker (#13), timed: N native RPC servers, then what a user runs against them.

Starts a private tracker (a free port; --port-end = port + 1 so a clash fails loudly) and N copies of farm's
native RPC server built for this host (``farm/devices/native.py``), each in its own process group, its log
in the work folder; writes an inventory of N ``remote`` devices (dev000 … keys fleet-000 …); then, each
a fresh ``farm`` process as a user would run it:

  farm devices --json             every device online?            goal <= 2 s
  farm devices --probe --json     a no-op session on every device  goal <= 5 s
  farm sweep --model mlp          one small model on every device  goal: every cell ok

and stops what it started, by PID. Prints a table; --json prints the figures for scripts. Exit 1 when a
goal is missed.

    .venv/bin/python tools/bench_fleet.py               # N = 100
    .venv/bin/python tools/bench_fleet.py -n 20 --json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from farm.devices.native import ensure_native_server, start_native_server
from farm.records import TrackerAddress
from farm.procs.registry import ManagedProcess
from farm.procs.supervise import free_port, stop_process
from farm.rpc.launch import exited_at_start, start_tracker
from farm.rpc.tracker import wait_for_servers

REPO = Path(__file__).resolve().parent.parent
GOALS_S = {"devices": 2.0, "devices --probe": 5.0}


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def farm(args: list[str], env: dict[str, str], timeout_s: float) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "farm.cli", *args], cwd=REPO, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout_s)
    return proc, time.perf_counter() - start


def inventory(tracker: TrackerAddress, n: int) -> str:
    lines = [f'[tracker]\nhost = "{tracker.host}"\nport = {tracker.port}\n']
    for i in range(n):
        lines.append(f'[devices.dev{i:03d}]\nkind = "remote"\nkey = "fleet-{i:03d}"\n'
                     'target = { kind = "llvm", num-cores = 1 }\n')
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--servers", type=int, default=100, help="how many servers (default 100)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--keep", help="work folder to keep (default: a temporary one)")
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="farm-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    server = ensure_native_server()
    started: list[ManagedProcess] = []
    figures: dict = {"servers": args.servers}
    try:
        port = free_port()
        started.append(start_tracker("127.0.0.1", port, work))
        tracker = TrackerAddress("127.0.0.1", port)
        say(f"tracker at {tracker}; starting {args.servers} native servers ({server})")
        for i in range(args.servers):
            started.append(start_native_server(server, tracker, f"dev{i:03d}", f"fleet-{i:03d}", work))
        start = time.perf_counter()
        wait_for_servers(tracker, {f"fleet-{i:03d}": 1 for i in range(args.servers)}, timeout_s=120,
                         give_up=exited_at_start(started))
        figures["registered_s"] = round(time.perf_counter() - start, 2)
        (work / "devices.toml").write_text(inventory(tracker, args.servers))
        env = {"FARM_DEVICES": str(work / "devices.toml"), "FARM_DB": str(work / "results.db"),
               "FARM_HOME": str(work / "home")}
        rss = [int(Path(f"/proc/{r.pid}/status").read_text().split("VmRSS:")[1].split()[0]) for r in started[1:]]
        figures["server_rss_mb"] = round(sum(rss) / len(rss) / 1024, 1)

        proc, seconds = farm(["devices", "--json"], env, 120)
        online = sum(d["state"] == "online" for d in json.loads(proc.stdout)["devices"]) if proc.returncode == 0 else 0
        figures["devices"] = {"seconds": round(seconds, 2), "online": online, "exit": proc.returncode}
        say(f"farm devices: {seconds:.2f} s, {online}/{args.servers} online")

        proc, seconds = farm(["devices", "--probe", "--json"], env, 300)
        rows = json.loads(proc.stdout)["devices"] if proc.returncode == 0 else []
        probed = sum(d["state"] == "online" for d in rows)
        latencies = sorted(d["probe_ms"] for d in rows if d.get("probe_ms") is not None)
        figures["devices --probe"] = {"seconds": round(seconds, 2), "online": probed, "exit": proc.returncode,
                                      "probe_ms_median": latencies[len(latencies) // 2] if latencies else None,
                                      "probe_ms_max": latencies[-1] if latencies else None}
        say(f"farm devices --probe: {seconds:.2f} s, {probed}/{args.servers} answered a session")

        proc, seconds = farm(["sweep", "--model", "mlp", "--reference", "none", "--repeat", "5", "--min-repeat-ms", "5",
                              "--no-report", "--json"], env, 3600)
        cells = json.loads(proc.stdout)["cells"] if proc.stdout.strip() else []
        ok = sum(c["status"] == "ok" for c in cells)
        failures = sorted({c["reason"] for c in cells if c["status"] != "ok"})
        figures["sweep"] = {"seconds": round(seconds, 1), "cells": len(cells), "ok": ok, "exit": proc.returncode,
                            "failures": failures[:5]}
        say(f"farm sweep --model mlp: {seconds:.1f} s, {ok}/{len(cells)} cells ok")
        if proc.returncode != 0:
            say(proc.stderr[-2000:])
    finally:
        for record in reversed(started):
            stop_process(record)
    goals = {
        "devices": figures.get("devices", {}).get("seconds", 1e9) <= GOALS_S["devices"]
        and figures["devices"]["online"] == args.servers,
        "devices --probe": figures.get("devices --probe", {}).get("seconds", 1e9) <= GOALS_S["devices --probe"]
        and figures["devices --probe"]["online"] == args.servers,
        "sweep": figures.get("sweep", {}).get("ok") == args.servers,
    }
    figures["goals_met"] = goals
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"{args.servers} native servers ({figures.get('server_rss_mb')} MB each), registered in "
              f"{figures.get('registered_s')} s")
        for name in ("devices", "devices --probe"):
            f = figures[name]
            print(f"  farm {name:16s} {f['seconds']:6.2f} s  {f['online']}/{args.servers} online   goal <= "
                  f"{GOALS_S[name]:g} s: {'ok' if goals[name] else 'MISSED'}")
        s = figures["sweep"]
        print(f"  farm sweep --model mlp  {s['seconds']:6.1f} s  {s['ok']}/{s['cells']} cells ok   goal: every cell: "
              f"{'ok' if goals['sweep'] else 'MISSED'}")
        for reason in s["failures"]:
            print(f"    failed: {reason}")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
