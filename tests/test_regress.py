"""Regression detection: literal numbers in, exact verdicts out; then a real slowdown, end to end."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.regress import Method, Thresholds, baseline_of, compare_samples, confirm, judge
from tests.conftest import make_run, run_farm
from tests.test_report import CHROMIUM, open_in_chromium

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
    assert judge(1.04, HISTORY, "steady").status == "candidate"
    assert judge(1.04, HISTORY, "load").status == "ok"
    strict = Method(thresholds={"steady": Thresholds(5.0, 0.2)})
    assert judge(1.10, HISTORY, method=strict).status == "ok"


def test_compare_and_confirm():
    old = [1.00, 1.01, 0.99, 1.02, 0.98, 1.00, 1.01, 0.99, 1.00, 1.01]
    slower = [v * 1.2 for v in old]
    assert compare_samples(old, slower).verdict == "slower"
    assert compare_samples(old, old).verdict == "same"
    assert confirm(lambda n: (old, slower))[0] == "confirmed"
    assert confirm(lambda n: (slower, old))[0] == "improved"
    assert confirm(lambda n: (old, list(old)))[0] == "rejected"
    calls = []
    mixed_new = [1.00, 1.05, 0.99, 1.06, 0.98, 1.04, 1.01, 1.05, 1.00, 1.06]

    def inconclusive(n):
        calls.append(n)
        return old, mixed_new
    status, comparison = confirm(inconclusive)
    assert comparison.verdict == "inconclusive" and status == "unknown" and calls == [20, 60]


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


@pytest.mark.quiet  # its baseline needs stable nights: tools/test.sh runs it alone
def test_injected_slowdown_is_a_confirmed_regression_in_the_report(farm_net, inventory_file, farm_env, tmp_path):
    net = tmp_path / "net.onnx"
    onnx.save(_mlp(512, 3), net)
    sweep = ["--devices", str(inventory_file), "sweep", "--device", "cpu-a", "--model", str(net), "--reference", "none",
             "--repeat", "10", "--min-repeat-ms", "50", "--json", "--report-dir", str(tmp_path / "reports")]
    stable = 0
    for _ in range(16):  # nights until 6 are stable (5 make a baseline): a busy CI machine makes some unstable
        night = run_farm(*sweep, env=farm_env)
        assert night.returncode == 0, night.stderr
        stable = sum(1 for r in json.loads(run_farm("results", "--json", env=farm_env).stdout)
                     if r["status"] == "ok" and not r["unstable"])
        if stable >= 6:
            break
    assert stable >= 6, "fewer than 6 stable nights in 16: the machine is too noisy for a baseline"
    # the model file changes under the same name: 4 layers of 2048 instead of 3 of 512 — a real, slower artifact
    onnx.save(_mlp(2048, 4), net)
    # one call of the slow model takes ~70 ms: 10 single-call repeats put its CV near the 10 % unstable line on a
    # loaded machine (an unstable night is never judged); 20 repeats of 3 calls each measure it steadily
    slow = run_farm(*sweep, "--repeat", "20", "--min-repeat-ms", "200", "--confirm", env=farm_env)
    assert slow.returncode == 0, slow.stderr
    out = json.loads(slow.stdout)
    steady = [a for a in out["alerts"] if a["metric"] == "steady"]
    stored = json.loads(run_farm("--devices", str(inventory_file), "regressions", "--json", env=farm_env).stdout)
    rows = json.loads(run_farm("results", "--json", env=farm_env).stdout)
    assert steady and steady[0]["status"] == "confirmed" and steady[0]["change"] > 0.5, (
        stored["alerts"], [(r["sweep_id"], r["steady_median_s"], r["steady_cv"], r["unstable"]) for r in rows])
    alert = next(a for a in stored["alerts"] if a["metric"] == "steady")
    assert alert["confirmation"]["mann_whitney_p"] < 0.01 and alert["confirmation"]["ks_p"] < 0.01
    assert alert["baseline"]["n"] >= 5 and alert["method"]["baseline_n"] == 20
    from pathlib import Path

    if CHROMIUM:
        text, errors, images = open_in_chromium(Path(out["report"]))
        assert errors == []
        assert f"Regressions in sweep {out['sweep_id']}" in text and "confirmed" in text
        assert "1 confirmed regression(s)" in text  # the summary counts it
        # the review's sections, each with its figure: per-alert trend and distribution, heatmap, drift view
        for section in ("Evidence per alert", "Change across models × devices", "Data quality", "Slow drift", "Method"):
            assert section in text, section
        assert images and all(width > 0 for width in images)
    html = Path(out["report"]).read_text()
    assert html.count('alt="trend of steady') == 1 and html.count('alt="distribution of baseline and current steady') == 1
    assert 'alt="heatmap of steady latency change' in html


def _night(sweep_id: int, value: float, tvm: str = "0.27.0", target: dict | None = None):
    return make_run(sweep_id, sweep_id, value, tvm=tvm, target=target)


def test_a_baseline_never_spans_a_tvm_upgrade_or_a_target_change():
    from farm.regress import detect

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
