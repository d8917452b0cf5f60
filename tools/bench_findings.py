"""Findings against planted truth (#32): nights of every shape, built through Store, and how well findings explain them.

A lab of --devices devices (kinds android, linux and opencl; tags soc:* and rack:*) × --models models (each with a few
ONNX op types, DepthwiseConv among them; some int8 variants) measured for --nights nights with realistic noise
(--noise night-to-night per series, 0.3 % per device and night, 1 % between samples). The history is built once;
each shape copies it and plants its last night, at each --effects slowdown:

  whole-models    5 models slower on every device
  whole-devices   4 devices slower on every model
  block           devices tagged soc:sd888 × models with DepthwiseConv
  scatter-20/50/80  a random 20 / 50 / 80 % of all series, independent of model and device
  upgrade         TVM 0.27 → 0.28 on every series; models with DepthwiseConv slower on devices of target kind opencl
  two-causes      devices of kind linux × models with Gemm, plus 3 single series elsewhere
  aa              nothing planted

Per shape and effect, what `farm --json regressions` says (a fresh process, as a user runs it):

  findings        how many
  per cause       the most findings one planted cause is spread over (a finding belongs to the cause most of its
                  alerts are planted by; goal ≤ 2)
  top-3           the share of planted alerts (alerts on planted series) that the top 3 findings hold (goal ≥ 90 %)
  false           the share of findings most of whose alerts no cause planted
  confirmed       findings confirmed after a simulated confirmation: each representative's rerun confirms when its
                  series was planted, rejects otherwise (the interleaved rounds' 0 % false alarms, bench_detect.py)
                  (goal for aa: 0)

and at --effects' first value, the scale goals (#32): `farm regressions` ≤ 5 s; `farm report --sweep LAST` ≤ 10 s and
≤ 5 MB.

    .venv/bin/python tools/bench_findings.py                      # 50 × 40 × 25 (build: minutes)
    .venv/bin/python tools/bench_findings.py --nights 24 --devices 12 --models 10 --shapes block aa   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from farm.records import (Artifact, BenchConfig, BenchResult, CheckResult, Device, InputSpec, ModelSource, SweepSpec)
from farm.analysis.regress import METHOD
from farm.store import Store

SHAPES = ("whole-models", "whole-devices", "block", "scatter-20", "scatter-50", "scatter-80", "upgrade", "two-causes",
          "aa")
OPS = ("Conv", "Gemm", "MatMul", "Softmax", "LayerNormalization", "MaxPool", "Resize", "Add")
SOCS = ("soc:sd888", "soc:sd865", "soc:exynos2100", "soc:tensor-g2", "soc:rk3588")
GOAL_REGRESSIONS_S, GOAL_REPORT_S, GOAL_REPORT_MB = 5.0, 10.0, 5.0
OLD_TVM, NEW_TVM = "0.27.0", "0.28.0"


@dataclass(frozen=True)
class Lab:
    """The planted lab: its devices (with kind, target and tags) and models (with ops), and each series' level."""

    devices: dict[str, Device]
    models: dict[str, ModelSource]
    levels: dict[tuple[str, str], float]


@dataclass(frozen=True)
class Plant:
    """A shape's last night: series → (factor, cause), and the night's TVM."""

    slowed: dict[tuple[str, str], tuple[float, str]]
    tvm: str = OLD_TVM


def make_lab(devices: int, models: int, rng: np.random.Generator) -> Lab:
    lab_devices = {}
    for d in range(devices):
        kind = ("android", "linux", "opencl")[d % 3]
        target = {"kind": "opencl", "host": {"kind": "llvm", "mtriple": "aarch64-linux-android"}} if kind == "opencl" \
            else {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
        name = f"dev{d:02d}"
        lab_devices[name] = Device(name, kind, name, target, tags=(SOCS[d % len(SOCS)], f"rack:{d % 4}"))
    lab_models = {}
    for m in range(models):
        name = f"model{m:02d}" + ("@int8" if m % 5 == 4 else "")
        ops = set(rng.choice(OPS, 3, replace=False).tolist()) | ({"DepthwiseConv"} if m % 4 == 1 else set())
        lab_models[name] = ModelSource(name, f"builtin:{name}", f"digest-{name}", b"",
                                       (InputSpec("x", (1, 64), "float32"),), ops=tuple(sorted(ops)))
    levels = {(d, m): 1e-3 * (1 + 9 * rng.random()) for d in lab_devices for m in lab_models}
    return Lab(lab_devices, lab_models, levels)


def record_night(store: Store, lab: Lab, night: int, rng: np.random.Generator, noise: float, repeats: int,
                 plant: Plant | None = None) -> None:
    """One sweep of every series: level × planted factor × noise, stored as a sweep stores it."""
    config = BenchConfig(repeat=repeats)
    spec = SweepSpec(tuple(lab.devices), tuple(lab.models), reference=None, config=config)
    sweep_id = store.start_sweep(spec.to_json())
    device_night = {d: 1 + rng.normal(0, 0.003) for d in lab.devices}
    tvm = plant.tvm if plant else OLD_TVM
    for (device, model), level in lab.levels.items():
        factor, _ = plant.slowed.get((device, model), (1.0, "")) if plant else (1.0, "")
        value = level * factor * device_night[device] * (1 + rng.normal(0, noise))
        target = lab.devices[device].target
        artifact = Artifact(f"{device}-{model}-{tvm}{'-slow' if factor != 1 else ''}", "/nonexistent", model,
                            lab.models[model].digest, target, "so", "default", tvm, "f", 1.0, pipeline_version=2)
        result = BenchResult(
            device=device, key=device, model=model, model_digest=lab.models[model].digest, status="ok",
            artifact_key=artifact.cache_key, upload_s=0.01, load_s=0.02 * (1 + rng.normal(0, 0.004)),
            first_run_s=0.05 * (1 + rng.normal(0, 0.004)), steady_number=10,
            steady_samples_s=tuple(float(v) for v in value * (1 + rng.normal(0, 0.01, repeats))),
            check=CheckResult("passed", 1e-6), config=config,
            started_at=f"2026-{1 + night // 28:02d}-{1 + night % 28:02d}T02:00:00+00:00",
            context={"farm_version": "bench", "tvm_version": tvm, "target": target, "pipeline_version": 2,
                     "device_kind": lab.devices[device].kind, "emulated": False, "thermal": None})
        store.record_result(result, lab.devices[device], lab.models[model], artifact, sweep_id=sweep_id)
    store.finish_sweep(sweep_id, "done")


def plant(shape: str, lab: Lab, effect: float, rng: np.random.Generator) -> Plant:
    """The series a shape slows on its last night, each with its cause's name."""
    series = list(lab.levels)
    devices, models = list(lab.devices), list(lab.models)
    factor = 1 + effect

    def where(name: str, cells) -> dict[tuple[str, str], tuple[float, str]]:
        return {c: (factor, name) for c in cells}
    tagged = {d for d, dev in lab.devices.items() if "soc:sd888" in dev.tags}
    with_op = {m for m, src in lab.models.items() if "DepthwiseConv" in src.ops}
    if shape == "whole-models":
        chosen = set(rng.choice(models, 5, replace=False).tolist())
        return Plant(where("models", [c for c in series if c[1] in chosen]))
    if shape == "whole-devices":
        chosen = set(rng.choice(devices, 4, replace=False).tolist())
        return Plant(where("devices", [c for c in series if c[0] in chosen]))
    if shape == "block":
        return Plant(where("block", [c for c in series if c[0] in tagged and c[1] in with_op]))
    if shape.startswith("scatter-"):
        share = int(shape.split("-")[1]) / 100
        return Plant(where("scatter", [c for c in series if rng.random() < share]))
    if shape == "upgrade":
        opencl = {d for d, dev in lab.devices.items() if dev.target["kind"] == "opencl"}
        return Plant(where("upgrade", [c for c in series if c[0] in opencl and c[1] in with_op]), tvm=NEW_TVM)
    if shape == "two-causes":
        linux = {d for d, dev in lab.devices.items() if dev.kind == "linux"}
        gemm = {m for m, src in lab.models.items() if "Gemm" in src.ops}
        block = [c for c in series if c[0] in linux and c[1] in gemm]
        others = [c for c in series if c not in set(block)]
        singles = [others[int(i)] for i in rng.choice(len(others), 3, replace=False)]
        return Plant({**where("block", block), **{c: (factor, f"single {c[0]} {c[1]}") for c in singles}})
    return Plant({})


def measure(planted: Plant, out: dict) -> dict:
    """The measures of one shape from `farm --json regressions`' alerts and findings."""
    alerts = {a["id"]: a for a in out["alerts"]}
    cause_of = {a_id: planted.slowed[(a["device"], a["model"])][1] for a_id, a in alerts.items()
                if a["metric"] == "steady" and (a["device"], a["model"]) in planted.slowed}
    findings = out["findings"]
    owners: dict[str, int] = {}
    false = 0
    for f in findings:
        causes = [cause_of.get(a_id) for a_id in f["alerts"]]
        top = max(set(causes), key=causes.count) if causes else None
        if top is None or causes.count(top) * 2 <= len(causes):
            false += 1
        else:
            owners[top] = owners.get(top, 0) + 1
    held = {a_id for f in findings[:3] for a_id in f["alerts"]}
    return {"alerts": len(alerts), "planted_alerts": len(cause_of), "findings": len(findings),
            "per_cause": max(owners.values(), default=0),
            "top3": len(held & set(cause_of)) / len(cause_of) if cause_of else None,
            "false": false / len(findings) if findings else 0.0,
            "sentences": [f["sentence"] for f in findings[:3]]}


def confirm(db: Path, planted: Plant, out: dict) -> None:
    """What confirmation would store: each finding's representatives rerun, confirmed when planted."""
    alerts = {a["id"]: a for a in out["alerts"]}
    with Store(db) as store:
        for f in out["findings"]:
            for a_id in f["representatives"] if f["direction"] == "slower" else ():
                a = alerts[a_id]
                hit = (a["device"], a["model"]) in planted.slowed and a["metric"] == "steady"
                store.save_alert(a, METHOD.to_json(), "confirmed" if hit else "rejected",
                                 {"rounds": 8, "verdict": "slower" if hit else "same", "simulated": True})


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return time.perf_counter() - start, proc.stdout


def run_shape(base: Path, work: Path, lab: Lab, shape: str, effect: float, args: argparse.Namespace) -> dict:
    rng = np.random.default_rng([args.seed, SHAPES.index(shape), int(effect * 1000)])
    db = work / f"{shape}-{effect:g}.db"
    shutil.copy(base, db)
    planted = plant(shape, lab, effect, rng)
    with Store(db) as store:
        record_night(store, lab, args.nights, rng, args.noise, args.repeats, planted)
    env = {**os.environ, "FARM_DB": str(db), "FARM_DEVICES": str(work / "no-inventory.toml"),
           "FARM_HOME": str(work / "home")}
    farm = [sys.executable, "-m", "farm.cli"]
    regressions_s, stdout = timed([*farm, "--json", "regressions"], env)
    row = {"shape": shape, "effect": effect, **measure(planted, json.loads(stdout)), "regressions_s": regressions_s}
    confirm(db, planted, json.loads(stdout))
    after = json.loads(timed([*farm, "--json", "regressions"], env)[1])["findings"]
    row["confirmed"] = sum(f["confirmed"] > 0 for f in after)
    if effect == args.effects[0]:
        html = work / f"{shape}.html"
        row["report_s"] = timed([*farm, "report", "--sweep", str(args.nights), "--out", str(html)], env)[0]
        row["report_mb"] = html.stat().st_size / 2**20
    db.unlink()
    return row


def build_history(base: Path, lab: Lab, args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    started = time.monotonic()
    with Store(base) as store:
        for night in range(1, args.nights):
            record_night(store, lab, night, rng, args.noise, args.repeats)
            print(f"night {night}/{args.nights - 1}: {time.monotonic() - started:.0f} s", file=sys.stderr)


def table(rows: list[dict]) -> str:
    lines = ["| shape | effect | alerts (planted) | findings | per cause | top-3 explain | false causes | confirmed |"
             " regressions s | report s | report MB |", "|" + "---|" * 11]
    for r in rows:
        top3 = "–" if r["top3"] is None else f"{r['top3']:.0%}"
        report = (f"{r['report_s']:.1f} | {r['report_mb']:.2f}" if "report_s" in r else "– | –")
        lines.append(f"| {r['shape']} | {r['effect']:.0%} | {r['alerts']} ({r['planted_alerts']}) | {r['findings']} | "
                     f"{r['per_cause']} | {top3} | {r['false']:.0%} | {r['confirmed']} | {r['regressions_s']:.1f} | "
                     f"{report} |")
    return "\n".join(lines)


def goals(row: dict) -> bool:
    ok = row["per_cause"] <= 2 and (row["top3"] is None or row["top3"] >= 0.9)
    ok = ok and (row["shape"] != "aa" or row["confirmed"] == 0)
    ok = ok and row["regressions_s"] <= GOAL_REGRESSIONS_S
    return ok and row.get("report_s", 0) <= GOAL_REPORT_S and row.get("report_mb", 0) <= GOAL_REPORT_MB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nights", type=int, default=50)
    parser.add_argument("--devices", type=int, default=40)
    parser.add_argument("--models", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--noise", type=float, default=0.01, help="night-to-night noise of a series (default 1 %%)")
    parser.add_argument("--effects", type=float, nargs="+", default=[0.10, 0.03])
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--keep", help="folder for the history database: built once, reused when it exists")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="farm-findings-"))
    work.mkdir(parents=True, exist_ok=True)
    lab = make_lab(args.devices, args.models, np.random.default_rng(args.seed))
    shape_key = {k: getattr(args, k) for k in ("nights", "devices", "models", "repeats", "noise", "seed")}
    base, stamp = work / "history.db", work / "history.json"
    if not (base.exists() and stamp.exists() and json.loads(stamp.read_text()) == shape_key):
        base.unlink(missing_ok=True)
        build_history(base, lab, args)
        stamp.write_text(json.dumps(shape_key))
    rows = []
    for shape in args.shapes:
        for effect in args.effects:
            rows.append(run_shape(base, work, lab, shape, effect, args))
            print(f"{shape} {effect:.0%}: {rows[-1]['findings']} finding(s)", file=sys.stderr)
    ok = all(goals(r) for r in rows)
    if args.json:
        print(json.dumps({"shape": shape_key, "rows": rows, "ok": ok}, indent=2))
    else:
        print(table(rows))
        for r in rows:
            print(f"\n{r['shape']} {r['effect']:.0%}:" + "".join(f"\n  {s}" for s in r["sentences"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
