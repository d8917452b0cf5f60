"""Findings (#22): databases written through Store with planted ground truth; `farm --json regressions` and the report
must name exactly the planted findings, ranked as planted. No TVM: runs are written as a sweep would store them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from farm.records import (Alert, Artifact, BenchConfig, BenchResult, CheckResult, CopyTiming, Device, InputSpec,
                          ModelSource, SweepSpec)
from farm.store import Store
from tests.conftest import env_in, make_run, run_farm

DEVICES = [f"dev{d}" for d in range(6)]
MODELS = [f"m{m}" for m in range(8)]
NIGHTS = 8
COPY_S = 1.4e-6  # an output copy of a few bytes: its nightly swings are noise below the timer's resolution


def plant(db: Path, effect=lambda night, device, model: 1.0, tvm=lambda night: "0.27.0", same_artifact=lambda d, m: False,
          reference: bool = False, tuned=lambda night, device, model: 0, nights: int = NIGHTS, seed: int = 3,
          copy_effect=lambda night, device: 1.25 if night == NIGHTS and device == "dev0" else 1.0,
          records=lambda night: "t", profile=None, night_noise: float = 0.004, manifest=None) -> None:
    """NIGHTS sweeps of DEVICES × MODELS: steady levels of 1-10 ms with 0.4 % night-to-night noise and 1 % sample
    noise, load and first run steady, one output copy of ~1.4 µs swinging by 8 % (noise); ``effect`` multiplies a
    series' level on a night; ``tvm`` names each night's TVM; a series whose effect moved it gets a new artifact
    unless ``same_artifact`` (a driver, not the code); ``reference``: onnxruntime runs beside each cell, unaffected
    by TVM; ``tuned``: tasks with a record (of 10); ``copy_effect``: a copy's swing (by default 25 % on one device
    the last night: 0.35 µs); ``records``: the night's tuning key record set, shared by every tuned model (its digest
    is the artifacts' ``tuning_digest``); ``profile(night, device, model, level, value)``: a TVM run's stored
    profile (None: not profiled)."""
    rng = np.random.default_rng(seed)
    base = {(d, m): 1e-3 * (1 + 9 * rng.random()) for d in DEVICES for m in MODELS}
    target = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
    devices = {d: Device(d, "remote", d, target) for d in DEVICES}
    sources = {m: ModelSource(m, f"builtin:{m}", f"digest-{m}", b"", (InputSpec("x", (1, 8), "float32"),)) for m in MODELS}
    config = BenchConfig(repeat=20)
    with Store(db) as store:
        for night in range(1, nights + 1):
            sweep_id = store.start_sweep(SweepSpec(tuple(DEVICES), tuple(MODELS), None, config).to_json())
            version = tvm(night)
            for (device, model), level in base.items():
                factor = effect(night, device, model)
                for runtime in ("tvm", "onnxruntime") if reference else ("tvm",):
                    moved = runtime == "tvm" and factor != 1.0
                    value = level * (factor if runtime == "tvm" else 0.7) * (1 + rng.normal(0, night_noise))
                    tasks = tuned(night, device, model) if runtime == "tvm" else 0
                    digest = f"{records(night)}{tasks}" if tasks else ""
                    key = f"{device}-{model}-{version}-{tasks}-{digest}" + (
                        "-new" if moved and not same_artifact(device, model) else "")
                    artifact = None if runtime != "tvm" else Artifact(
                        key, "/nonexistent", model, f"digest-{model}", target, "so", "default", version, "f", 1.0,
                        tuning_digest=digest, tuned_tasks=tasks, total_tasks=10 if tasks else 0)
                    result = BenchResult(
                        device=device, key=device, model=model, model_digest=f"digest-{model}", status="ok",
                        artifact_key=key if artifact else "", load_s=0.02 * (1 + rng.normal(0, 0.004)),
                        first_run_s=0.05 * (1 + rng.normal(0, 0.004)), steady_number=10,
                        steady_samples_s=tuple(float(v) for v in value * (1 + rng.normal(0, 0.01, 20))),
                        copies=(CopyTiming(0, 40, (1, 10), "float32", 1000, tuple(
                            float(v) for v in COPY_S * copy_effect(night, device) * (1 + rng.normal(0, 0.08))
                            * (1 + rng.normal(0, 0.01, 5)))),),
                        runtime=runtime, runtime_version="1.20.0" if runtime != "tvm" else "",
                        check=CheckResult("passed", 1e-6), config=config, started_at=f"2026-01-{night:02d}T02:00:00+00:00",
                        context={"farm_version": "1.0", "tvm_version": version, "target": target, "pipeline_version": 2,
                                 **({"manifest": manifest(night, device, model)} if manifest else {})},
                        profile=profile(night, device, model, level, value) if profile and runtime == "tvm" else None)
                    store.record_result(result, devices[device], sources[model], artifact, sweep_id=sweep_id)
            store.finish_sweep(sweep_id, "done")


def regressions(db: Path, *args: str) -> dict:
    out = run_farm("--json", "regressions", *args, env={**env_in(db.parent), "FARM_DB": str(db)})
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)


def report(db: Path) -> str:
    html = db.parent / "report.html"
    out = run_farm("report", "--sweep", str(NIGHTS), "--out", str(html), env={**env_in(db.parent), "FARM_DB": str(db)})
    assert out.returncode == 0, out.stderr
    return html.read_text()


MASS = set(MODELS[:4])  # half the models, 12 % slower everywhere
DRIVER = "dev5"  # its driver: every model 15 % slower, the same artifacts
SINGLE = ("dev1", "m6")  # one series, 20 % slower


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("mixed") / "results.db"

    def effect(night, device, model):
        if night != NIGHTS:
            return 1.0
        factor = 1.12 if model in MASS else 1.0
        factor *= 1.15 if device == DRIVER else 1.0
        return factor * (1.20 if (device, model) == SINGLE else 1.0)
    plant(db, effect, same_artifact=lambda d, m: d == DRIVER and m not in MASS)
    return db


def test_mixed_night_names_exactly_the_planted_findings_ranked_as_planted(mixed):
    out = regressions(mixed)
    findings = out["findings"]
    kinds = [(f["kind"], f["direction"], f["metric"]) for f in findings]
    assert kinds == [("sweep", "slower", "steady"), ("device", "slower", "steady"), ("series", "slower", "steady")], \
        [f["sentence"] for f in findings]
    mass, driver, single = findings
    # n: the series of its block (#32), no longer every judged series
    assert set(mass["models"]) == MASS and mass["devices"] == DEVICES and mass["k"] == 24 and mass["n"] == 24
    assert 0.11 < mass["change"] < 0.13 and mass["ci"][0] < mass["change"] < mass["ci"][1]
    assert mass["sentence"].startswith("4 models are 12.") and "on 6/6 devices" in mass["sentence"]
    assert driver["devices"] == [DRIVER] and driver["k"] == 8 and driver["n"] == 8  # all its models
    assert 0.14 < driver["change"] < 0.16  # the driver's own change: the models the mass regression did not move too
    assert "same artifacts as the baseline: the device changed" in driver["sentence"]
    assert (single["devices"], single["models"]) == ([SINGLE[0]], [SINGLE[1]]) and 0.18 < single["change"] < 0.22
    # each finding lists its series and alerts; every alert it names is one of the sweep's
    ids = {a["id"] for a in out["alerts"]}
    assert all(set(f["alerts"]) <= ids and len(f["series"]) == f["k"] for f in findings)
    # the copies swung too (alerts), but 8 % of 1.4 µs is below the timer's resolution: never a finding
    assert any(a["metric"] == "copy" for a in out["alerts"])
    assert all(f["metric"] == "steady" for f in findings)


def test_the_report_reads_like_a_review(mixed):
    out = regressions(mixed)
    html = report(mixed)
    text = re.sub(r"<[^>]+>", "", html)
    first = [text.index(f["sentence"].replace("→", "→")) for f in out["findings"]]
    assert first == sorted(first)  # in rank order, one sentence each
    assert text.index(out["findings"][0]["sentence"]) < text.index("Latest run per device × model")  # before any table
    assert html.count("<img") <= 24


def test_noise_only_nights_have_no_findings(tmp_path):
    db = tmp_path / "results.db"
    plant(db)
    out = regressions(db)
    assert out["findings"] == []
    assert "No findings" in report(db)


def test_a_tvm_upgrade_is_a_finding_with_its_control(tmp_path):
    db = tmp_path / "results.db"
    slowed = {"m0", "m1", "m2"}
    plant(db, lambda night, device, model: 1.10 if night == NIGHTS and model in slowed else 1.0,
          tvm=lambda night: "0.28.0" if night == NIGHTS else "0.27.0", reference=True,
          tuned=lambda night, device, model: 10 if model == "m7" and night < NIGHTS else 0)
    out = regressions(db)
    findings = out["findings"]
    assert [(f["kind"], f["cause"], f["split"]) for f in findings if f["metric"] == "steady"] == [
        ("upgrade", "TVM 0.27.0 → 0.28.0", "same tuning coverage")], [f["sentence"] for f in findings]
    upgrade = findings[0]
    assert set(upgrade["models"]) == slowed and upgrade["devices"] == DEVICES and upgrade["k"] == 18
    assert 0.09 < upgrade["change"] < 0.11
    assert upgrade["confidence"] == "unconfirmable: runtime changed"
    assert upgrade["control"].startswith("onnxruntime unchanged on 6/6 devices")
    assert upgrade["sentence"].startswith("3 models are ") and "since TVM 0.27.0 → 0.28.0" in upgrade["sentence"]
    # the baselines still restarted: regress's own verdicts of the new context have no baseline
    assert all(a["baseline"].get("context_change") == "TVM 0.27.0 → 0.28.0" for a in out["alerts"] if a["runtime"] == "tvm")


def test_an_upgrade_that_dropped_the_tuning_records_is_its_own_finding(tmp_path):
    db = tmp_path / "results.db"
    plant(db, lambda night, device, model: 1.5 if night == NIGHTS and model == "m7" else 1.0,
          tvm=lambda night: "0.28.0" if night == NIGHTS else "0.27.0",
          tuned=lambda night, device, model: 10 if model == "m7" and night < NIGHTS else 0)
    findings = regressions(db)["findings"]
    assert [(f["kind"], f["split"], f["models"]) for f in findings] == [
        ("upgrade", "tuning records dropped", ["m7"])], [f["sentence"] for f in findings]


def test_triage_state_carries_across_nights_and_fail_on_new(tmp_path):
    db = tmp_path / "results.db"
    plant(db, lambda night, device, model: 1.3 if night >= NIGHTS - 1 and (device, model) == SINGLE else 1.0)
    env = {**env_in(tmp_path), "FARM_DB": str(db)}
    first = json.loads(run_farm("--json", "regressions", "--sweep", str(NIGHTS - 1), env=env).stdout)["findings"]
    assert [f["state"] for f in first] == ["new"] and first[0]["first_sweep"] == NIGHTS - 1
    # CI: no confirmed finding (nothing rerun), so --fail-on new passes; new-any fails on the new one
    assert run_farm("regressions", "--fail-on", "new", env=env).returncode == 0
    failing = run_farm("regressions", "--sweep", str(NIGHTS - 1), "--fail-on", "new-any", env=env)
    assert failing.returncode == 1 and "error: 1 new finding(s)" in failing.stderr
    acked = run_farm("--json", "regressions", "--sweep", str(NIGHTS - 1), "--triage", f"{first[0]['finding_id']}:acknowledged",
                     "--by", "ana", env=env)
    assert json.loads(acked.stdout)["findings"][0]["state"] == "acknowledged"
    # the next night the slowdown persists: the same finding, still acknowledged, ongoing
    later = json.loads(run_farm("--json", "regressions", "--sweep", str(NIGHTS), env=env).stdout)["findings"]
    assert [(f["finding_id"], f["state"], f["first_sweep"]) for f in later] == [
        (first[0]["finding_id"], "acknowledged", NIGHTS - 1)]
    assert run_farm("regressions", "--fail-on", "new-any", env=env).returncode == 0
    bad = run_farm("regressions", "--triage", "1:done", env=env)
    assert bad.returncode == 2 and "is not ID:STATE" in bad.stderr
    nobody = run_farm("regressions", "--triage", "1:invalid", env={**env, "FARM_USER": ""})
    assert nobody.returncode == 2 and nobody.stderr.startswith("error: farm regressions: a triage needs its author")
    stray = run_farm("regressions", "--note", "why", "--by", "ana", env=env)
    assert stray.returncode == 2 and "--note, --bug and --duplicate-of go with --triage" in stray.stderr


def test_the_report_shows_tuning_per_night_and_the_night_coverage_dropped(tmp_path):
    """Tuning coverage per night beside TVM's and onnxruntime's times: m0 gets records from night 3 on; the TVM
    upgrade of night 7 finds none for its version, and that night is listed as a coverage drop."""
    db = tmp_path / "r.db"
    plant(db, tvm=lambda night: "0.27.0" if night < 7 else "0.28.0", reference=True,
          tuned=lambda night, device, model: 6 if model == "m0" and device == "dev0" and 3 <= night < 7 else 0)
    html = report(db)
    assert 'id="tuning"' in html and "per-night tuning trajectories" in html
    drops = re.findall(r'<tr class="coverage-drop">(.*?)</tr>', html, re.S)
    cells = [re.sub(r"<[^>]+>", "|", d).replace("\n", "") for d in drops]
    assert len(cells) == 1 and "dev0" in cells[0] and "m0" in cells[0] and "6/10" in cells[0] and "0/0" in cells[0]
    assert "0.27.0 → 0.28.0" in cells[0] and "|7|" in cells[0]


def test_a_change_of_threads_starts_another_tuning_trajectory():
    """Nights 1-4 on 1 thread (tuned, 6/10 tasks), nights 5-6 on 2 threads (no records yet: 0/10): two trajectories,
    each named by its threads, and no coverage drop between them (another series, not a lost record set)."""
    from farm.views.report import tuning_trajectories

    def row(night: int, threads: int, tuned: bool, runtime: str = "tvm") -> dict:
        return {"id": night * 10 + tuned, "sweep_id": night, "device": "dev0", "model": "m0", "runtime": runtime,
                "tuned": tuned, "tvm_version": "0.27.0", "threads": threads, "median": 0.01 / threads,
                "tuned_tasks": 6 if tuned and threads == 1 else 0, "total_tasks": 10 if runtime == "tvm" else 0}

    rows = [row(n, 1 if n <= 4 else 2, tuned) for n in range(1, 7) for tuned in (False, True)]
    rows += [row(n, 1 if n <= 4 else 2, False, "onnxruntime") for n in range(1, 7)]
    cells, drops = tuning_trajectories(rows)
    assert sorted((c["threads"], [p["sweep_id"] for p in c["points"]]) for c in cells) == [
        (1, [1, 2, 3, 4]), (2, [5, 6])]
    assert drops == [] and all(p["reference"] for c in cells for p in c["points"])


def test_no_tuning_no_trajectory_section(tmp_path):
    db = tmp_path / "r.db"
    plant(db)
    html = report(db)
    assert 'id="versus"' in html and 'id="tuning"' not in html  # nothing was ever tuned: no such section


def test_an_upgrade_that_dropped_the_records_is_compared_with_the_tuned_nights_before_it(tmp_path):
    """Untuned nights 1-10 (20× slower), tuned nights 11-30 on TVM 0.27, night 31 on 0.28 compiles with no records:
    the upgrade is paired with the context seen last (the tuned nights), not with the untuned nights of the same
    tuned flag, where it would look unchanged."""
    db = tmp_path / "results.db"
    tuned_nights = range(11, 31)
    plant(db, lambda night, device, model: 20.0 if model == "m7" and night not in tuned_nights else 1.0,
          tvm=lambda night: "0.28.0" if night == 31 else "0.27.0", nights=31,
          tuned=lambda night, device, model: 10 if model == "m7" and night in tuned_nights else 0)
    findings = [f for f in regressions(db)["findings"] if f["metric"] == "steady"]
    assert [(f["kind"], f["cause"], f["split"], f["models"], f["direction"]) for f in findings] == [
        ("upgrade", "TVM 0.27.0 → 0.28.0", "tuning records dropped", ["m7"], "slower")], [f["sentence"] for f in findings]
    assert findings[0]["devices"] == DEVICES and 18 < findings[0]["change"] < 20
    assert "slower" in findings[0]["sentence"] and "(tuning records dropped)" in findings[0]["sentence"]


def test_a_fixed_finding_that_returns_after_a_quiet_night_is_reopened_and_says_so(tmp_path):
    """Night 6 slows one series (triaged: fixed); night 7 is quiet and reviewed; night 8 slows it again: the same
    finding (schema 23: a state carries across a night without it), reopened (new), with the event saying so, and
    --fail-on new-any fails on it."""
    db = tmp_path / "results.db"
    plant(db, lambda night, device, model: 1.3 if night in (NIGHTS - 2, NIGHTS) and (device, model) == SINGLE else 1.0)
    env = {**env_in(tmp_path), "FARM_DB": str(db)}

    def review(sweep: int, *args: str) -> list[dict]:
        return json.loads(run_farm("--json", "regressions", "--sweep", str(sweep), *args, env=env).stdout)["findings"]
    (first,) = review(NIGHTS - 2)
    (fixed,) = review(NIGHTS - 2, "--triage", f"{first['finding_id']}:fixed", "--by", "ana")
    assert fixed["state"] == "fixed"
    assert review(NIGHTS - 1) == []  # quiet, reviewed
    (again,) = review(NIGHTS)
    assert again["key"] == first["key"] and again["finding_id"] == first["finding_id"]
    assert (again["state"], again["first_sweep"]) == ("new", NIGHTS - 2)
    events = json.loads(run_farm("--json", "regressions", "--events", str(first["finding_id"]), env=env).stdout)["events"]
    assert [(e["author"], e["from_state"], e["to_state"], e["sweep_id"]) for e in events] == [
        ("ana", "new", "fixed", NIGHTS - 2), ("farm", "fixed", "new", NIGHTS)]
    assert events[1]["note"] == f"reopened: back on sweep {NIGHTS} after it was marked fixed"
    failing = run_farm("regressions", "--sweep", str(NIGHTS), "--fail-on", "new-any", env=env)
    assert failing.returncode == 1 and "error: 1 new finding(s)" in failing.stderr


def test_fail_on_new_any_passes_a_finding_its_reruns_rejected(tmp_path):
    from farm.analysis.findings import sweep_verdicts
    from farm.analysis.regress import METHOD
    from farm.analysis.results import run_rows

    db = tmp_path / "results.db"
    plant(db, lambda night, device, model: 1.3 if night == NIGHTS and (device, model) == SINGLE else 1.0)
    env = {**env_in(tmp_path), "FARM_DB": str(db)}
    assert run_farm("regressions", "--fail-on", "new-any", env=env).returncode == 1
    with Store(db) as store:  # what a rerun that found no difference stores (confirmation.review_night)
        (verdict,) = [v for v in sweep_verdicts(run_rows(store), NIGHTS) if v.status == "candidate"
                      and (v.device, v.model, v.metric) == (*SINGLE, "steady")]
        store.save_alert(verdict, METHOD.to_json(), "rejected", {"rounds": 8, "verdict": "same", "wilcoxon_p": 0.9})
    assert run_farm("regressions", "--fail-on", "new-any", env=env).returncode == 0
    (finding,) = regressions(db)["findings"]
    assert (finding["state"], finding["confirmed"], finding["rejected"]) == ("new", 0, 1)
    assert finding["confidence"] == "rejected on 1/1 reruns"


def test_a_record_set_shared_by_every_model_changing_is_not_a_tuning_finding(tmp_path):
    """Every model tuned 10/10 on every night; a nightly session kept for another model changes the tuning key's
    record set (every artifact's tuning_digest) on the night a driver slows one device: a device finding, since no
    model's own applied tuning changed."""
    db = tmp_path / "results.db"
    plant(db, lambda night, device, model: 1.15 if night == NIGHTS and device == DRIVER else 1.0,
          tuned=lambda night, device, model: 10, records=lambda night: "B" if night == NIGHTS else "A")
    findings = regressions(db)["findings"]
    assert [(f["kind"], f["devices"], f["k"], f["n"]) for f in findings] == [("device", [DRIVER], 8, 8)], \
        [f["sentence"] for f in findings]


def _alert(verdict, alert_id: int) -> Alert:
    """A verdict as ``Store.alerts`` returns it once stored."""
    return Alert(id=alert_id, created_at="", updated_at="", sweep_id=verdict.sweep_id, device=verdict.device,
                 model=verdict.model, tuned=verdict.tuned, runtime=verdict.runtime, metric=verdict.metric,
                 run_id=verdict.run_id, baseline_run_id=verdict.baseline_run_id, status=verdict.status,
                 value=verdict.value, z=verdict.z, change=verdict.change, baseline=verdict.baseline, method={},
                 confirmation={})


def test_planned_memory_is_compared_across_an_upgrade_to_the_byte():
    """Planned memory is deterministic: an upgrade that adds 100 bytes of parameters (less than a page) is a
    ``changed`` verdict against the old context's last night and an upgrade finding."""
    from dataclasses import replace

    from farm.analysis.findings import find_findings, resolution
    from farm.analysis.regress import detect_upgrades

    runs = [replace(make_run(s, s, 1e-3), params_bytes=1_000_000) for s in range(1, 7)]
    runs.append(replace(make_run(7, 7, 1e-3, tvm="0.28.0"), params_bytes=1_000_100))
    verdicts = detect_upgrades(runs, 7)
    params = {v.metric: v for v in verdicts}["params"]
    assert (params.status, params.value, params.baseline_run_id) == ("changed", 1_000_100, 6)
    assert params.baseline["centre"] == 1_000_000 and params.baseline["context_change"] == "TVM 0.27.0 → 0.28.0"
    assert params.change == pytest.approx(1e-4) and params.z is None
    assert resolution("params") == resolution("planned_activations") == 1 and resolution("peak_rss") == 4096
    (finding,) = find_findings([_alert(params, 1)], verdicts, {r.run_id: r for r in runs})
    assert (finding.kind, finding.metric, finding.direction, finding.k) == ("upgrade", "params", "slower", 1)


def test_the_steady_noise_floor_is_three_raw_mads():
    """``Summary.mad`` is 1.4826 · MAD (a normal SD): the floor is 3 × the MAD itself, as for the other metrics."""
    from dataclasses import replace

    from farm.analysis.findings import noise_floor
    from farm.stats import MAD_TO_SD

    run = make_run(1, 1, 1e-3)
    run = replace(run, steady=replace(run.steady, mad=MAD_TO_SD * 1e-5))  # a raw MAD of 10 µs
    alert = Alert(1, "", "", 1, "phone", "mlp", False, "tvm", "steady", 1, None, "candidate", 1.1e-3, 3.0, 0.1,
                  {"centre": 1e-3, "spread": 1e-6, "n": 5, "values": []}, {}, {})
    assert noise_floor(alert, run) == pytest.approx(3e-5)
    assert noise_floor(replace(alert, metric="load"), run) == pytest.approx(3e-6 / MAD_TO_SD)  # the baseline's


def test_upgrade_evidence_takes_its_baseline_from_the_old_series():
    """An upgrade alert's evidence draws the old context's nights as its baseline (the series of baseline_run_id),
    never the new context's own earlier nights."""
    from farm.analysis.regress import detect_upgrades
    from farm.views.review import baseline_history
    from farm.analysis.series import by_sweep

    runs = [make_run(s, s, 1e-3) for s in range(1, 8)] + [make_run(s, s, 1.2e-3, tvm="0.28.0") for s in (8, 9)]
    (steady,) = [v for v in detect_upgrades(runs, 9) if v.metric == "steady"]
    assert steady.baseline["n"] == 7 and steady.baseline_run_id == 7 and steady.baseline["new_nights"] == 2
    history = baseline_history(runs, _alert(steady, 1), by_sweep(runs, keep_unstable_of=9))
    assert [run_id for _, _, run_id in history] == [1, 2, 3, 4, 5, 6, 7]
    assert {value for _, value, _ in history} == {1e-3}


def _bench():
    """tools/bench_findings.py: the planted nights' generator and its measures (#32)."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parent.parent / "tools" / "bench_findings.py"
    spec = importlib.util.spec_from_file_location("bench_findings", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_findings"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


SMALL_NIGHTS = 16


@pytest.fixture(scope="module")
def planted_history(tmp_path_factory):
    """15 quiet nights of a 10-device × 12-model lab (bench_findings' lab: kinds, SoC tags, ops, int8 variants)."""
    bench = _bench()
    base = tmp_path_factory.mktemp("planted") / "history.db"
    lab = bench.make_lab(10, 12, np.random.default_rng(11))
    rng = np.random.default_rng(11)
    with Store(base) as store:
        for night in range(1, SMALL_NIGHTS):
            bench.record_night(store, lab, night, rng, 0.01, 10)
    return bench, lab, base


@pytest.mark.parametrize("shape", ["whole-models", "whole-devices", "block", "scatter-20", "scatter-50", "scatter-80",
                                   "upgrade", "two-causes", "aa"])
def test_findings_explain_each_planted_shape_simply(planted_history, tmp_path, shape):
    """#32's goals on a small matrix, each shape once at 10 %: each planted cause is at most 2 findings, the top 3
    findings hold ≥ 90 % of the planted alerts, a scatter is one finding naming itself, a block is named by the
    traits its devices and models share, and nothing planted gives no confirmed finding (confirmation simulated as
    bench_findings does: a rerun confirms a planted series and rejects any other)."""
    from farm.night.confirmation import review_night

    bench, lab, base = planted_history
    db = tmp_path / "results.db"
    db.write_bytes(base.read_bytes())
    rng = np.random.default_rng([11, bench.SHAPES.index(shape)])
    planted = bench.plant(shape, lab, 0.10, rng)

    def review() -> dict:
        with Store(db) as store:
            found = review_night(store, None)
            return {"alerts": [dict(a) for a in found.alerts], "findings": [dict(f) for f in found.findings]}
    with Store(db) as store:
        bench.record_night(store, lab, SMALL_NIGHTS, rng, 0.01, 10, planted)
    out = review()
    measures = bench.measure(planted, out)
    sentences = [f["sentence"] for f in out["findings"]]
    assert measures["per_cause"] <= 2, sentences
    assert measures["top3"] is None or measures["top3"] >= 0.9, (measures, sentences)
    assert len(out["findings"]) <= 5, sentences  # a screen of findings
    if shape.startswith("scatter"):
        (scatter,) = [f for f in out["findings"] if f["kind"] == "scatter"]
        assert re.match(r"\d+ % of all series \(\d+/120\), across \d+/10 devices and \d+/12 models, are ",
                        scatter["sentence"]), scatter["sentence"]
        assert "no device or model explains it (p = " in scatter["sentence"]
    if shape == "block":
        assert sentences[0].startswith("models with DepthwiseConv (3/12) are ") and \
            "on devices tagged soc:sd888 (2/10)" in sentences[0], sentences
    if shape == "upgrade":
        assert out["findings"][0]["kind"] == "upgrade" and sentences[0].startswith("models with DepthwiseConv"), sentences
    bench.confirm(db, planted, out)
    confirmed = [f for f in review()["findings"] if f["confirmed"]]
    if shape == "aa":
        assert confirmed == [], sentences


def test_a_series_stands_alone_past_its_own_nights_prediction_bound():
    """The single-series rule (``group._alone``): literal nights in, exact verdicts out. Tight nights but for four
    wild ones: the MAD (floored at 0.5 %) calls a 4.5 % night z = 9, past the old bound (Student's t, 19 df, at
    Bonferroni's 0.05 over 1,000 series: 4.90); the SD sees the wild nights (t = 4.73 < 5.63 at 0.01): no
    finding alone; 10 % is. A regression already in the baseline (its first night, 30 %) is left out of the SD, so
    the second night still stands alone."""
    from farm.analysis.findings.group import _alone, prediction_t
    from farm.analysis.regress import judge

    nights = [1.0 + d / 1000 for d in (1, -1, 2, -2, 0, 1, -1, 2, -2, 0, 2, -2, 1, -1, 20, -20, 20, -20, 0, 1)]

    def alert(value: float, history: list[float]) -> Alert:
        verdict = judge(value, history)
        assert verdict.baseline is not None and verdict.z is not None
        baseline = {"n": verdict.baseline.n, "centre": verdict.baseline.centre, "spread": verdict.baseline.spread,
                    "values": verdict.baseline.values}
        return Alert(1, "", "", 2, "dev0", "m0", False, "tvm", "steady", 1, None, verdict.status, value, verdict.z,
                     verdict.change, baseline, {}, {})
    small, step = alert(1.045, nights), alert(1.10, nights)
    assert small.z == pytest.approx(9.0) and prediction_t(small)[0] == pytest.approx(4.735, abs=1e-3)
    assert not _alone(small, 1000, {}) and _alone(step, 1000, {})
    persisting = alert(1.30, nights[1:] + [1.30])
    assert prediction_t(persisting)[1] == 19 and _alone(persisting, 1000, {})


def test_a_finding_names_the_kernel_its_change_is_in(tmp_path):
    """A series whose runs were profiled (tonight's and its baseline's): its finding says which kernel moved, with
    its share of the change, in `farm regressions` (its sentence and --json); a finding of unprofiled runs names none."""
    from farm.records import KernelProfile, KernelTime

    def profile(night, device, model, level, value):
        if (device, model) != SINGLE:
            return None
        extra = value - level  # tonight's step, all in one kernel; the others as on every night
        return KernelProfile("ok", "", "wall", 10, value + 2e-5, (
            KernelTime("fused_conv2d_add_relu", "conv", 1.0, 0.6 * level),
            KernelTime("fused_conv2d1_add", "conv", 1.0, 0.3 * level + extra),
            KernelTime("softmax", "reduction", 1.0, 0.1 * level)))

    db = tmp_path / "results.db"
    plant(db, lambda night, device, model: 1.20 if night == NIGHTS and (device, model) in (SINGLE, ("dev2", "m2"))
          else 1.0, profile=profile)
    findings = {tuple(f["models"]): f for f in regressions(db)["findings"]}
    single, other = findings[(SINGLE[1],)], findings[("m2",)]
    # the step is all in that kernel: 100 % of main's change (the other kernels as on the baseline's night)
    assert re.fullmatch(r"m6 on dev1: 100% of the \+[\d.]+ ms is fused_conv2d1_add \([\d.]+ ms → [\d.]+ ms\)",
                        single["kernels"]), single["kernels"]
    assert single["sentence"].endswith(f"; kernels: {single['kernels']}")
    assert other["kernels"] == "" and "kernels:" not in other["sentence"]


def test_the_screen_s_second_tier_is_rerun_and_stored_only_when_confirmed(tmp_path):
    """Nights with 3 % night-to-night noise: series at 1 <= z < 2 are "screened" (regress.Method.rescreen), never
    alerts; confirmation reruns them after the findings' representatives, with the candidates no finding holds, while
    its budget lasts, and stores one only when its reruns confirm it. Here no device answers (an empty inventory):
    every rerun says "unknown" (or "drift": the same library as the baseline), so the candidates keep their alert
    with that word and no screened series is stored."""
    from farm.night.confirmation import review_night
    from farm.analysis.findings import sweep_verdicts
    from farm.analysis.results import run_rows

    db = tmp_path / "results.db"
    plant(db, night_noise=0.03, seed=5)
    with Store(db) as store:
        verdicts = [v for v in sweep_verdicts(run_rows(store), NIGHTS) if v.metric == "steady"]
        screened = [v for v in verdicts if v.status == "screened"]
        alerted = [v for v in verdicts if v.status in ("candidate", "improved")]
        assert screened and all(1.0 <= v.z < 2.0 and v.change >= 0.02 for v in screened)
        out = review_night(store, NIGHTS, confirm_candidates=True, tracker=None, devices={})
    steady = [a for a in out.alerts if a.metric == "steady"]
    assert {(a.device, a.model) for a in steady} == {(v.device, v.model) for v in alerted}  # no screened one
    assert {a.status for a in steady} <= {"unknown", "drift", "improved"} and "screened" not in {a.status for a in out.alerts}
    reruns = sum(1 for a in steady if "rounds" in a.confirmation or a.confirmation.get("reason"))
    assert out.budget["rerun"] == len(screened) + reruns  # every screened series was rerun, and each candidate once


def _manifest(night, device, model, ota=(), commit_night=NIGHTS, records=(), model_change=()):
    """A run's manifest on a planted night: an OTA update of ``ota`` devices, farm's commit moving on
    ``commit_night`` everywhere, new records for ``records`` models, a new model file for ``model_change``."""
    last = night == NIGHTS
    return {"farm.version": "0.1.0", "farm.commit": "c2" if night >= commit_night else "c1",
            "tvm.version": "0.27.0", "tvm.build": "b1",
            "model.digest": f"{model}-{'v2' if last and model in model_change else 'v1'}",
            "records.digest": f"r-{model}-{'2' if last and model in records else '1'}",
            "device.os_build": f"{device}/RQ3A" if last and device in ota else f"{device}/QP1A",
            "device.kernel": "5.4"}


def test_a_finding_names_the_ota_update_it_started_with_before_a_commit_that_moved_everywhere(tmp_path):
    """An OTA update on two devices that slowed them, and farm's commit moving on every device the same night: the
    finding names the OS build first (it changed on every moved series and on no unmoved one), the commit as another
    candidate, and says TVM, model and records did not change."""
    db = tmp_path / "results.db"
    ota = ("dev2", "dev3")
    plant(db, lambda night, device, model: 1.15 if night == NIGHTS and device in ota else 1.0,
          same_artifact=lambda d, m: True, manifest=lambda n, d, m: _manifest(n, d, m, ota=ota))
    (finding,) = [f for f in regressions(db)["findings"] if f["direction"] == "slower"]
    assert finding["devices"] == list(ota)
    cause = finding["cause"]
    assert cause.startswith(f"started with sweep {NIGHTS}: OS build dev2/QP1A → dev2/RQ3A, dev3/QP1A → dev3/RQ3A "
                            "(16/16 moved, 0/")
    assert "other candidates: farm commit c1 → c2 (16/16 moved, 32/32 unmoved series)" in cause
    assert cause.endswith("; TVM, model and records unchanged"), cause
    assert "OS build" in finding["sentence"]
    # farm drift and the report's history mark the night each series' manifest changed, in words
    out = run_farm("--json", "drift", "--all", "--device", "dev2", env={**env_in(db.parent), "FARM_DB": str(db)})
    assert out.returncode == 0, out.stderr
    marks = [c for s in json.loads(out.stdout)["series"] for c in s["manifest_changes"]]
    assert len(marks) == len(MODELS) and {c["sweep"] for c in marks} == {NIGHTS}
    assert all(c["changed"] == ["farm commit c1 → c2", "OS build dev2/QP1A → dev2/RQ3A"] for c in marks), marks
    html = report(db)
    assert re.search(f"Manifest changed \\(dotted lines\\): sweep {NIGHTS}: farm commit c1 → c2, OS build dev[23]/QP1A → "
                     "dev[23]/RQ3A", html)
    assert "farm commit c2 · TVM 0.27.0 · TVM build b1 · tuning records r-m0-1 · model m0-v1 · OS build dev2/RQ3A" in html


def test_a_records_change_and_a_model_change_are_each_named_and_a_commit_that_slowed_nothing_is_no_finding(tmp_path):
    """New records for m1 slowed it everywhere; m2's model file changed and slowed it by as much; farm's commit moved a
    night earlier and slowed nothing. The night's one finding (two models on every device) names both causes, each
    on its own series, and the commit nowhere; the commit's night has no finding."""
    from farm.records import KernelProfile, KernelTime

    def profile(night, device, model, level, value):  # m1's runs on dev1 profiled: its step all in one kernel
        if (device, model) != ("dev1", "m1"):
            return None
        return KernelProfile("ok", "", "wall", 10, value + 2e-5, (
            KernelTime("fused_conv2d_add_relu", "conv", 1.0, 0.3 * level),
            KernelTime("fused_conv2d1_add", "conv", 1.0, 0.2 * level + value - level),
            KernelTime("softmax", "reduction", 1.0, 0.1 * level), KernelTime("add", "elementwise", 1.0, 0.2 * level),
            KernelTime("relu", "elementwise", 1.0, 0.1 * level), KernelTime("mean", "reduction", 1.0, 0.1 * level)))

    db = tmp_path / "results.db"
    plant(db, lambda night, device, model: (1.2 if model in ("m1", "m2") else 1.0) if night == NIGHTS else 1.0,
          manifest=lambda n, d, m: _manifest(n, d, m, commit_night=NIGHTS - 1, records=("m1",), model_change=("m2",)),
          profile=profile)
    (finding,) = [f for f in regressions(db)["findings"] if f["direction"] == "slower"]
    assert finding["models"] == ["m1", "m2"]
    # the records' change slowed one kernel, which the profiles of the night name
    assert re.fullmatch(r"m1 on dev1: 100% of the \+[\d.]+ (ms|µs) is fused_conv2d1_add \([\d.]+ (ms|µs) → [\d.]+ (ms|µs)\)",
                        finding["kernels"]), finding["kernels"]
    assert finding["cause"] == (f"started with sweep {NIGHTS}: model m2-v1 → m2-v2 (6/12 moved, 0/36 unmoved series); "
                                "tuning records r-m1-1 → r-m1-2 (6/12 moved, 0/36 unmoved series); TVM unchanged")
    assert "farm commit" not in json.dumps(finding)
    night_before = regressions(db, "--sweep", str(NIGHTS - 1))
    assert [f for f in night_before["findings"] if f["direction"] == "slower"] == []
