"""The reference runtime beside TVM: real onnxruntime, real TVM runs over a real tracker, a real SQLite file."""

import csv
import io
import json
import re
import sqlite3

import onnxruntime
import pytest

from farm.inventory import parse_inventory
from farm.models import load_model
from farm.records import BenchConfig
from farm.views.report import render_report
from farm.analysis.results import run_rows, versus_reference
from farm.stats import versus_text
from farm.store import Store
from farm.sweep import bench_cell
from tests.conftest import run_farm

FAST = BenchConfig(repeat=5, min_repeat_ms=5, timeout_s=20)


def test_versus_text_says_which_way_and_how_much():
    assert versus_text(8.1e-3, 2.6e-3, "onnxruntime", 2, 2) == "TVM 3.12× slower, 2 threads each"
    assert versus_text(1e-3, 4e-3, "onnxruntime", 2, 2) == "TVM 4× faster, 2 threads each"
    assert versus_text(1e-3, 1.004e-3, "litert", 1, 1) == "TVM as fast as litert, 1 thread each"
    assert versus_text(None, 1e-3, "torch") == "" and versus_text(1e-3, None, "torch") == ""


def test_bench_times_onnxruntime_beside_tvm_as_a_series_of_its_own(farm_net, tmp_path):
    inv = parse_inventory(farm_net.inventory_text())
    with Store(tmp_path / "r.db") as store:
        cell = bench_cell(inv.tracker, inv.devices["cpu-a"], load_model("convnet"), store, tmp_path / "cache", FAST)
        rows = {r.run_id: r for r in run_rows(store)}
    assert cell.result.status == "ok" and cell.reference is not None
    ref = cell.reference.result
    assert (ref.status, ref.runtime, ref.runtime_version) == ("ok", "onnxruntime", onnxruntime.__version__)
    assert len(ref.steady_samples_s) == FAST.repeat and ref.steady_number >= 1 and min(ref.steady_samples_s) > 0
    assert ref.load_s > 0 and ref.first_run_s > 0
    assert ref.check.status == "passed"  # the same reference outputs TVM's run is checked against
    settings = ref.context["runtime_settings"]
    assert settings["graph_optimization_level"] == "ORT_ENABLE_ALL"
    assert settings["intra_op_num_threads"] == ref.threads == cell.result.threads  # TVM's threads, as reported
    assert "perf_counter" in ref.context["how_timed"]
    tvm_run, ref_run = rows[cell.run_id], rows[cell.reference.run_id]
    assert (tvm_run.runtime, tvm_run.is_reference) == ("tvm", False)
    assert (ref_run.runtime, ref_run.runtime_version, ref_run.is_reference) == ("onnxruntime", onnxruntime.__version__, True)
    assert ref_run.artifact_key == "" and ref_run.steady_median_s == pytest.approx(sorted(ref.steady_samples_s)[2])
    # its own series: keyed by runtime and its version, never by TVM's version or target
    assert json.loads(ref_run.series_context) == {"runtime": "onnxruntime", "version": onnxruntime.__version__,
                                                  "threads": ref.threads}
    assert "tvm" in json.loads(tvm_run.series_context)
    tvm_only, versus = versus_reference(list(rows.values()))
    assert [r.run_id for r in tvm_only] == [cell.run_id]
    assert versus[cell.run_id].reference.run_id == cell.reference.run_id
    assert versus[cell.run_id].ratio == pytest.approx(tvm_run.steady_median_s / ref_run.steady_median_s)


def test_no_reference_runtime_where_the_device_does_not_run_this_host_s_code(farm_net, tmp_path):
    """A device reached over the network (kind remote) gets no host figure passed off as its own."""
    inv = parse_inventory(farm_net.inventory_text('\n[devices.far]\nkind = "remote"\nkey = "test-b"\n'
                                                  'target = { kind = "llvm", mcpu = "x86-64" }\n'))
    with Store(tmp_path / "r.db") as store:
        cell = bench_cell(inv.tracker, inv.devices["far"], load_model("mlp"), store, tmp_path / "cache", FAST)
        rows = run_rows(store)
    assert cell.result.status == "ok" and cell.reference is None
    assert [r.runtime for r in rows] == ["tvm"]  # nothing stored for a reference
    _, versus = versus_reference(rows)
    assert versus[cell.run_id].text == "no reference runtime on this device (remote device 'far')"


def test_farm_bench_prints_both_and_the_report_and_csv_carry_them(farm_net, inventory_file, farm_env, tmp_path):
    base = ("--devices", str(inventory_file))
    proc = run_farm(*base, "bench", "--device", "cpu-a", "--model", "mlp", "--repeat", "5", "--min-repeat-ms", "5",
                    env=farm_env)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("TVM "))
    match = re.match(r"TVM ([\d.]+ [µm]?s) · onnxruntime ([\d.]+ [µm]?s) \(TVM ([\d.]+)× (slower|faster), (\d+) threads? "
                     r"each\)", line)
    assert match, line
    data = json.loads(run_farm(*base, "bench", "--device", "cpu-b", "--model", "mlp", "--repeat", "5",
                               "--min-repeat-ms", "5", "--json", env=farm_env).stdout)
    assert data["reference"]["runtime"] == "onnxruntime" and data["reference"]["status"] == "ok"
    ratio = data["steady_median_s"] / data["reference"]["steady_median_s"]
    assert data["threads"] == data["reference"]["threads"] >= 1  # the reference runs on TVM's reported threads
    assert data["versus_reference"] == versus_text(data["steady_median_s"], data["reference"]["steady_median_s"],
                                                   "onnxruntime", data["threads"], data["threads"])
    assert data["versus_reference"].startswith("TVM ")
    assert ratio > 0
    alone = json.loads(run_farm(*base, "bench", "--device", "cpu-b", "--model", "mlp", "--repeat", "3",
                                "--min-repeat-ms", "5", "--tvm-only", "--json", env=farm_env).stdout)
    assert alone["reference"] is None
    table = list(csv.DictReader(io.StringIO(run_farm(*base, "results", "--csv", env=farm_env).stdout)))
    assert sorted(r["runtime"] for r in table) == ["onnxruntime", "onnxruntime", "tvm", "tvm", "tvm"]
    assert {r["runtime_version"] for r in table if r["runtime"] == "onnxruntime"} == {onnxruntime.__version__}
    assert {r["threads"] for r in table} == {str(data["threads"])}  # every run, TVM's and onnxruntime's, states them
    with Store(farm_env["FARM_DB"]) as store:
        html = render_report(store, tmp_path / "report.html").read_text()
    assert 'id="versus-table"' in html and "TVM against the reference runtime" in html
    section = html[html.index('id="versus-table"'):]
    assert f"onnxruntime {onnxruntime.__version__}" in section
    assert re.search(r"TVM [\d.]+× (slower|faster)", section)
    assert html.count("data:image/png;base64,") >= 2  # the chart of TVM against the reference is drawn


def test_a_tvm_only_sweep_times_no_reference_runtime_and_keeps_saying_so_on_resume(farm_net, inventory_file, farm_env):
    base = ("--devices", str(inventory_file), "--json", "sweep", "--device", "cpu-a", "--model", "mlp", "--reference",
            "none", "--repeat", "3", "--min-repeat-ms", "5", "--no-report")
    sweep = run_farm(*base, "--tvm-only", env=farm_env)
    assert sweep.returncode == 0, sweep.stderr
    db = sqlite3.connect(farm_env["FARM_DB"])
    assert db.execute("SELECT runtime, COUNT(*) FROM runs GROUP BY runtime").fetchall() == [("tvm", 1)]
    spec = json.loads(db.execute("SELECT spec FROM sweeps").fetchone()[0])
    assert spec["reference_runtime"] is False  # stored with the sweep: --resume measures its cells the same way
    timed = run_farm(*base, env=farm_env)
    assert timed.returncode == 0, timed.stderr
    assert dict(db.execute("SELECT runtime, COUNT(*) FROM runs GROUP BY runtime").fetchall()) == {"tvm": 2,
                                                                                                  "onnxruntime": 1}
