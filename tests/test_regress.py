"""Regression detection: literal numbers in, exact verdicts out; then a real slowdown, end to end."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.analysis.regress import Method, Thresholds, baseline_of, compare_rounds, compare_samples, confirm, judge, series_value
from tests.conftest import farm_workspace, make_run, run_farm
from tests.test_report import needs_chromium, open_in_chromium

HISTORY = [1.00, 1.02, 0.98, 1.01, 0.99, 1.00, 1.03, 0.97]


def test_baseline_is_median_and_scaled_mad_with_floor():
    base = baseline_of(HISTORY)
    assert base.n == 8 and base.centre == 1.0
    assert base.spread == pytest.approx(1.4826 * 0.015)
    flat = baseline_of([2.0] * 6)
    assert flat.spread == pytest.approx(0.01)  # 0.5 % floor of the centre
    assert baseline_of([1.0] * 4) is None  # fewer than 5 nights


def test_judge_verdicts():
    assert judge(1.10, HISTORY).status == "candidate"
    assert judge(1.01, HISTORY).status == "ok"
    assert judge(0.90, HISTORY).status == "improved"
    assert judge(1.10, HISTORY[:3]).status == "no-baseline"
    assert judge(1.10, HISTORY, unstable=True).status == "unstable"
    # load times need a larger change than steady latency
    assert judge(1.045, HISTORY, "steady").status == "candidate"  # z 2.0, +4.5 %
    # +3.5 % but z 1.6: no alert (the screen is z ≥ 2), but rerun by confirmation: the second tier (z ≥ 1)
    assert judge(1.035, HISTORY, "steady").status == "screened"
    assert judge(1.015, HISTORY, "steady").status == "ok"  # z 0.7: under both
    assert judge(1.035, HISTORY, "load").status == "ok"  # the second tier is steady's alone
    assert judge(1.045, HISTORY, "load").status == "ok"
    strict = Method(thresholds={"steady": Thresholds(5.0, 0.2)}, rescreen={})
    assert judge(1.10, HISTORY, method=strict).status == "ok"


def test_compare_samples_of_two_runs():
    old = [1.00, 1.01, 0.99, 1.02, 0.98, 1.00, 1.01, 0.99, 1.00, 1.01]
    assert compare_samples(old, [v * 1.2 for v in old]).verdict == "slower"
    assert compare_samples(old, old).verdict == "same"


def test_confirmation_tests_rounds_not_samples():
    old = [1.00, 1.01, 0.99, 1.02, 0.98, 1.00, 1.01, 0.99]  # one figure per round, each round a fresh load
    slower = [v * 1.2 for v in old]
    status, comparison = confirm(lambda n: (old[:n], slower[:n]))
    assert status == "confirmed" and comparison.rounds == 8 and comparison.wilcoxon_p == 2 / 2**8
    assert abs(comparison.change - 0.2) < 1e-9
    assert confirm(lambda n: (slower[:n], old[:n]))[0] == "improved"
    assert confirm(lambda n: (old[:n], list(old[:n])))[0] == "rejected"
    # 7 of 8 rounds slower is not enough at p < 0.01: inconclusive, 8 more rounds, then "unknown"
    ratios = iter([1.05, 0.99, 1.06, 1.02, 1.04, 1.01, 1.05, 1.03,  # the first 8 rounds: 7 slower
                   0.97, 1.02, 0.98, 1.01, 0.99, 1.00, 0.97, 1.02])  # 8 more: no direction
    calls = []

    def inconclusive(n):
        calls.append(n)
        return [1.0] * n, [next(ratios) for _ in range(n)]
    status, comparison = confirm(inconclusive)
    assert calls == [8, 8] and comparison.rounds == 16 and status == "unknown", comparison
    with pytest.raises(ValueError):
        compare_rounds([1.0] * 3, [1.1] * 3)  # three rounds can never reach p < 0.01


def test_interleaved_rounds_load_both_artifacts_afresh_each_round(farm_net, tmp_path):
    from farm.compile import compile_model
    from farm.inventory import parse_inventory
    from farm.measure import interleaved_rounds
    from farm.models import load_model, make_inputs
    from farm.records import BenchConfig

    inv = parse_inventory(farm_net.inventory_text())
    device, model = inv.devices["cpu-a"], load_model("mlp")
    artifact = compile_model(model, device, tmp_path / "cache")
    old, new = interleaved_rounds(inv.tracker, device, artifact, artifact, make_inputs(model), 3,
                                  BenchConfig(min_repeat_ms=5, timeout_s=20), repeats=3)
    assert len(old) == len(new) == 3 and min(old + new) > 0


def _mlp(hidden: int, layers: int) -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    inits, nodes, prev, width = [], [], "x", 64
    for i in range(layers):
        inits += [numpy_helper.from_array((rng.standard_normal((width, hidden)) * 0.05).astype("float32"), f"w{i}")]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]), helper.make_node("Relu", [f"h{i}"], [f"r{i}"])]
        prev, width = f"r{i}", hidden
    inits.append(numpy_helper.from_array((rng.standard_normal((width, 10)) * 0.05).astype("float32"), "wo"))
    nodes.append(helper.make_node("MatMul", [prev, "wo"], ["y"]))
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def slowdown(farm_net, tmp_path_factory):
    """Stable nights of a model file, then a night of a slower model under its name, confirmed on the device:
    (the slow night's `farm sweep --json`, `farm regressions --json`, its steady alerts, the stored TVM runs)."""
    tmp_path = tmp_path_factory.mktemp("slowdown")
    inventory_file, farm_env = farm_workspace(farm_net, tmp_path)
    net = tmp_path / "net.onnx"
    onnx.save(_mlp(512, 3), net)
    # TVM's figures only (--tvm-only): onnxruntime's beside them took a second a night and 5 s of the slow one
    sweep = ["--devices", str(inventory_file), "sweep", "--device", "cpu-a", "--model", str(net), "--reference", "none",
             "--tvm-only", "--repeat", "10", "--min-repeat-ms", "100", "--json", "--report-dir", str(tmp_path / "reports"),
             "--profile"]  # every night profiled: the confirmation profiles its rerun too, and names the kernels
    stable = 0
    # nights until 6 are stable (5 make a baseline): a busy CI machine makes some unstable (one CI run needed 12).
    # A figure of 100 ms of calls averages more of the machine's noise away than one of 50 ms
    for _ in range(24):
        night = run_farm(*sweep, "--no-report", env=farm_env)  # the slow night's report is the one under test
        assert night.returncode == 0, night.stderr
        stable += sum(1 for c in json.loads(night.stdout)["cells"] if c["status"] == "ok" and not c["unstable"])
        if stable >= 6:
            break
    assert stable >= 6, "fewer than 6 stable nights in 24: the machine is too noisy for a baseline"
    # the model file changes under the same name: 4 layers of 1024 instead of 3 of 512 — a real, slower artifact
    onnx.save(_mlp(1024, 4), net)
    # one call of 4 × 2048 took ~70 ms: 10 single-call repeats put its CV near the 10 % unstable line on a loaded
    # machine; 20 repeats of 3 calls each measured it steadily. 4 × 1024 (~17 ms) is 12 calls a repeat, and its
    # confirmation uploads 13 MB a round instead of 50. An unstable night is never judged (no steady alert, and it
    # joins no baseline), so a slow night a busy CI machine made unstable is run again, up to 6 times
    for _ in range(6):
        slow = run_farm(*sweep, "--repeat", "20", "--min-repeat-ms", "200", "--confirm", env=farm_env)
        assert slow.returncode == 0, slow.stderr
        out = json.loads(slow.stdout)
        steady = [a for a in out["alerts"] if a["metric"] == "steady" and a["runtime"] == "tvm"]
        rows = [r for r in json.loads(run_farm("results", "--json", env=farm_env).stdout) if r["runtime"] == "tvm"]
        tonight = [r for r in rows if r["sweep_id"] == out["sweep_id"]]
        if steady or not all(r["unstable"] for r in tonight):
            break  # judged: whatever its verdict, the tests below say whether it is the right one
    # the stable nights counted from each night's `farm sweep --json` are the ones stored stable
    assert sum(1 for r in rows if r["sweep_id"] < out["sweep_id"] and r["status"] == "ok" and not r["unstable"]) \
        == stable
    stored = json.loads(run_farm("--devices", str(inventory_file), "regressions", "--json", env=farm_env).stdout)
    return out, stored, steady, rows


@pytest.mark.quiet  # its baseline needs stable nights: tools/test.sh runs it alone
def test_injected_slowdown_is_a_confirmed_regression_in_the_report(slowdown):
    out, stored, steady, rows = slowdown
    assert steady and steady[0]["status"] == "confirmed" and steady[0]["change"] > 0.5, (
        stored["alerts"], [(r["sweep_id"], r["steady_median_s"], r["steady_cv"], r["unstable"]) for r in rows])
    alert = next(a for a in stored["alerts"] if a["metric"] == "steady" and a["runtime"] == "tvm")
    assert alert["confirmation"]["wilcoxon_p"] < 0.01 and alert["confirmation"]["rounds"] >= 8
    assert alert["baseline"]["n"] >= 5 and alert["method"]["baseline_n"] == 20
    # the baseline was profiled, so the confirmation profiled both artifacts again: 3 layers of 512 became 4 of
    # 1024, and the hidden layers' matmul (one kernel, called for each) carries most of the change (97 % here);
    # the finding names it
    kernels = alert["confirmation"]["kernels"]
    assert kernels["status"] == "ok" and kernels["by"] == "kernel" and kernels["change_s"] > 0, kernels
    assert kernels["moves"][0]["op_class"] == "matmul/dense" and kernels["moves"][0]["share"] > 0.8, kernels
    finding = next(f for f in stored["findings"] if f["metric"] == "steady")
    assert finding["kernels"].endswith("(rerun)") and "of the +" in finding["kernels"], finding["kernels"]
    html = Path(out["report"]).read_text()
    # one trend and one distribution per steady alert: TVM's, and onnxruntime's when the bigger model moved it too
    steady_alerts = [a for a in stored["alerts"] if a["metric"] == "steady"]
    assert 1 <= len(steady_alerts) <= 2 and {a["runtime"] for a in steady_alerts} <= {"tvm", "onnxruntime"}
    assert html.count('alt="trend of steady') == len(steady_alerts)
    assert html.count('alt="distribution of baseline and current steady') == len(steady_alerts)
    assert 'alt="heatmap of steady latency change' in html


@pytest.mark.quiet
@needs_chromium
def test_the_regressions_report_shows_its_review_in_chromium(slowdown):
    out, *_ = slowdown
    text, errors, images = open_in_chromium(Path(out["report"]))
    assert errors == []
    assert f"Regressions in sweep {out['sweep_id']}" in text and "confirmed" in text
    assert "1 confirmed regression(s)" in text  # the summary counts it
    # the review's sections, each with its figure: per-alert trend and distribution, heatmap, drift view
    for section in ("Evidence per alert", "Change across models × devices", "Data quality", "Slow drift", "Method"):
        assert section in text, section
    assert images and all(width > 0 for width in images)


def _night(sweep_id: int, value: float, tvm: str = "0.27.0", target: dict | None = None):
    return make_run(sweep_id, sweep_id, value, tvm=tvm, target=target)


def test_a_baseline_never_spans_a_tvm_upgrade_or_a_target_change():
    from farm.analysis.regress import detect

    history = [_night(s, v) for s, v in enumerate([1.00, 1.01, 0.99, 1.00, 1.02, 1.00], start=1)]
    slower = _night(7, 1.30)
    steady = {v["metric"]: v for v in detect([*history, slower], 7)}["steady"]
    assert steady["status"] == "candidate" and steady["baseline"]["n"] == 6  # same context: compared
    upgraded = _night(7, 1.30, tvm="0.28.0")
    steady = {v["metric"]: v for v in detect([*history, upgraded], 7)}["steady"]
    assert steady["status"] == "no-baseline" and steady["baseline_run_id"] is None  # a new TVM: a new series
    retargeted = _night(7, 1.30, target={"kind": "llvm", "mcpu": "skylake"})
    steady = {v["metric"]: v for v in detect([*history, retargeted], 7)}["steady"]
    assert steady["status"] == "no-baseline"
    # after an upgrade, the new series builds its own baseline from the upgraded nights only
    after = [_night(s, 1.30, tvm="0.28.0") for s in range(7, 13)] + [_night(13, 1.31, tvm="0.28.0")]
    steady = {v["metric"]: v for v in detect([*history, *after], 13)}["steady"]
    assert steady["status"] == "ok" and steady["baseline"]["n"] == 6 and steady["baseline"]["centre"] == 1.30


def test_detect_judges_the_run_by_sweep_picks():
    """The judged run of each series is ``series.by_sweep``'s for the sweep (its last ok run, unstable too: judged
    "unstable", never dropped), the history the earlier sweeps' last ok, stable runs; checked against the rule
    written out by brute force on literal-seed histories with failed, unstable and retried cells."""
    from farm.analysis.regress import METRICS, detect
    from farm.analysis.series import by_sweep

    rng = np.random.default_rng(11)
    runs = []
    for sweep in range(1, 13):
        for device in ("phone", "board"):
            for _ in range(int(rng.integers(1, 4))):  # attempts of the cell, in run order
                status = "failed" if rng.random() < 0.2 else "ok"
                runs.append(make_run(len(runs) + 1, sweep, float(rng.lognormal(0, 0.05)), status,
                                     unstable=bool(rng.random() < 0.25), device=device))
    runs.append(make_run(len(runs) + 1, 12, 1.3, "ok", unstable=True, device="phone"))  # a last attempt, unstable
    rng.shuffle(runs)  # detect takes runs in any order
    for sweep in (6, 9, 12):
        verdicts = detect(runs, sweep)
        assert verdicts == detect(runs, sweep, accepted=by_sweep(runs, keep_unstable_of=sweep))
        for device in ("phone", "board"):
            mine = sorted((r for r in runs if r.device == device), key=lambda r: r.run_id)
            of_sweep = [r for r in mine if r.sweep_id == sweep and r.status == "ok"]
            judged = {v.metric: v for v in verdicts if v.device == device}
            if not of_sweep:
                assert judged == {}
                continue
            now = of_sweep[-1]
            history = {}
            for r in mine:
                if r.sweep_id < sweep and r.status == "ok" and not r.unstable:
                    history[r.sweep_id] = r  # the last one of its sweep wins
            earlier = [history[s] for s in sorted(history)]
            assert set(judged) == {m for m in METRICS if series_value(m, now) is not None}
            for metric, v in judged.items():
                assert v.run_id == now.run_id and v.value == series_value(metric, now)
                assert v.baseline_run_id == (earlier[-1].run_id if earlier else None)
                expected = judge(series_value(metric, now), [series_value(metric, r) for r in earlier], metric,
                                 unstable=now.unstable and metric == "steady")
                assert (v.status, v.z, v.change) == (expected.status, expected.z, expected.change)
    statuses = {v.status for s in (6, 9, 12) for v in detect(runs, s)}
    assert "unstable" in statuses and "ok" in statuses  # the generated histories exercise both


def test_an_upgrade_is_compared_with_the_old_contexts_last_nights_until_it_has_a_baseline():
    """The upgrade rule (series.context_changes): the new TVM's nights, median of those so far, judged against the old
    context's last accepted nights with judge's rule, for the nights the new context has no baseline of its own."""
    from farm.analysis.regress import detect, detect_upgrades

    history = [_night(s, v) for s, v in enumerate([1.00, 1.01, 0.99, 1.00, 1.02, 1.00], start=1)]
    upgraded = [_night(s, 1.10, tvm="0.28.0") for s in range(7, 13)]
    first = {v.metric: v for v in detect_upgrades([*history, upgraded[0]], 7)}["steady"]
    assert (first.status, first.baseline["context_change"], first.baseline_run_id) == ("candidate", "TVM 0.27.0 → 0.28.0", 6)
    assert first.change == pytest.approx(0.10) and first.baseline["n"] == 6 and first.baseline["new_nights"] == 1
    assert {v.metric: v for v in detect([*history, upgraded[0]], 7)}["steady"].status == "no-baseline"  # still restarts
    fifth = {v.metric: v for v in detect_upgrades([*history, *upgraded[:5]], 11)}["steady"]
    assert fifth.baseline["new_nights"] == 5 and fifth.value == 1.10
    assert detect_upgrades([*history, *upgraded], 12) == []  # 5 nights before it: the new TVM's own baseline judges
    assert detect_upgrades([*history, _night(7, 1.10)], 7) == []  # no context change, nothing to compare
