"""bench_cell end to end: real compile, real RPC servers, real SQLite."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import numpy as np

from farm.inventory import parse_inventory
from farm.models import load_model, make_inputs, reference_outputs
from farm.records import BenchConfig, CellStanding, StoredAttempt
from farm.analysis.results import run_rows
from farm.store import Store
from farm.sweep import SweepSpec, bench_cell, missing_cells
from tests.conftest import REPO, run_farm

FAST = BenchConfig(repeat=5, min_repeat_ms=5, timeout_s=20)


def test_bench_cell_measures_every_step(farm_net, tmp_path):
    inv = parse_inventory(farm_net.inventory_text())
    with Store(tmp_path / "r.db") as store:
        cell = bench_cell(inv.tracker, inv.devices["cpu-a"], load_model("convnet"), store, tmp_path / "cache", FAST)
        row = next(r for r in run_rows(store) if not r.is_reference)
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
        row = next(r for r in run_rows(store) if not r.is_reference)
    assert cell.result.status == "failed" and cell.result.failed_step == "check"
    assert abs(cell.result.check.max_abs_err - 0.5) < 1e-3
    assert row["check"] == "failed" and abs(row["max_abs_err"] - 0.5) < 1e-3
    assert row["steady_n"] == 5  # what was measured before the check is kept


def test_absent_device_is_stored_as_failed_session(farm_net, tmp_path):
    inv = parse_inventory(farm_net.inventory_text())
    config = BenchConfig(repeat=3, timeout_s=1)
    with Store(tmp_path / "r.db") as store:
        cell = bench_cell(inv.tracker, inv.devices["ghost"], load_model("mlp"), store, tmp_path / "cache", config)
        row = next(r for r in run_rows(store) if not r.is_reference)
    assert cell.result.status == "failed" and cell.result.failed_step == "session"
    assert row["reason"] == "no free device for key 'test-nobody-serves-this' after 1 s"


# -- sweeps ---------------------------------------------------------------------------------



def test_missing_cells_skips_ok_and_exhausted_cells():
    spec = SweepSpec(devices=("a", "b"), models=("m1", "m2"), reference="ref", retries=1)
    ok, dropped = StoredAttempt(1, "ok", ""), StoredAttempt(1, "failed", "session")
    done = {("a", "ref"): [ok], ("a", "m1"): [dropped], ("a", "m2"): [dropped, StoredAttempt(2, "failed", "load")],
            ("b", "ref"): [dropped, StoredAttempt(2, "ok", "")], ("b", "m2"): [StoredAttempt(1, "failed", "compile")]}
    # a compile failure is final: a resume (or a redelivered job) does not compile it again
    assert missing_cells(spec, done) == [("a", "m1"), ("b", "m1")]
    assert spec.cell_models() == ("ref", "m1", "m2")


def test_sweep_keeps_going_when_one_device_is_missing(farm_net, inventory_file, farm_env):
    proc = run_farm("--devices", str(inventory_file), "sweep", "--device", "cpu-a", "--device", "ghost",
                    "--model", "mlp", "--model", "convnet", "--repeat", "3", "--min-repeat-ms", "5", "--timeout", "30",
                    "--no-report", "--json", env=farm_env)
    # a sweep with a cell stored offline is incomplete: exit 1, the cells named (#50: it exited 0 "done")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "incomplete" and out["not_ok"] == {"offline": [["ghost", "mlp"], ["ghost", "convnet"]]}
    assert proc.stderr.splitlines()[-2] == (f"error: sweep {out['sweep_id']} is incomplete: 2 cell(s) not ok "
                                            "(offline: ghost × mlp, ghost × convnet)")
    assert proc.stderr.splitlines()[-1] == (f"hint: farm sweep --resume {out['sweep_id']} measures the 2 never "
                                            "measured, offline or with retries left again")
    cells = {(c["device"], c["model"]): c for c in out["cells"]}
    assert {k for k, c in cells.items() if c["status"] == "ok"} == {("cpu-a", "mlp"), ("cpu-a", "convnet")}
    # ghost has no server on the tracker: each of its cells is stored offline at once (no 30 s wait), spending no retry
    assert [c["failed_step"] for (d, _), c in sorted(cells.items()) if d == "ghost"] == ["offline", "offline"]
    assert "no server with key 'test-nobody-serves-this'" in cells[("ghost", "mlp")]["reason"]
    attempts = json.loads(run_farm("results", "--device", "ghost", "--json", env=farm_env).stdout)
    assert sorted(r["attempt"] for r in attempts) == [0, 0]
    with Store(farm_env["FARM_DB"]) as store:
        spec = SweepSpec.from_json(store.sweep(out["sweep_id"])["spec"])
        assert missing_cells(spec, spec.by_cell(store.sweep_attempts(out["sweep_id"]))) == [
            ("ghost", "mlp"), ("ghost", "convnet")]  # --resume measures them


def test_a_busy_device_keeps_the_bounded_wait_and_its_retry(farm_net, tmp_path):
    from farm.rpc.session import request_session
    from farm.sweep import run_sweep

    inv = parse_inventory(farm_net.inventory_text())
    held = request_session(inv.tracker, "test-b", timeout_s=30, session_timeout_s=120)  # cpu-b is registered, busy
    try:
        spec = SweepSpec(("cpu-b",), ("mlp",), None, BenchConfig(repeat=3, min_repeat_ms=5, timeout_s=1))
        outcome = run_sweep(inv.tracker, inv.devices, spec, tmp_path / "r.db", tmp_path / "cache")
    finally:
        del held
    rows = run_rows(Store(tmp_path / "r.db"))
    tvm = [r for r in rows if not r.is_reference]
    # its retry spent, the cell failed for good: the sweep has settled (#61), and a resume leaves the cell as stored
    assert outcome.status == "finished with failures" and outcome.not_ok == {CellStanding.FAILED: [("cpu-b", "mlp")]}
    assert outcome.missing == []
    assert sorted((r.attempt, r.failed_step) for r in tvm) == [(1, "session"), (2, "session")]  # waited, retried once
    assert tvm[0].reason == "no free device for key 'test-b' after 1 s"
    assert [(r.runtime, r.status) for r in rows if r.is_reference] == [("onnxruntime", "ok")]  # the host's figure still


def test_a_failed_compile_is_stored_at_once_and_alike_by_bench_and_sweep(farm_net, tmp_path, monkeypatch):
    """One cell pipeline: the same failing compile through farm bench's path and a sweep's worker gives the same
    stored row, and neither waits on the cooldown or the health gates (nothing ran on the device)."""
    import farm.sweep as sweep_module
    import farm.sweep.cell as cell_module  # where run_cell looks cool_down up

    gates = []
    real_cool_down = cell_module.cool_down
    monkeypatch.setattr(cell_module, "cool_down", lambda *a, **k: gates.append(a[0].name) or real_cool_down(*a, **k))
    inv = parse_inventory(farm_net.inventory_text('''
[devices.broken]
kind = "remote"
key = "test-a"
target = { kind = "llvm" }
cc = "/nonexistent/g++"
cooldown_s = 600
max_temp_c = 1
max_cooldown_s = 600
'''))
    model = load_model("mlp")
    with Store(tmp_path / "r.db") as store:
        cell = bench_cell(inv.tracker, inv.devices["broken"], model, store, tmp_path / "cache", FAST, first=False)
    outcome = sweep_module.run_sweep(inv.tracker, inv.devices, SweepSpec(("broken",), ("mlp",), None, FAST),
                                     tmp_path / "r.db", tmp_path / "cache")
    benched, swept = sorted(run_rows(Store(tmp_path / "r.db")), key=lambda r: r.run_id)
    assert cell.result.failed_step == "compile" and "/nonexistent/g++" in cell.result.hint
    assert outcome.status == "finished with failures" and swept.sweep_id == outcome.sweep_id and benched.sweep_id is None
    assert outcome.not_ok == {CellStanding.FAILED: [(swept.device, swept.model)]}  # a compile failure: not redone
    assert (benched.status, benched.failed_step, benched.reason) == (swept.status, swept.failed_step, swept.reason)
    assert (swept.status, swept.failed_step, swept.attempt) == ("failed", "compile", 1)
    assert gates == []  # no cooldown, no gate: a compile failure touches no device


def _sweep_cells(db_path, sweep_id):
    with sqlite3.connect(db_path) as db:
        return db.execute("SELECT device, model, status FROM runs WHERE sweep_id=? AND runtime='tvm' ORDER BY device, model",
                          (sweep_id,)).fetchall()


def test_sigkill_mid_sweep_then_resume_gives_the_same_cells(farm_net, farm_env, tmp_path):
    inventory = tmp_path / "devices.toml"
    text = farm_net.inventory_text().replace('key = "test-a"', 'key = "test-a"\ncooldown_s = 1').replace(
        'key = "test-b"', 'key = "test-b"\ncooldown_s = 1')
    inventory.write_text(text)
    args = ["--devices", str(inventory), "sweep", "--device", "cpu-a", "--device", "cpu-b", "--model", "mlp",
            "--model", "convnet", "--model", "mobile-block", "--repeat", "3", "--min-repeat-ms", "5", "--no-report"]
    proc = subprocess.Popen([sys.executable, "-m", "farm.cli", *args], cwd=REPO, env={**os.environ, **farm_env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    db_path = tmp_path / "results.db"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if len(_sweep_cells(db_path, 1)) >= 2:
                    break
            except sqlite3.OperationalError:
                pass
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    before = _sweep_cells(db_path, 1)
    assert 2 <= len(before) < 6  # killed midway: some of the 6 cells stored, some missing
    resumed = run_farm(*args[:3], "--resume", "--json", "--no-report", env=farm_env)
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["sweep_id"] == 1 and out["skipped"] == len(before)
    after = _sweep_cells(db_path, 1)
    expected = sorted((d, m, "ok") for d in ("cpu-a", "cpu-b") for m in ("convnet", "mlp", "mobile-block"))
    assert after == expected  # every cell exactly once, reference (mlp) included, nothing duplicated


def test_sweep_file_binds_dynamic_input_shapes(farm_net, inventory_file, farm_env, tmp_path):
    import onnx

    from farm.models import build_mlp

    model = build_mlp()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "dyn.onnx"
    onnx.save(model, path)
    plain = run_farm("--devices", str(inventory_file), "sweep", "--device", "cpu-a", "--model", str(path),
                     "--reference", "none", "--no-report", env=farm_env)
    assert plain.returncode == 1 and "dynamic dimension (batch)" in plain.stderr
    sweep_file = tmp_path / "nightly.toml"
    sweep_file.write_text(f'devices = ["cpu-a"]\nmodels = ["{path}"]\nreference = "none"\n'
                          f'[bench]\nrepeat = 3\nmin_repeat_ms = 5\n[shapes."{path}"]\nx = [4, 64]\n')
    proc = run_farm("--devices", str(inventory_file), "sweep", "--file", str(sweep_file), "--no-report", "--json",
                    env=farm_env)
    assert proc.returncode == 0, proc.stderr
    assert [c["status"] for c in json.loads(proc.stdout)["cells"]] == ["ok"]


def test_cell_eta_from_the_device_s_own_pace():
    from farm.sweep import cell_eta

    assert cell_eta(1, 8, 0.0) == "cell 1/8"  # nothing measured yet: no estimate
    assert cell_eta(3, 8, 20.0) == "cell 3/8, ETA 1m00s"  # 10 s a cell, 6 cells left counting this one


def test_a_cell_that_raises_unexpectedly_is_stored_failed_and_the_sweep_goes_on(farm_net, tmp_path, monkeypatch, caplog):
    import farm.sweep as sweep_module
    import farm.sweep.cell as cell_module  # where run_cell looks measure_cell up

    real = cell_module.measure_cell

    def measure_or_break(tracker, device, model, *args, **kwargs):  # a farm bug in one cell, injected
        if model.name == "convnet" and device.name == "cpu-a":
            return {}["a key farm forgot"]
        return real(tracker, device, model, *args, **kwargs)

    monkeypatch.setattr(cell_module, "measure_cell", measure_or_break)
    inv = parse_inventory(farm_net.inventory_text())
    spec = SweepSpec(("cpu-a", "cpu-b"), ("mlp", "convnet"), None, FAST)
    outcome = sweep_module.run_sweep(inv.tracker, inv.devices, spec, tmp_path / "r.db", tmp_path / "cache")
    # the crashed cell is failed for good (step "farm": no retry helps): settled, and nothing to resume
    assert outcome.status == "finished with failures" and outcome.missing == []
    cells = {(r.device, r.model): r for r in run_rows(Store(tmp_path / "r.db")) if not r.is_reference}
    broken = cells.pop(("cpu-a", "convnet"))
    assert (broken.status, broken.failed_step) == ("failed", "farm") and "KeyError" in broken.reason
    assert broken.attempt == 1  # a farm bug is not retried as if the session dropped
    assert sorted(cells) == [("cpu-a", "mlp"), ("cpu-b", "convnet"), ("cpu-b", "mlp")]
    assert all(r.status == "ok" for r in cells.values())
    logged = [r for r in caplog.records if r.exc_info and "cpu-a × convnet" in r.getMessage()]
    assert logged and logged[0].exc_info[0] is KeyError  # the traceback is in the log (shown with -v)


def test_a_worker_that_dies_leaves_the_sweep_incomplete_and_resumable(farm_net, tmp_path, monkeypatch):
    import farm.sweep as sweep_module
    import farm.sweep.run as run_module  # where the sweep's workers look cell_eta up

    real = run_module.cell_eta

    def eta_or_break(count, total, elapsed_s):  # outside any cell: the whole worker of cpu-b ends
        if threading.current_thread().name == "sweep-cpu-b":
            raise RuntimeError("worker bug")
        return real(count, total, elapsed_s)

    inv = parse_inventory(farm_net.inventory_text())
    spec = SweepSpec(("cpu-a", "cpu-b"), ("mlp",), None, FAST)
    monkeypatch.setattr(run_module, "cell_eta", eta_or_break)
    outcome = sweep_module.run_sweep(inv.tracker, inv.devices, spec, tmp_path / "r.db", tmp_path / "cache",
                                     progress=lambda *_: None)
    assert outcome.status == "incomplete" and outcome.missing == [("cpu-b", "mlp")]
    with Store(tmp_path / "r.db") as store:
        assert store.sweep(outcome.sweep_id)["status"] == "incomplete"
    monkeypatch.setattr(run_module, "cell_eta", real)
    resumed = sweep_module.run_sweep(inv.tracker, inv.devices, spec, tmp_path / "r.db", tmp_path / "cache",
                                     sweep_id=outcome.sweep_id)
    assert resumed.status == "done" and resumed.skipped == 1
    with Store(tmp_path / "r.db") as store:
        assert sorted((r.device, r.status) for r in run_rows(store) if not r.is_reference) == [("cpu-a", "ok"), ("cpu-b", "ok")]


def test_resume_only_what_never_finished_and_say_so_in_plain_words(inventory_file, farm_env):
    args = ("--devices", str(inventory_file), "sweep", "--resume")
    with Store(farm_env["FARM_DB"]):
        pass  # a results database with no sweep in it (what farm demo or farm bench leave)
    proc = run_farm(*args, env=farm_env)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[0] == f"error: there is no sweep to resume in {farm_env['FARM_DB']}: " \
                                          "no farm sweep has run with this database"
    assert proc.stderr.splitlines()[1].startswith("hint: start one with farm sweep")
    quiet = run_farm(*args, "--if-incomplete", env=farm_env)
    assert quiet.returncode == 0 and "no sweep to resume" in quiet.stderr
    with Store(farm_env["FARM_DB"]) as store:
        done = store.start_sweep(SweepSpec(("cpu-a",), ("mlp",), None, FAST).to_json())
        store.finish_sweep(done, "done")
    finished = run_farm(*args, "--if-incomplete", env=farm_env)
    assert finished.returncode == 0 and f"sweep {done} is done: nothing to resume" in finished.stderr
    alone = run_farm("--devices", str(inventory_file), "sweep", "--if-incomplete", env=farm_env)
    assert alone.returncode == 1 and "error: --if-incomplete goes with --resume" in alone.stderr


def test_a_cpu_fallback_that_needs_the_missing_toolchain_is_not_attempted(farm_net, tmp_path, monkeypatch):
    """mate10's case: its GPU build failed for want of the NDK; its CPU build needs the NDK too, so the fallback is
    not attempted and the stored reason says why."""
    monkeypatch.delenv("TVM_NDK_CC", raising=False)
    inv = parse_inventory(farm_net.inventory_text('''
[devices.phone-gpu]
kind = "remote"
key = "test-phone-gpu"
target = { kind = "opencl", device = "mali" }
host = { kind = "llvm", mtriple = "aarch64-linux-android" }
fallback = "cpu"
'''))
    with Store(tmp_path / "r.db") as store:
        cell = bench_cell(inv.tracker, inv.devices["phone-gpu"], load_model("mlp"), store, tmp_path / "cache", FAST)
        rows = run_rows(store)
    assert cell.result.failed_step == "compile" and cell.fallback is None
    assert "no Android NDK compiler is configured" in cell.result.reason
    assert "no CPU fallback: the CPU build needs the same toolchain" in cell.result.reason
    assert [(r.device, r.failed_step) for r in rows] == [("phone-gpu", "compile")]  # nothing stored for phone-gpu@cpu


def test_a_crash_in_the_reference_run_keeps_the_measured_tvm_run(farm_net, tmp_path, monkeypatch):
    """#61: an exception farm does not expect after TVM's run (here planted in farm's own reference step) is the
    reference's stored failure; the TVM run measured before it is stored ok."""
    from farm.sweep import cell as cell_module

    def crash(*_args, **_kwargs):
        raise RuntimeError("planted: the reference step blew up")

    monkeypatch.setattr(cell_module, "reference_run", crash)
    inv = parse_inventory(farm_net.inventory_text())
    with Store(tmp_path / "r.db") as store:
        cell = bench_cell(inv.tracker, inv.devices["cpu-a"], load_model("mlp"), store, tmp_path / "cache", FAST)
        rows = {(r.runtime, r.status) for r in run_rows(store)}
    assert cell.result.status == "ok" and len(cell.result.steady_samples_s) == 5
    assert cell.reference is not None and cell.reference.result.status == "failed"
    assert cell.reference.result.reason == "unexpected RuntimeError: planted: the reference step blew up"
    assert rows == {("tvm", "ok"), ("onnxruntime", "failed")}


def test_a_crash_in_the_cpu_fallback_keeps_the_gpu_s_failed_run(farm_net, tmp_path, monkeypatch):
    """#61: the GPU's run (failed at load: no OpenCL on this server) and the fallback's crash are both stored."""
    from farm.sweep import cell as cell_module

    def crash(*_args, **_kwargs):
        raise KeyError("planted")

    monkeypatch.setattr(cell_module, "fallback_run", crash)
    inv = parse_inventory(f'[tracker]\nhost = "127.0.0.1"\nport = {farm_net.tracker.port}\n\n[devices.gpu]\n'
                          'kind = "remote"\nkey = "test-a"\ntarget = { kind = "opencl" }\nhost = { kind = "llvm" }\n'
                          'fallback = "cpu"\n')
    with Store(tmp_path / "r.db") as store:
        cell = bench_cell(inv.tracker, inv.devices["gpu"], load_model("mlp"), store, tmp_path / "cache", FAST,
                          reference_runtime=False)
        rows = sorted((r.device, r.status, r.failed_step) for r in run_rows(store))
    assert cell.result.status == "failed" and cell.result.failed_step != "farm"
    assert cell.fallback is not None and cell.fallback.result.reason == "unexpected KeyError: 'planted'"
    assert rows == sorted([("gpu", "failed", cell.result.failed_step), ("gpu@cpu", "failed", "farm")])


def _save(proto, path):
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, str(path))
    return str(path)


def test_two_different_models_stored_under_one_name_are_refused_before_any_work(inventory_file, farm_env, tmp_path):
    """#61: a/model.onnx and b/model.onnx shared a cell: one was never measured and the sweep said done."""
    from farm.models import build_convnet, build_mlp

    a, b = _save(build_mlp(), tmp_path / "a" / "model.onnx"), _save(build_convnet(), tmp_path / "b" / "model.onnx")
    proc = run_farm("--devices", str(inventory_file), "sweep", "--device", "cpu-a", "--model", a, "--model", b,
                    "--reference", "none", "--no-report", env=farm_env)
    assert proc.returncode == 1
    assert [line for line in proc.stderr.splitlines() if line.startswith("error: ")] == [
        f"error: models {a!r} and {b!r} are different models, both stored as 'model': one of them would never be "
        "measured"]
    assert not os.path.exists(farm_env["FARM_DB"]) or Store(farm_env["FARM_DB"]).sweep(None) is None  # nothing began


def test_a_model_changed_since_the_sweep_started_is_stored_failed_and_the_sweep_settles(inventory_file, farm_env,
                                                                                       tmp_path):
    """#61: the spec records each model's identity; a resume finds the file re-exported and stores the cell failed
    for good with the reason, so the sweep settles ("finished with failures", exit 1) and cron's --resume
    --if-incomplete leaves it."""
    from farm.models import build_convnet, build_mlp

    model = _save(build_mlp(), tmp_path / "m.onnx")
    args = ("--devices", str(inventory_file), "sweep", "--no-report", "--reference", "none")
    first = run_farm(*args, "--device", "ghost", "--model", model, "--json", env=farm_env)  # offline: stored, resumable
    sweep_id = json.loads(first.stdout)["sweep_id"]
    assert first.returncode == 1 and json.loads(first.stdout)["status"] == "incomplete"
    with Store(farm_env["FARM_DB"]) as store:
        recorded = SweepSpec.from_json(store.sweep(sweep_id)["spec"]).model_digests
    assert recorded == {model: load_model(model).identity_digest}
    _save(build_convnet(), tmp_path / "m.onnx")  # re-exported between the night and its resume
    resumed = run_farm(*args, "--resume", str(sweep_id), "--json", env=farm_env)
    out = json.loads(resumed.stdout)
    assert resumed.returncode == 1 and out["status"] == "finished with failures"
    assert out["not_ok"] == {"failed": [["ghost", model]]}
    assert resumed.stderr.splitlines()[-2].startswith(f"error: sweep {sweep_id} is finished with failures: 1 cell(s)")
    (cell,) = [c for c in out["cells"] if c["status"] != "ok"]
    assert cell["failed_step"] == "model" and cell["reason"].startswith(
        f"model changed since the sweep started: {model} is ")
    again = run_farm(*args, "--resume", "--if-incomplete", env=farm_env)
    assert again.returncode == 0 and f"sweep {sweep_id} is finished with failures: nothing to resume" in again.stderr


def test_a_resumed_sweep_whose_model_no_longer_loads_stores_it_failed_and_settles(inventory_file, farm_env, tmp_path):
    """A resume stopped at the first model that did not load, every night: now that cell is stored failed for good
    with the loader's reason, and the resume goes on."""
    from farm.models import build_mlp

    model = _save(build_mlp(), tmp_path / "gone.onnx")
    args = ("--devices", str(inventory_file), "sweep", "--no-report", "--reference", "none", "--json")
    first = run_farm(*args, "--device", "ghost", "--model", model, env=farm_env)
    sweep_id = json.loads(first.stdout)["sweep_id"]
    os.remove(model)
    resumed = run_farm(*args, "--resume", str(sweep_id), env=farm_env)
    out = json.loads(resumed.stdout)
    assert resumed.returncode == 1 and out["status"] == "finished with failures", resumed.stderr[-2000:]
    (cell,) = out["cells"]
    assert (cell["failed_step"], cell["reason"]) == ("model", f"the model does not load: model file {model} does not exist")


def test_a_lab_worker_measures_the_model_the_sweep_names_never_yesterday_s(tmp_path):
    """#61: a worker kept every model it loaded, by name, for its life. Now it loads a model again when the sweep
    names another identity, and refuses (with the reason) one that is not the sweep's, or does not load."""
    from farm.models import build_convnet, build_mlp
    from farm.records import TrackerAddress
    from farm.lab.worker import LabWorker

    path = _save(build_mlp(), tmp_path / "m.onnx")
    worker = LabWorker(str(tmp_path / "r.db"), {}, TrackerAddress("127.0.0.1", 1), tmp_path / "cache")
    yesterday = SweepSpec(("d",), (path,), None, model_digests={path: load_model(path).identity_digest})
    source, problem = worker.model_or_problem(yesterday, path)
    assert problem == "" and source.identity_digest == yesterday.model_digests[path]
    _save(build_convnet(), tmp_path / "m.onnx")
    tonight = SweepSpec(("d",), (path,), None, model_digests={path: load_model(path).identity_digest})
    source, problem = worker.model_or_problem(tonight, path)
    assert problem == "" and source.identity_digest == tonight.model_digests[path]  # loaded again, not yesterday's
    _, problem = worker.model_or_problem(yesterday, path)  # a resume of yesterday's sweep: not its model any more
    assert problem.startswith(f"model changed since the sweep started: {path} is {tonight.model_digests[path][:12]}")
    os.remove(path)
    fresh = LabWorker(str(tmp_path / "r.db"), {}, TrackerAddress("127.0.0.1", 1), tmp_path / "cache")
    stand_in, problem = fresh.model_or_problem(SweepSpec(("d",), (path,), None, stored_names={path: "m"}), path)
    assert stand_in.name == "m" and problem == f"the model does not load on this host: model file {path} does not exist"


def test_a_factory_model_is_identified_by_its_module_file_factory_and_shapes(tmp_path, monkeypatch):
    """Its exported bytes change with torch's version and unseeded initializers; its identity does not."""
    from farm.models.frameworks import factory_identity

    module = tmp_path / "my_models.py"
    module.write_text("def build():\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    imported = importlib.import_module("my_models")
    one = factory_identity(imported, "build", {"x": (1, 3)})
    assert one == factory_identity(imported, "build", {"x": (1, 3)})
    assert len({one, factory_identity(imported, "build", {"x": (1, 4)}), factory_identity(imported, "other", {"x": (1, 3)})}) == 3
    module.write_text("def build():\n    return 1\n")
    assert factory_identity(imported, "build", {"x": (1, 3)}) != one


def test_two_sweeps_on_one_sqlite_database_cannot_overlap(inventory_file, farm_env):
    """#61: a night that overran and the next one measured the same devices at once."""
    from farm.sweep.run import one_sweep_at_a_time

    with one_sweep_at_a_time(farm_env["FARM_DB"]):
        proc = run_farm("--devices", str(inventory_file), "sweep", "--device", "cpu-a", "--model", "mlp",
                        "--reference", "none", "--no-report", env=farm_env)
    assert proc.returncode == 1
    error, hint = proc.stderr.splitlines()[-2:]
    assert error.startswith(f"error: another farm sweep is running on {farm_env['FARM_DB']} (pid {os.getpid()}, since ")
    assert hint.startswith("hint: wait for it to end")
