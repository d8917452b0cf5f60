"""Memory per run (#21): planned memory from the built module, the session process's RSS over RPC, shown and judged.

Real TVM builds, farm's real RPC server (and a stock TVM one) on 127.0.0.1, real SQLite."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conftest import make_run, run_farm, stock_remote_device
from farm.compile import compile_model
from farm.measure import MEMORY_MEASURED, MEMORY_UNMEASURED, bench_artifact
from farm.models import BUILTINS, load_model, make_inputs
from farm.records import BenchConfig, Device
from farm.analysis.regress import detect
from farm.analysis.results import run_rows
from farm.stats import memory_text
from farm.store import Store

CONFIG = BenchConfig(repeat=3, min_repeat_ms=5, timeout_s=60)


def _weights_bytes(proto: onnx.ModelProto) -> int:
    return sum(numpy_helper.to_array(t).nbytes for t in proto.graph.initializer)


def test_planned_params_are_exactly_the_builtin_models_weights(tmp_path):
    cpu = Device("cpu", "local", "k", {"kind": "llvm"})
    for name in ("mlp", "convnet"):
        artifact = compile_model(load_model(name), cpu, tmp_path)
        assert artifact.params_bytes == _weights_bytes(BUILTINS[name]())  # mlp: 9,610 float32 = 38,440 bytes
        assert artifact.planned_host_bytes and artifact.planned_device_bytes == 0 and artifact.planned_dynamic == 0
    assert compile_model(load_model("mlp"), cpu, tmp_path).params_bytes == 38_440
    # mlp's plan: two 512-byte storages reused for the 1×128 activations, 40 bytes for the 1×10 output
    assert compile_model(load_model("mlp"), cpu, tmp_path).planned_host_bytes == 512 + 512 + 40
    # a GPU target: the planned activations live in device memory (compiling needs no GPU)
    gpu = Device("gpu", "opencl", "k", {"kind": "opencl"})
    opencl = compile_model(load_model("convnet"), gpu, tmp_path)
    assert opencl.params_bytes == _weights_bytes(BUILTINS["convnet"]())
    assert opencl.planned_device_bytes and opencl.planned_host_bytes == 0


def test_cached_artifact_metadata_without_planned_memory_is_built_again(tmp_path):
    cpu = Device("cpu", "local", "k", {"kind": "llvm"})
    artifact = compile_model(load_model("mlp"), cpu, tmp_path)
    meta_path = Path(artifact.path).parent / "artifact.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({k: v for k, v in meta.items() if "bytes" not in k and k != "planned_dynamic"}))
    again = compile_model(load_model("mlp"), cpu, tmp_path)
    assert not again.cached and again.params_bytes == 38_440
    assert compile_model(load_model("mlp"), cpu, tmp_path).cached


def _wide_model(path: Path) -> Path:
    """x[1,2048] → MatMul 2048×4096 → Relu → MatMul 4096×10: 33.7 MB of float32 weights, quick to compile."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.02).astype(np.float32), name)
             for name, shape in (("w1", (2048, 4096)), ("w2", (4096, 10)))]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2048])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _meminfo_total() -> int:
    line = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:"))
    return int(line.split()[1]) * 1024


def test_loading_20_mb_of_weights_raises_the_session_rss_by_them(farm_net, tmp_path):
    """Measured on farm's Python server (test-a): RSS after load − before = the weights deserialized (anonymous
    memory, ≈ params) + the loaded library's pages, touched while they were read (file-backed, ≈ its file size).
    The library's pages are taken out, and what is left must be the parameter bytes ± 25 %."""
    model = load_model(str(_wide_model(tmp_path / "wide.onnx")))
    device = Device("cpu-a", "local", "test-a", {"kind": "llvm"})
    artifact = compile_model(model, device, tmp_path / "cache")
    assert artifact.params_bytes == (2048 * 4096 + 4096 * 10) * 4 >= 20e6
    result = bench_artifact(farm_net.tracker, device, artifact, make_inputs(model, 0), None, CONFIG)
    assert result.status == "ok", result.reason
    assert result.context["memory"] == MEMORY_MEASURED and "GPU driver allocations are not in it" in MEMORY_MEASURED
    assert result.context["memory_total_bytes"] == _meminfo_total()
    assert result.params_bytes == artifact.params_bytes and result.planned_host_bytes == artifact.planned_host_bytes
    before, after, peak = result.rss_before_load_bytes, result.rss_after_load_bytes, result.rss_peak_bytes
    assert before is not None and after is not None and peak is not None
    library = os.path.getsize(artifact.path)
    assert abs((after - before - library) - artifact.params_bytes) <= 0.25 * artifact.params_bytes, (before, after, library)
    assert peak >= after  # the peak since the reset before load: load, first run, steady runs
    assert "process peak RSS +" in memory_text(result.params_bytes, result.planned_host_bytes,
                                              result.planned_device_bytes, peak - before)


def test_stock_tvm_server_is_not_measured_and_farm_bench_shows_memory(farm_net, tmp_path, farm_env):
    with stock_remote_device(farm_net, tmp_path / "devices.toml", "stock", "stock-memory") as inventory:
        bench = ("bench", "--model", "mlp", "--repeat", "3", "--min-repeat-ms", "5", "--timeout", "60", "--tvm-only")
        stock = run_farm("--devices", str(inventory), *bench, "--device", "stock", "--json", env=farm_env)
        assert stock.returncode == 0, stock.stderr
        memory = json.loads(stock.stdout)["memory"]
        assert memory["measured"] == MEMORY_UNMEASURED and memory["params_bytes"] == 38_440
        assert memory["rss_before_load_bytes"] is None and memory["rss_peak_bytes"] is None
        assert memory["total_bytes"] is None and memory["text"].endswith("process peak RSS not measured")
        farm_server = run_farm("--devices", str(inventory), *bench, "--device", "cpu-a", env=farm_env)
        assert farm_server.returncode == 0, farm_server.stderr
        line = next(line for line in farm_server.stdout.splitlines() if line.strip().startswith("memory:"))
        assert line.strip().startswith("memory: params 38.4 kB · planned activations 1.06 kB · process peak RSS +")
    listed = run_farm("results", "--csv", env=farm_env)
    rows = {r["device"]: r for r in csv.DictReader(io.StringIO(listed.stdout))}
    assert rows["stock"]["params_bytes"] == "38440" and rows["stock"]["rss_peak_bytes"] == ""
    assert int(rows["cpu-a"]["rss_peak_bytes"]) >= int(rows["cpu-a"]["rss_after_load_bytes"]) > 0
    assert int(rows["cpu-a"]["memory_total_bytes"]) == _meminfo_total()
    as_json = {r["device"]: r for r in json.loads(run_farm("results", "--json", env=farm_env).stdout)}
    assert as_json["cpu-a"]["planned_bytes"] == 1064 and as_json["stock"]["rss_peak_increase_bytes"] is None
    report = run_farm("report", "--out", str(tmp_path / "report.html"), env=farm_env)
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "report.html").read_text()
    assert '<h2 id="memory">' in html and "<th>memory</th>" in html
    assert "params 38.4 kB · planned activations 1.06 kB · process peak RSS not measured" in html  # the stock server
    assert "params 38.4 kB · planned activations 1.06 kB · process peak RSS +" in html  # farm's


def _memory_run(run_id: int, sweep_id: int, params: int, rss_peak: int):
    return dataclasses.replace(make_run(run_id, sweep_id, 0.010), params_bytes=params, planned_host_bytes=1000,
                               planned_device_bytes=0, rss_before_load_bytes=100_000_000,
                               rss_after_load_bytes=100_000_000 + params, rss_peak_bytes=100_000_000 + rss_peak)


def test_planned_memory_changes_are_reported_without_statistics_and_peak_rss_is_judged_like_time():
    history = [_memory_run(i, i, 4_000_000, 9_000_000 + 10_000 * (i % 3)) for i in range(1, 7)]
    same = {(v.metric, v.status) for v in detect([*history, _memory_run(7, 7, 4_000_000, 9_010_000)], 7)}
    assert {("params", "ok"), ("planned_activations", "ok"), ("peak_rss", "ok")} <= same
    moved = {v.metric: v for v in detect([*history, _memory_run(7, 7, 4_000_004, 12_000_000)], 7)}
    assert moved["params"].status == "changed" and moved["params"].z is None  # 4 bytes: any change is a change
    assert moved["params"].change == 4 / 4_000_000 and moved["params"].baseline["centre"] == 4_000_000
    assert moved["peak_rss"].status == "candidate" and moved["peak_rss"].value == 12_000_000
    first = {v.metric: v.status for v in detect(history[:1], 1)}
    assert "params" not in first and first["peak_rss"] == "no-baseline"


def test_schema_10_database_gains_memory_columns_keeping_its_runs(tmp_path):
    import sqlite3

    from farm.store.schema import MIGRATIONS, statements

    path = tmp_path / "v10.db"
    db = sqlite3.connect(path)
    for version in range(1, 11):
        for statement in statements(MIGRATIONS[version]):
            if not statement.startswith("RESEQUENCE"):
                db.execute(statement)
    db.execute("INSERT INTO meta VALUES ('schema_version', '10')")
    db.execute("""INSERT INTO runs (started_at, device, key, model, model_digest, artifact_key, status, failed_step,
                  reason, steady_repeat, min_repeat_ms, emulated, farm_version, tvm_version, context, config)
                  VALUES ('t', 'cpu', 'cpu', 'mlp', 'd', 'a', 'ok', '', '', 3, 5, 0, '0', '0', '{}', '{}')""")
    db.execute("""INSERT INTO artifacts VALUES ('a', 'd', '{}', 'so', 'default', '0', 'f', '/x.so', 1.0, 't', '', 0, 0)""")
    db.commit()
    db.close()
    with Store(path) as store:
        (run,) = run_rows(store)
        artifact = store.artifact_record("a", "mlp")
    assert (run.device, run.model, run.params_bytes, run.rss_peak_bytes, run.planned_bytes) == ("cpu", "mlp", None, None, None)
    assert artifact is not None and artifact.params_bytes is None and artifact.path == "/x.so"
