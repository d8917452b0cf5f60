"""The read side at farm scale (#12): a year of nightly sweeps, then the verbs that read it, timed.

Builds a results database through farm's own Store: NIGHTS sweeps × DEVICES × MODELS runs with
REPEATS raw steady samples each (defaults: 50 × 40 × 25 = 50,000 runs, 1.5 M samples). Every series
is steady with a little night-to-night noise; on the last night a 10 % slower artifact is injected
into --step series, or with --mass into every series of half the models (a toolchain change slowing
half the models on every device: 500 screened alerts at the default size, #22). Then, in one run, each
verb as a user runs it (a fresh `farm` process), its wall time and peak memory (the process's max RSS):

  farm regressions --json     and the candidates it finds must be exactly the injected series (first, so
                              the reports below review a sweep whose alerts are stored); with --mass, one
                              finding naming exactly the slowed models on every device
  farm report                 the results report
  farm report --sweep LAST    the same with the last sweep's review (what `farm sweep` writes); its size
  farm results --csv
  farm drift --all --json
  dashboard /api/state        collect_state, the dashboard's endpoint (in a fresh process)

    .venv/bin/python tools/bench_scale.py                          # 50 × 40 × 25 (build: minutes)
    .venv/bin/python tools/bench_scale.py --nights 10 --devices 8 --models 5   # a quick look
    .venv/bin/python tools/bench_scale.py --keep DIR               # build once into DIR, reuse later

Goals (#12): each verb <= 10 s, the dashboard <= 1 s, peak memory <= 2 GiB; the sweep's report <= 5 MB
(#22). Prints a table, and --json prints the figures for scripts. Exit 1 when a goal or the found ==
injected check fails.

    .venv/bin/python tools/bench_scale.py --mass --keep /tmp/farm-mass    # the night that matters most
    .venv/bin/python tools/bench_scale.py --profiles   # and every run profiled (#52), 60 kernels each
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

import numpy as np

from farm.records import (Artifact, BenchConfig, BenchResult, CheckResult, Device, InputSpec, KernelProfile,
                          KernelTime, ModelSource, SweepSpec)
from farm.store import Store

GOALS_S = {"dashboard": 1.0}
GOAL_S = 10.0
GOAL_RSS_MB = 2048
GOAL_REPORT_MB = 5.0
TVM_VERSION = "0.27.0.post1"


PROFILE_KERNELS = 60  # --profiles: each run's profile, a resnet50's worth of kernels


def profile_of(level: float, shares: np.ndarray) -> KernelProfile:
    """A run's per-kernel profile at farm's size: PROFILE_KERNELS kernels (the series' own ``shares`` of its time),
    each with args, FLOPs and schedule."""
    shares = shares * level * 0.97
    classes = ("conv", "matmul/dense", "pool", "elementwise", "layout/copy/concat", "reduction")
    return KernelProfile("ok", "", "wall, the device synced before and after each call", 10, level, tuple(
        KernelTime(f"fused_{classes[i % 6].split('/')[0]}2d_add_relu{i}", classes[i % 6], 1.0, float(t),
                   ("float32[1, 64, 56, 56]", "float32[64, 64, 3, 3]", "float32[64]", "float32[1, 64, 56, 56]"),
                   231211008.0, "tuned") for i, t in enumerate(shares)))


def build(db: Path, nights: int, devices: int, models: int, repeats: int, steps: int, seed: int,
          mass: bool = False, profiles: bool = False) -> list[tuple[str, str]]:
    """Write the database; returns the (device, model) series given a 10 % step on the last night: ``steps`` of
    them at random, or with ``mass`` every series of half the models."""
    rng = np.random.default_rng(seed)
    device_names = [f"dev{d:02d}" for d in range(devices)]
    model_names = [f"model{m:02d}" for m in range(models)]
    series = [(d, m) for d in device_names for m in model_names]
    stepped = [series[int(i)] for i in rng.choice(len(series), size=min(steps, len(series)), replace=False)]
    if mass:
        slowed = set(model_names[: models // 2])
        stepped = [(d, m) for d, m in series if m in slowed]
    base = {s: 1e-3 * (1 + rng.random() * 9) for s in series}
    kernel_shares = {s: rng.dirichlet(np.ones(PROFILE_KERNELS)) for s in series} if profiles else {}
    inventory = {d: Device(d, "remote", d, {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}) for d in device_names}
    sources = {m: ModelSource(m, f"builtin:{m}", f"digest-{m}", b"", (InputSpec("x", (1, 64), "float32"),))
               for m in model_names}
    config = BenchConfig(repeat=repeats)
    spec = SweepSpec(tuple(device_names), tuple(model_names), reference=None, config=config)
    started = time.monotonic()
    with Store(db) as store:
        for night in range(1, nights + 1):
            sweep_id = store.start_sweep(spec.to_json())
            for device, model in series:
                slower = night == nights and (device, model) in stepped
                level = base[(device, model)] * (1.10 if slower else 1.0) * (1 + rng.normal(0, 0.004))
                loads = 1.10 if slower and mass else 1.0  # a toolchain change: its loads and first runs too
                samples = level * (1 + rng.normal(0, 0.01, repeats))
                target = dict(inventory[device].target)
                artifact = Artifact(f"{device}-{model}{'-slow' if slower else ''}", "/nonexistent", model,
                                    sources[model].digest, target, "so", "default", TVM_VERSION, "f", 1.0,
                                    pipeline_version=2)
                result = BenchResult(
                    device=device, key=device, model=model, model_digest=sources[model].digest, status="ok",
                    artifact_key=artifact.cache_key, upload_s=0.01, load_s=0.02 * loads * (1 + rng.normal(0, 0.004)),
                    first_run_s=0.05 * loads * (1 + rng.normal(0, 0.004)), steady_number=10,
                    steady_samples_s=tuple(float(v) for v in samples), check=CheckResult("passed", 1e-6),
                    config=config, started_at=f"2026-{1 + night // 28:02d}-{1 + night % 28:02d}T02:00:00+00:00",
                    context={"farm_version": "bench", "tvm_version": TVM_VERSION, "target": target,
                             "pipeline_version": 2, "device_kind": "remote", "emulated": False, "thermal": None},
                    profile=profile_of(level, kernel_shares[(device, model)]) if profiles else None)
                store.record_result(result, inventory[device], sources[model], artifact, sweep_id=sweep_id)
            store.finish_sweep(sweep_id, "done")
            print(f"night {night}/{nights}: {len(series)} runs ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return stepped


def timed(command: list[str], env: dict[str, str]) -> dict:
    """Run ``command``; its wall time and max RSS (os.wait4: this child alone)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}): {stderr.strip()[-500:]}")
    return {"seconds": seconds, "rss_mb": usage.ru_maxrss / 1024, "stdout": stdout}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nights", type=int, default=50)
    parser.add_argument("--devices", type=int, default=40)
    parser.add_argument("--models", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--step", type=int, default=12, help="series given a 10 %% step on the last night")
    parser.add_argument("--mass", action="store_true",
                        help="instead: every series of half the models 10 %% slower on the last night (#22)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profiles", action="store_true",
                        help=f"every run with a per-kernel profile of {PROFILE_KERNELS} kernels (#52: a year of nightly "
                             "profiles)")
    parser.add_argument("--keep", help="folder for the database: built once, reused when it exists")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="farm-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    db, injected_file = work / "results.db", work / "injected.json"
    shape = {k: getattr(args, k) for k in ("nights", "devices", "models", "repeats", "step", "seed", "mass")}
    if not (db.exists() and injected_file.exists() and json.loads(injected_file.read_text())["shape"] == shape):
        db.unlink(missing_ok=True)
        start = time.monotonic()
        stepped = build(db, args.nights, args.devices, args.models, args.repeats, args.step, args.seed, args.mass,
                        args.profiles)
        injected_file.write_text(json.dumps({"shape": shape, "series": stepped, "build_s": time.monotonic() - start}))
    injected = {tuple(s) for s in json.loads(injected_file.read_text())["series"]}
    size_mb = db.stat().st_size / 2**20

    farm = [sys.executable, "-m", "farm.cli"]
    env = {**os.environ, "FARM_DB": str(db), "FARM_DEVICES": str(work / "no-inventory.toml"), "FARM_HOME": str(work / "home")}
    inventory = work / "devices.toml"
    inventory.write_text("".join(f'[devices.dev{d:02d}]\nkind = "remote"\nkey = "dev{d:02d}"\n'
                                 f'target = {{ kind = "llvm", mtriple = "aarch64-linux-gnu" }}\n' for d in range(args.devices)))
    dashboard = ("import json, sys; from farm.views.dashboard import collect_state; from farm.inventory import load_inventory; "
                 "state = collect_state(load_inventory(sys.argv[1]), sys.argv[2]); print(json.dumps(state['sweep']))")
    verbs = {
        "regressions": [*farm, "regressions", "--json"],
        "report": [*farm, "report", "--out", str(work / "report.html")],
        "report --sweep": [*farm, "report", "--sweep", str(args.nights), "--out", str(work / "sweep-report.html")],
        "results --csv": [*farm, "results", "--csv"],
        "drift --all": [*farm, "drift", "--all", "--json"],
        "dashboard": [sys.executable, "-c", dashboard, str(inventory), str(db)],
    }
    figures = {}
    for name, command in verbs.items():
        figures[name] = timed(command, env)
        print(f"{name}: {figures[name]['seconds']:.1f} s, {figures[name]['rss_mb']:.0f} MB", file=sys.stderr)
    # the dashboard's own time, without starting Python and importing farm
    figures["dashboard"]["endpoint_s"] = json.loads(timed(
        [sys.executable, "-c", "import json, sys, time; from farm.views.dashboard import collect_state; "
         "from farm.inventory import load_inventory; inv = load_inventory(sys.argv[1]); t = time.perf_counter(); "
         "collect_state(inv, sys.argv[2]); print(json.dumps(time.perf_counter() - t))", str(inventory), str(db)],
        env)["stdout"])

    reviewed = json.loads(figures["regressions"]["stdout"])
    alerts, findings = reviewed["alerts"], reviewed["findings"]
    found = {(a["device"], a["model"]) for a in alerts if a["status"] == "candidate" and a["metric"] == "steady"}
    # --mass moves loads and first runs of the injected series too: those alerts are expected
    others = [a for a in alerts if not (a["status"] == "candidate" and (a["metric"] == "steady" or args.mass)
                                         and (a["device"], a["model"]) in injected)]
    named = [{(s["device"], s["model"]) for s in f["series"]} for f in findings]
    # the injected series are the findings' series; with --mass one finding per moved metric (steady, load, first
    # run), each naming exactly the slowed models on every device
    findings_ok = set().union(*named) == injected if named else not injected
    if args.mass:
        findings_ok = 1 <= len(findings) <= 3 and all(n == injected for n in named)
    report_mb = (work / "sweep-report.html").stat().st_size / 2**20
    rows = []
    ok = found == injected and not others and findings_ok and report_mb <= GOAL_REPORT_MB
    for name, f in figures.items():
        goal = GOALS_S.get(name, GOAL_S)
        seconds = f.get("endpoint_s", f["seconds"])
        passed = seconds <= goal and f["rss_mb"] <= GOAL_RSS_MB
        ok = ok and passed
        rows.append({"verb": name, "seconds": round(f["seconds"], 2), "endpoint_s": f.get("endpoint_s"),
                     "rss_mb": round(f["rss_mb"]), "goal_s": goal, "ok": passed})
    summary = {"shape": shape, "runs": args.nights * args.devices * args.models,
               "samples": args.nights * args.devices * args.models * args.repeats, "db_mb": round(size_mb, 1),
               "verbs": rows, "injected": sorted(injected), "found": sorted(found), "other_alerts": len(others),
               "found_equals_injected": found == injected and not others, "report_mb": round(report_mb, 2),
               "findings": [f["sentence"] for f in findings], "findings_equal_injected": findings_ok, "ok": ok}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{summary['runs']} runs, {summary['samples']} samples, {summary['db_mb']} MB of SQLite ({work})")
        for r in rows:
            extra = f" (endpoint {r['endpoint_s']:.2f} s)" if r["endpoint_s"] is not None else ""
            print(f"  {r['verb']:16s} {r['seconds']:7.2f} s{extra}  {r['rss_mb']:5d} MB  "
                  f"goal <= {r['goal_s']:g} s: {'ok' if r['ok'] else 'MISSED'}")
        print(f"  regressions found {len(found)}, injected {len(injected)}, other alerts {len(others)}: "
              f"{'equal' if summary['found_equals_injected'] else 'DIFFERENT'}")
        print(f"  sweep report {report_mb:.2f} MB (goal <= {GOAL_REPORT_MB:g} MB); {len(findings)} finding(s), "
              f"{'naming exactly the injected series' if findings_ok else 'NOT the injected series'}:")
        for sentence in summary["findings"][:5]:
            print(f"    {sentence}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
