"""bench_cell end to end: real compile, real RPC servers, real SQLite."""

import numpy as np

from farm.inventory import parse_inventory
from farm.models import load_model, make_inputs, reference_outputs
from farm.records import BenchConfig
from farm.results import run_rows
from farm.store import Store
from farm.sweep import bench_cell

FAST = BenchConfig(repeat=5, min_repeat_ms=5, timeout_s=20)


def test_bench_cell_measures_every_step(farm_net, tmp_path):
    inv = parse_inventory(farm_net.inventory_text())
    with Store(tmp_path / "r.db") as store:
        cell = bench_cell(inv.tracker, inv.devices["cpu-a"], load_model("convnet"), store, tmp_path / "cache", FAST)
        row = run_rows(store)[0]
        steady = store.samples(cell.run_id)
    r = cell.result
    assert r.status == "ok", r.reason
    assert r.upload_s > 0 and r.load_s > 0 and r.first_run_s > 0
    assert len(r.steady_samples_s) == 5 and r.steady_number >= 1
    assert steady == list(r.steady_samples_s)
    assert [(c.output_index, c.nbytes, c.shape) for c in r.copies] == [(0, 40, (1, 10)), (1, 32768, (1, 32, 16, 16))]
    assert all(len(c.samples_s) == FAST.copy_repeat and min(c.samples_s) > 0 for c in r.copies)
    assert r.check.status == "passed" and r.check.max_abs_err < 1e-4
    assert row["status"] == "ok" and row["check"] == "passed"
    assert r.context["target"]["kind"] == "llvm" and r.context["tvm_version"].startswith("0.27")


def test_wrong_reference_is_a_failed_check_with_max_error(farm_net, tmp_path):
    inv = parse_inventory(farm_net.inventory_text())
    model = load_model("mlp")
    expected = reference_outputs(model, make_inputs(model))
    expected[0] = expected[0] + np.float32(0.5)
    np.savez(tmp_path / "golden.npz", *expected)
    with Store(tmp_path / "r.db") as store:
        cell = bench_cell(inv.tracker, inv.devices["cpu-b"], model, store, tmp_path / "cache", FAST,
                          reference_file=str(tmp_path / "golden.npz"))
        row = run_rows(store)[0]
    assert cell.result.status == "failed" and cell.result.failed_step == "check"
    assert abs(cell.result.check.max_abs_err - 0.5) < 1e-3
    assert row["check"] == "failed" and abs(row["max_abs_err"] - 0.5) < 1e-3
    assert row["steady_n"] == 5  # what was measured before the check is kept


def test_absent_device_is_stored_as_failed_session(farm_net, tmp_path):
    inv = parse_inventory(farm_net.inventory_text())
    config = BenchConfig(repeat=3, timeout_s=1)
    with Store(tmp_path / "r.db") as store:
        cell = bench_cell(inv.tracker, inv.devices["ghost"], load_model("mlp"), store, tmp_path / "cache", config)
        row = run_rows(store)[0]
    assert cell.result.status == "failed" and cell.result.failed_step == "session"
    assert row["reason"] == "no free device for key 'test-nobody-serves-this' after 1 s"
