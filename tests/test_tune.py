"""farm tune on real RPC servers: records in the store, tuned artifacts, resume, lost devices."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time


from farm.rpc.processes import start_server, stop_process
from farm.rpc.tracker import wait_for_servers
from tests.conftest import REPO, run_farm


def _records(db_path) -> int:
    if not db_path.exists():
        return 0
    try:
        with sqlite3.connect(db_path) as db:
            return db.execute("SELECT COUNT(*) FROM tune_records").fetchone()[0]
    except sqlite3.OperationalError:  # schema not created yet
        return 0


def _start_tune(inventory, env, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "farm.cli", "--devices", str(inventory), "tune", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env}, cwd=REPO, start_new_session=True)


def _wait_for_records(db_path, proc, timeout_s=240) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        count = _records(db_path)
        if count:
            return count
        time.sleep(0.5)
    raise AssertionError(f"no tuning record appeared (exit {proc.poll()}): {proc.stderr.read() if proc.poll() is not None else ''}")


def test_short_tune_stores_records_and_changes_the_artifact(farm_net, inventory_file, farm_env, tmp_path):
    proc = run_farm("--devices", str(inventory_file), "tune", "--device", "cpu-a", "--model", "mlp",
                    "--trials", "8", "--per-task", "4", "--json", env=farm_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "done" and out["trials"] >= 4
    assert out["new_records"] == out["total_records"] == _records(tmp_path / "results.db") > 0
    assert any(t["best_s"] for t in out["tasks"])
    untuned = json.loads(run_farm("--devices", str(inventory_file), "compile", "--device", "cpu-a", "--model", "mlp",
                                  "--untuned", "--json", env=farm_env).stdout)[0]
    tuned = json.loads(run_farm("--devices", str(inventory_file), "compile", "--device", "cpu-a", "--model", "mlp",
                                "--json", env=farm_env).stdout)[0]
    assert tuned["tuned_tasks"] >= 1 and untuned["tuned_tasks"] == 0
    assert tuned["cache_key"] != untuned["cache_key"] and tuned["path"] != untuned["path"]
    bench = run_farm("--devices", str(inventory_file), "bench", "--device", "cpu-a", "--model", "mlp", "--repeat", "3",
                     "--min-repeat-ms", "5", "--json", env=farm_env)
    assert bench.returncode == 0, bench.stderr
    data = json.loads(bench.stdout)
    assert data["tuned_tasks"] >= 1 and data["check"]["status"] == "passed"  # tuned code still computes the model
    # export and import as MetaSchedule JSON database files
    export_dir = tmp_path / "shared"
    run_farm("--devices", str(inventory_file), "tune", "--device", "cpu-a", "--model", "mlp", "--trials", "0",
             "--export", str(export_dir), env=farm_env)
    lines = (export_dir / "database_tuning_record.json").read_text().splitlines()
    assert len(lines) == out["total_records"]
    other_env = {**farm_env, "FARM_DB": str(tmp_path / "other.db")}
    imported = run_farm("--devices", str(inventory_file), "tune", "--device", "cpu-a", "--model", "mlp", "--trials", "0",
                        "--import", str(export_dir), "--json", env=other_env)
    assert json.loads(imported.stdout)["imported_records"] == len(lines)


def test_interrupted_tune_keeps_records_and_resumes(farm_net, inventory_file, farm_env, tmp_path):
    db_path = tmp_path / "results.db"
    # far more trials than one batch (16): the session is still going when the first records are stored
    proc = _start_tune(inventory_file, farm_env, "--device", "cpu-b", "--model", "mlp", "--trials", "200",
                       "--per-task", "100", "--progress")
    try:
        _wait_for_records(db_path, proc)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert "interrupted: every measured record is kept" in stderr
    kept = _records(db_path)
    assert kept > 0
    with sqlite3.connect(db_path) as db:
        assert db.execute("SELECT status FROM tune_sessions ORDER BY id DESC").fetchone()[0] == "interrupted"
    again = run_farm("--devices", str(inventory_file), "tune", "--device", "cpu-b", "--model", "mlp",
                     "--trials", "4", "--per-task", "2", "--json", env=farm_env)
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert out["total_records"] == kept + out["new_records"] and out["new_records"] > 0


def test_tune_whose_device_dies_ends_with_one_line_and_keeps_records(farm_net, farm_env, tmp_path):
    victim = start_server(farm_net.tracker, "victim", "test-victim", tmp_path)
    inventory = tmp_path / "devices.toml"
    inventory.write_text(farm_net.inventory_text(
        '\n[devices.victim]\nkind = "local"\nkey = "test-victim"\ntarget = { kind = "llvm" }\n'))
    try:
        wait_for_servers(farm_net.tracker, {"test-victim": 1}, timeout_s=120)
        # enough trials per task that tuning goes on after the first batch (16) has stored records
        proc = _start_tune(inventory, farm_env, "--device", "victim", "--model", "mlp", "--trials", "400",
                           "--per-task", "64", "--timeout", "2")
        try:
            kept = _wait_for_records(tmp_path / "results.db", proc)
            stop_process(victim)
            _, stderr = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    finally:
        stop_process(victim)
    assert proc.returncode == 1, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr[-3000:]
    assert errors[0].startswith("error: the server for key 'test-victim' left the tracker during tuning")
    with sqlite3.connect(tmp_path / "results.db") as db:
        status, stored = db.execute("SELECT status, (SELECT COUNT(*) FROM tune_records r WHERE r.session_id = s.id)"
                                    " FROM tune_sessions s ORDER BY id DESC").fetchone()
    assert status == "device-lost"  # the session says why it ended
    assert stored == _records(tmp_path / "results.db") and stored >= kept > 0  # every record is this session's, kept


def test_tune_unknown_device_or_absent_key_fails_before_any_work(farm_net, inventory_file, farm_env, tmp_path):
    unknown = run_farm("--devices", str(inventory_file), "tune", "--device", "nope", "--model", "mlp", env=farm_env)
    assert unknown.returncode == 1
    assert unknown.stderr.splitlines()[0] == f"error: unknown device 'nope' in {inventory_file}"
    # bounded: run_farm's timeout fails the test if the request waited for good
    absent = run_farm("--devices", str(inventory_file), "tune", "--device", "ghost", "--model", "mlp", env=farm_env)
    assert absent.returncode == 1
    assert absent.stderr.splitlines() == [
        f"error: no server is registered under key 'test-nobody-serves-this' at {farm_net.tracker}",
        "hint: bring the device up first: farm serve, then farm devices"]
    assert _records(tmp_path / "results.db") == 0
