"""Nightly tuning: a sweep file's [tune] budget spent after measuring, on the models furthest from their reference
runtime; a record set kept only if the model is not slower with it; an earlier TVM version's records replayed."""

import json
import sqlite3

from farm.inventory import load_inventory
from farm.analysis.regress import not_slower
from farm.store import Store
from tests.conftest import run_farm
from tests.test_store import DEVICE


def test_a_sweep_tunes_the_model_furthest_from_onnxruntime_keeps_what_is_faster_and_replays_an_upgrade(
        farm_net, inventory_file, farm_env, tmp_path):
    night = tmp_path / "night.toml"
    night.write_text('devices = ["cpu-a"]\nmodels = ["mlp", "convnet"]\nreference = "none"\n'
                     "[bench]\nrepeat = 5\nmin_repeat_ms = 5\n[tune]\nminutes = 4\ntrials = 8\nmodels = 1\n")
    sweep = ("--devices", str(inventory_file), "--json", "sweep", "--file", str(night), "--no-report")
    first = run_farm(*sweep, env=farm_env, timeout=900)
    assert first.returncode == 0, first.stderr
    tuning = json.loads(first.stdout)["tuning"]
    # convnet is ~14× slower than onnxruntime untuned, mlp faster: convnet is picked, and only it (models = 1)
    assert [(t["device"], t["model"]) for t in tuning] == [("cpu-a", "convnet")], first.stderr
    assert "onnxruntime" in tuning[0]["why"] and tuning[0]["new_records"] > 0
    assert tuning[0]["status"] == "kept" and tuning[0]["after_s"] <= tuning[0]["before_s"], tuning
    db = sqlite3.connect(farm_env["FARM_DB"])
    session = db.execute("SELECT status, reason, tuning_key, target FROM tune_sessions WHERE id=?",
                         (tuning[0]["session_id"],)).fetchone()
    assert session[0] != "rejected" and session[1].startswith("kept: ")
    # the night of a TVM upgrade: the records exist only under an earlier version's key. First under one for other
    # threads: measured on another thread count, they are never replayed (#33); then under the same settings' key
    from farm.compile import tuning_key
    from farm.records import layout_setting, threads_setting

    target, cpu_a = json.loads(session[3]), load_inventory(inventory_file).devices["cpu-a"]
    threads, layout = threads_setting(cpu_a, target), layout_setting(cpu_a, target)
    other_threads, earlier = (tuning_key(target, threads + 1, True, tvm="0.26.0", layout=layout),
                              tuning_key(target, threads, True, tvm="0.26.0", layout=layout))
    with db:
        for table in ("tune_sessions", "tune_records", "tune_workloads"):
            db.execute(f"UPDATE {table} SET tuning_key=? WHERE tuning_key=?", (other_threads, session[2]))
        db.execute("UPDATE tune_sessions SET tvm_version='0.26.0' WHERE tuning_key=?", (other_threads,))
    night.write_text(night.read_text().replace("minutes = 4", "minutes = 0.5"))  # no time for a search of its own
    skipped = run_farm(*sweep, env=farm_env, timeout=900)
    assert skipped.returncode == 0, skipped.stderr
    assert json.loads(skipped.stdout)["tuning"] == [] and "replaying" not in skipped.stderr, skipped.stderr
    with db:
        for table in ("tune_sessions", "tune_records", "tune_workloads"):
            db.execute(f"UPDATE {table} SET tuning_key=? WHERE tuning_key=?", (earlier, other_threads))
    second = run_farm(*sweep, env=farm_env, timeout=900)
    assert second.returncode == 0, second.stderr
    replayed = json.loads(second.stdout)["tuning"]
    assert [(t["model"], t["status"]) for t in replayed] == [("convnet", "replayed-kept")], second.stderr
    assert replayed[0]["new_records"] == db.execute(
        "SELECT COUNT(*) FROM tune_records WHERE tuning_key=?", (earlier,)).fetchone()[0]
    assert "TVM 0.26.0 → " in replayed[0]["reason"]
    compiled = json.loads(run_farm("--devices", str(inventory_file), "compile", "--device", "cpu-a", "--model",
                                   "convnet", "--json", env=farm_env).stdout)
    assert [a["tuned_tasks"] > 0 for a in compiled] == [True]  # the next night compiles with the replayed records


def test_a_rejected_session_s_records_compile_into_nothing(tmp_path):
    with Store(tmp_path / "r.db") as store:
        from farm.models import load_model

        model = load_model("mlp")
        kept = store.start_tune_session(DEVICE, model, "k", {"kind": "llvm"}, "0.27.0", 8)
        bad = store.start_tune_session(DEVICE, model, "k", {"kind": "llvm"}, "0.27.0", 8)
        store.add_tuning_lines("k", ['["w0"]'], [(0, '["good"]', 1e-3)], kept)
        store.add_tuning_lines("k", ['["w0"]'], [(0, '["slow"]', 2e-3)], bad)
        assert store.tuning_lines("k")[1] == ['[0, ["good"]]', '[0, ["slow"]]']
        assert store.tuning_lines("k", without_session=bad)[1] == ['[0, ["good"]]']  # the set before it
        store.judge_tune_session(bad, False, "rejected: 1 ms → 2 ms")
        assert store.tuning_lines("k")[1] == ['[0, ["good"]]']
        assert store.tune_session(bad)["status"] == "rejected" and store.tune_session(kept)["status"] == "running"
        assert store.other_tunings({"kind": "llvm"}, "0.28.0") == [("k", "0.27.0")]
        assert store.other_tunings({"kind": "llvm"}, "0.27.0") == []  # the same version: nothing to replay
        assert store.ever_had_records("k") and not store.ever_had_records("k2")
        replay = store.start_tune_session(DEVICE, model, "k2", {"kind": "llvm"}, "0.28.0", 0)
        assert store.copy_tuning("k", "k2", replay) == 1 and store.tuning_lines("k2")[1] == ['[0, ["good"]]']


def test_the_keep_rule_compares_interleaved_rounds():
    assert not_slower([1.0, 1.1, 1.2], [0.5, 0.6, 0.7]) and not_slower([1.0], [1.0])
    assert not not_slower([1.0, 1.0, 1.0], [1.0, 1.1, 1.1]) and not not_slower([1.0], [])
    # per-round ratios, not medians of each: a drifting night hits both sets in each round alike
    assert not_slower([1.0, 2.0, 3.0, 4.0, 5.0], [0.99, 1.98, 2.97, 4.2, 5.5])  # ratios .99 .99 .99 1.05 1.1
    assert not not_slower([1.0, 2.0, 3.0], [1.01, 2.02, 2.5])  # ratios 1.01 1.01 .83: median 1.01
    assert not_slower([], [2.0])  # the previous set did not run: anything that runs is better


def test_a_session_that_changes_none_of_the_model_s_code_is_kept_without_measuring_it(tmp_path):
    """Two record sets whose best schedules are the same compile into one library: validating would measure it
    twice and keep or reject the session on noise. (No tracker is given: measuring would fail.)"""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from farm.compile import effective_target, make_target, device_tuning_module, untuned_trace
    from farm.models import load_model
    from farm.night.tuning import _validate
    from farm.records import BenchConfig, TuningSet
    from tests.test_compile import LOCAL

    model = load_model("mlp")
    target = make_target(effective_target(LOCAL))
    normalize = tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod")
    database = ms.database.JSONDatabase(str(tmp_path / "w.json"), str(tmp_path / "r.json"), allow_missing=True)
    # each function's untuned code as its record (farm tune's), from the module LOCAL tunes
    for func in device_tuning_module(model, LOCAL).functions.values():
        if isinstance(func, tvm.tirx.PrimFunc):
            mod = normalize(func)
            database.commit_tuning_record(ms.database.TuningRecord(
                untuned_trace(mod), database.commit_workload(mod), [1e-3], target,
                ms.arg_info.ArgInfo.from_prim_func(func)))
    workloads, records = (tuple((tmp_path / name).read_text().splitlines()) for name in ("w.json", "r.json"))
    assert len(records) >= 2
    before, after = TuningSet("k", workloads, records[:1]), TuningSet("k", workloads, records)
    checked = _validate(None, LOCAL, model, BenchConfig(), tmp_path / "cache", before, after)  # type: ignore[arg-type]
    assert (checked.kept, checked.before_s, checked.after_s) == (True, None, None), checked.reason
    assert "change none of this model's code" in checked.reason


def test_a_redelivered_tuning_job_waits_for_its_device_s_lease_then_finds_its_night_stored(postgres_db, tmp_path):
    """#61: a tuning job delivered again (its worker froze past the stall) tuned the same key beside the first, and
    replayed its records twice. Now it holds its device's lease: it waits while the first delivery holds it, then
    finds the key's night stored, and tunes nothing."""
    import threading

    from farm.inventory import parse_inventory
    from farm.night.tuning import LabTuning
    from farm.lab.worker import LabWorker

    inventory = parse_inventory('[devices.cpu]\nkind = "remote"\nkey = "cpu"\ntarget = { kind = "llvm" }\n'
                                'lab_host = "lab1"\n')
    worker = LabWorker(postgres_db, inventory.devices, inventory.tracker, tmp_path / "cache", name="w2")
    job = LabTuning(worker, tmp_path / "tune", lambda text: None)
    with Store(postgres_db) as store:
        sweep = store.start_sweep({"devices": ["cpu"], "models": ["mlp"], "reference": None,
                                   "config": {}, "retries": 0, "tuned": True})
        first = store.take_lease("cpu", "w1 (the first delivery, tuning)", 30.0)
        said: list[str] = []
        second = threading.Thread(target=lambda: said.append(job(sweep, "cpu", {})))
        second.start()
        second.join(timeout=3.0)
        assert second.is_alive() and said == []  # it waits for the device: no second tuning beside the first
        store.save_night_tuning(sweep, "cpu", [])  # the first delivery's night, stored as it ends
        store.release_lease(first)
        second.join(timeout=60)
    assert said == ["done before"]
