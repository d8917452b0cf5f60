"""The real CLI in subprocesses: exit codes, exact error lines, JSON, and the farm lifecycle."""

import dataclasses
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from farm.cli import build_parser
from farm.procs.supervise import free_port
from tests.conftest import REPO, farm_workspace, run_farm, stock_remote_device, unreachable_phone, write_inventory


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_command_has_help():
    parser = build_parser()
    verbs = parser._subparsers._group_actions[0].choices
    assert set(verbs) >= {"tracker", "serve", "down", "devices", "models", "compile", "bench", "results", "report", "demo"}
    for verb, sub in verbs.items():
        assert sub.description, verb
        assert sub.format_help().startswith("usage: farm " + verb)


def test_bench_json_reports_every_figure(farm_net, inventory_file, farm_env):
    proc = run_farm("--devices", str(inventory_file), "bench", "--device", "cpu-a", "--model", "convnet",
                    "--repeat", "5", "--min-repeat-ms", "5", "--json", env=farm_env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["status"] == "ok" and data["reason"] == ""
    assert data["load_s"] > 0 and data["first_run_s"] > 0 and data["steady_median_s"] > 0
    assert [c["bytes"] for c in data["copy_s"]] == [40, 32768]
    assert data["check"]["status"] == "passed" and data["check"]["max_abs_err"] < 1e-4
    results = run_farm("results", "--json", env=farm_env)  # newest first: the reference runtime's run, then TVM's
    assert [(r["run_id"], r["runtime"]) for r in json.loads(results.stdout)] == [
        (data["reference"]["run_id"], "onnxruntime"), (data["run_id"], "tvm")]
    csv = run_farm("results", "--csv", env=farm_env)
    assert [line.split(",")[0] for line in csv.stdout.splitlines()[1:]] == [str(data["reference"]["run_id"]),
                                                                          str(data["run_id"])]


def test_bench_on_unserved_key_fails_within_timeout(farm_net, inventory_file, farm_env):
    # bounded: run_farm's timeout fails the test if the request waited for good (TVM's would)
    proc = run_farm("--devices", str(inventory_file), "bench", "--device", "ghost", "--model", "mlp", "--timeout", "2",
                    env=farm_env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "error: no free device for key 'test-nobody-serves-this' after 2 s"
    assert lines[1].startswith("hint: check `farm devices`")
    assert "Traceback" not in proc.stderr


def test_stock_rpc_server_as_remote_device_is_benchmarked(farm_net, tmp_path, farm_env):
    with stock_remote_device(farm_net, tmp_path / "devices.toml", "handmade", "by-hand") as inventory:
        proc = run_farm("--devices", str(inventory), "bench", "--device", "handmade", "--model", "mlp",
                        "--repeat", "3", "--min-repeat-ms", "5", "--timeout", "60", "--json", env=farm_env)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["status"] == "ok"


def test_tracker_serve_devices_down_lifecycle(tmp_path, farm_env):
    port = free_port()
    inventory = write_inventory(tmp_path / "devices.toml", """
[devices.life-a]
kind = "local"
key = "life-a"
target = { kind = "llvm" }

[devices.far]
kind = "remote"
key = "life-far"
target = { kind = "llvm" }
""", port)
    env = {**farm_env, "FARM_DEVICES": str(inventory)}
    try:
        started = run_farm("tracker", "start", "--json", env=env)
        assert started.returncode == 0, started.stderr
        tracker_pid = json.loads(started.stdout)["pid"]
        serve = run_farm("serve", "--json", env=env)
        assert serve.returncode == 0, serve.stderr
        server_pids = [s["pid"] for s in json.loads(serve.stdout)["servers"]]
        assert len(server_pids) == 1
        # TVM's own query tool sees what farm serve started
        query = subprocess.run([sys.executable, "-m", "tvm.exec.query_rpc_tracker", "--host", "127.0.0.1", "--port", str(port)],
                               capture_output=True, text=True, timeout=60)
        assert "life-a" in query.stdout
        devices = json.loads(run_farm("devices", "--json", env=env).stdout)
        states = {d["device"]: d["state"] for d in devices["devices"]}
        assert states == {"life-a": "online", "far": "missing"}
    finally:
        down = run_farm("down", "--json", env=env)
    assert down.returncode == 0
    assert len(json.loads(down.stdout)["stopped"]) == 2
    for pid in [tracker_pid, *server_pids]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_phone_server_farm_cannot_reach_is_kept_neither_restarted_nor_forgotten(tmp_path, farm_env):
    """A server recorded on a phone whose adb server is gone (nothing listens on its port): its state is unknown.
    The watchdog must not start a second one; `farm down` says it could not stop it and keeps its record."""
    import threading

    from farm.devices import watch
    from farm.inventory import load_inventory
    from farm.procs.registry import ManagedProcess, update_records
    from farm.procs.supervise import process_state

    inventory, remote = unreachable_phone(tmp_path / "devices.toml", "gone-phone", free_port())  # its adb server is gone
    home = Path(farm_env["FARM_HOME"])
    record = ManagedProcess("server", "phone", "gone-phone", 4242, 9000, "stand-in:5555:/data/server.log", time.time(),
                            "farm-rpc-server", remote)
    update_records(home, lambda current: [record])
    assert process_state(record) == "unknown"

    events: list[str] = []
    stop = threading.Event()
    inv = load_inventory(inventory)
    restarts = watch(inv.devices, inv.tracker, home, 0.1, stop, on_event=lambda text: (events.append(text), stop.set()))
    assert restarts == 0 and events == ["phone: could not check server pid 4242 (its host did not answer); "
                                        "checking again next round"]

    down = run_farm("--devices", str(inventory), "down", "--json", env=farm_env)
    assert down.returncode == 1, (down.stdout, down.stderr)
    lines = down.stderr.strip().splitlines()
    assert lines[0] == "error: could not stop server 'phone': could not reach phone's host to stop server pid 4242"
    assert lines[1].startswith("hint: check that phone's host is reachable (`farm phones` for a phone")
    data = json.loads(down.stdout)
    assert data["stopped"] == [] and [f["pid"] for f in data["failed"]] == [4242]
    kept = json.loads((home / "processes.json").read_text())
    assert [r["pid"] for r in kept] == [4242]  # kept for another `farm down`


BAD_INVENTORIES = {
    "syntax": ("[devices.a\nkind = 1", "error: {path}: not valid TOML"),
    "unknown kind": ('[devices.a]\nkind = "toaster"\nkey = "a"\ntarget = { kind = "llvm" }',
                     "error: {path}:1: device 'a': kind 'toaster' is unknown"),
    "missing key": ('[devices.a]\nkind = "local"\ntarget = { kind = "llvm" }', "error: {path}:1: device 'a': key is missing"),
    "bad target": ('[devices.a]\nkind = "local"\nkey = "a"\ntarget = "llvm"',
                   "error: {path}:1: device 'a': target 'llvm' is a string"),
}


@pytest.fixture(scope="module")
def benched_db(farm_net, tmp_path_factory) -> Path:
    """A results database with one run (mlp on cpu-b), benchmarked once for the module."""
    folder = tmp_path_factory.mktemp("benched")
    inventory, env = farm_workspace(farm_net, folder)
    proc = run_farm("--devices", str(inventory), "bench", "--device", "cpu-b", "--model", "mlp",
                    "--repeat", "3", "--min-repeat-ms", "5", env=env)
    assert proc.returncode == 0, proc.stderr
    return Path(env["FARM_DB"])


@pytest.fixture
def populated_db(benched_db, farm_env) -> Path:
    """This test's own copy of ``benched_db``, where farm_env's FARM_DB points."""
    source, copy = sqlite3.connect(benched_db), sqlite3.connect(farm_env["FARM_DB"])
    source.backup(copy)
    source.close()
    copy.close()
    return Path(farm_env["FARM_DB"])


@pytest.mark.parametrize("case", sorted(BAD_INVENTORIES))
def test_malformed_inventory_one_error_line_db_intact(case, tmp_path, farm_env, populated_db):
    text, expected = BAD_INVENTORIES[case]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    before = _digest(populated_db)
    proc = run_farm("--devices", str(path), "bench", "--device", "a", "--model", "mlp", env=farm_env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith(expected.format(path=path)), proc.stderr
    assert len(lines) == 2 and lines[1].startswith("hint: ")
    assert _digest(populated_db) == before


@pytest.mark.parametrize("case", ["missing model", "truncated onnx", "unknown device"])
def test_bad_model_or_device_one_error_line_db_intact(case, tmp_path, farm_env, inventory_file, populated_db):
    model, device = "mlp", "cpu-a"
    if case == "missing model":
        model, expected = str(tmp_path / "gone.onnx"), f"error: model file {tmp_path / 'gone.onnx'} does not exist"
    elif case == "truncated onnx":
        from farm.models import build_convnet

        data = build_convnet().SerializeToString()
        (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 3])
        model, expected = str(tmp_path / "cut.onnx"), f"error: {tmp_path / 'cut.onnx'} is not a valid ONNX model"
    else:
        device, expected = "pixel9", f"error: unknown device 'pixel9' in {inventory_file}"
    before = _digest(populated_db)
    runs_before = json.loads(run_farm("results", "--json", env=farm_env).stdout)
    proc = run_farm("--devices", str(inventory_file), "bench", "--device", device, "--model", model, env=farm_env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith(expected), proc.stderr
    assert len(lines) == 2 and lines[1].startswith("hint: ") and "Traceback" not in proc.stderr
    assert _digest(populated_db) == before
    assert json.loads(run_farm("results", "--json", env=farm_env).stdout) == runs_before


def test_results_without_db_says_what_to_run(tmp_path):
    proc = run_farm("--db", str(tmp_path / "none.db"), "results")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"error: no results database at {tmp_path / 'none.db'}",
                                        "hint: run `farm bench` or `farm demo` first, or pass --db PATH"]


def test_usage_error_exits_2():
    proc = run_farm("bench", "--model", "mlp")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["error: farm bench: the following arguments are required: --device",
                                        "hint: see farm bench --help"]


def test_devices_probe_reports_a_killed_server_without_waiting_for_it(farm_net, farm_env, tmp_path):
    from farm.procs.supervise import stop_process
    from farm.rpc.launch import start_server
    from farm.rpc.tracker import wait_for_servers

    victim = start_server(farm_net.tracker, "victim", "probe-victim", tmp_path)
    inventory = tmp_path / "devices.toml"
    inventory.write_text(farm_net.inventory_text(
        '\n[devices.victim]\nkind = "local"\nkey = "probe-victim"\ntarget = { kind = "llvm" }\n'))
    try:
        wait_for_servers(farm_net.tracker, {"probe-victim": 1}, timeout_s=120)
        before_first = time.time()
        first = json.loads(run_farm("--devices", str(inventory), "devices", "--probe", "--json", env=farm_env).stdout)
        states = {d["device"]: d for d in first["devices"]}
        assert states["victim"]["state"] == "online" and states["victim"]["probe_ms"] > 0
        assert states["ghost"]["state"] == "missing"
    finally:
        stop_process(victim)
    # no session wait on a dead server (TVM's would block for good: run_farm's timeout would fail the test)
    second = run_farm("--devices", str(inventory), "devices", "--probe", "--json", env=farm_env)
    victim_row = next(d for d in json.loads(second.stdout)["devices"] if d["device"] == "victim")
    # the tracker drops a killed server once it reads its socket closed; on a loaded machine it may list it a moment
    # longer, and then the probe waits its timeout (3 s) for a session and says so, never longer
    if victim_row["state"] == "busy":
        assert "stayed busy for 3 s" in victim_row["reason"], victim_row
    else:
        assert victim_row["state"] == "missing" and "probe-victim" in victim_row["reason"], victim_row
    # last seen by the first probe: no longer ago than that probe began (a bound a loaded machine keeps; was < 10 s)
    assert victim_row["last_seen_s_ago"] is not None
    assert victim_row["last_seen_s_ago"] <= time.time() - before_first + 0.05, victim_row  # rounded to 0.1 s


def test_phones_without_an_adb_server_is_one_error_with_a_hint(tmp_path):
    from farm.procs.supervise import free_port

    started = time.time()
    proc = run_farm("phones", "--adb", f"127.0.0.1:{free_port()}", env={"FARM_HOME": str(tmp_path)})
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: no adb server answers at 127.0.0.1:") and len(lines) == 2
    assert lines[1].startswith("hint: start one with `adb start-server`")
    assert not [p for p in psutil.process_iter(["cmdline", "create_time"])  # farm did not start one itself
                if "fork-server" in " ".join(p.info["cmdline"] or []) and p.info["create_time"] >= started - 1]


def test_an_old_opset_model_onnxruntime_refuses_is_checked_against_its_shipped_outputs(farm_net, inventory_file,
                                                                                    farm_env, tmp_path):
    import onnx
    import onnxruntime

    folder = Path(onnx.__file__).parent / "backend" / "test" / "data" / "pytorch-converted" / "test_AvgPool2d"
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):  # opset 6: onnxruntime has no kernel for it
        onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    bench = ["--devices", str(inventory_file), "bench", "--device", "cpu-a", "--repeat", "3", "--min-repeat-ms", "5",
             "--json"]
    proc = run_farm(*bench, "--model", str(folder / "model.onnx"), env=farm_env)
    assert proc.returncode == 0, proc.stderr
    check = json.loads(proc.stdout)["check"]
    assert check["status"] == "passed" and check["reference"] == "shipped test data (test_data_set_0)", check
    # the same folder given explicitly against a copy of the model with wrong outputs: a failed check, not a skip
    model_dir = tmp_path / "avgpool"
    (model_dir / "data").mkdir(parents=True)
    (model_dir / "model.onnx").write_bytes((folder / "model.onnx").read_bytes())
    (model_dir / "data" / "input_0.pb").write_bytes((folder / "test_data_set_0" / "input_0.pb").read_bytes())
    expected = onnx.numpy_helper.to_array(onnx.load_tensor(str(folder / "test_data_set_0" / "output_0.pb")))
    onnx.save_tensor(onnx.numpy_helper.from_array(expected + 1.0), str(model_dir / "data" / "output_0.pb"))
    proc = run_farm(*bench, "--model", str(model_dir / "model.onnx"), "--reference", str(model_dir / "data"),
                    env=farm_env)
    check = json.loads(proc.stdout)["check"]
    assert check["status"] == "failed" and abs(check["max_abs_err"] - 1.0) < 1e-5, check


def test_the_inventory_s_store_db_is_read_when_no_flag_or_env_names_one(tmp_path):
    from farm.models import load_model
    from farm.store import Store
    from tests.test_store import DEVICE, _result

    lab_db, other_db = tmp_path / "lab.db", tmp_path / "other.db"
    with Store(str(lab_db)) as store:
        store.record_result(_result(), DEVICE, load_model("mlp"), None)
    Store(str(other_db)).close()
    inventory = tmp_path / "devices.toml"
    inventory.write_text(f'[store]\ndb = "{lab_db}"\n')
    home = {"FARM_HOME": str(tmp_path / "home")}
    assert len(json.loads(run_farm("--devices", str(inventory), "results", "--json", env=home).stdout)) == 1
    for env, args in (({**home, "FARM_DB": str(other_db)}, ()), (home, ("--db", str(other_db)))):
        assert json.loads(run_farm("--devices", str(inventory), *args, "results", "--json", env=env).stdout) == []


def test_the_tests_ignore_the_user_s_own_farm_settings(tmp_path):
    """A lab host exports FARM_DB (the README says to), and may set FARM_HOME and FARM_DEVICES. A pytest run in such
    a shell must not hand them to the farm commands its tests run: the test above, run that way, passes."""
    user = {"FARM_DB": "postgresql://farm@dbhost:5432/farm", "FARM_HOME": str(tmp_path / "user-home"),
            "FARM_DEVICES": str(tmp_path / "user-devices.toml")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                           str(tmp_path / "basetemp"),
                           f"{__file__}::test_the_inventory_s_store_db_is_read_when_no_flag_or_env_names_one"],
                          cwd=REPO, env={**os.environ, **user}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:]


def test_json_output_indents_its_outer_levels_and_keeps_a_record_on_one_line(capsys):
    """--json: the top-level keys and each list's items a line each (a night's 1,000 alerts are 1,000 lines for
    grep), written by json's C encoder; it reads back as the same data, records and dataclasses included."""
    from farm.cli.common import emit_json
    from farm.stats import Summary

    summary = Summary(3, 1.0, 1.0, 0.9, 1.1, 0.9, 1.1, 0.01, 0.02, 0.95, 1.05, False)
    data = {"sweep_id": 3, "alerts": [{"id": 1, "baseline": {"values": [1.0, 2.0]}}, {"id": 2, "baseline": None}],
            "budget": {"spent_s": 0.5, "steady": summary}, "empty": []}
    emit_json(data)
    out = capsys.readouterr().out
    assert json.loads(out) == {**data, "budget": {"spent_s": 0.5, "steady": dataclasses.asdict(summary)}}
    lines = out.splitlines()
    assert lines[0] == "{" and lines[-1] == "}" and '  "sweep_id": 3,' in lines
    assert '    {"id": 1, "baseline": {"values": [1.0, 2.0]}},' in lines and '    {"id": 2, "baseline": null}' in lines
    assert '    "steady": {"n": 3, "median": 1.0, "mean": 1.0, "p10": 0.9, "p90": 1.1, "min": 0.9, "max": 1.1, ' \
           '"cv": 0.01, "mad": 0.02, "ci_low": 0.95, "ci_high": 1.05, "unstable": false}' in lines
    emit_json([summary, summary])
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 4 and json.loads(listed[1].rstrip(",")) == dataclasses.asdict(summary)


def test_compare_names_each_run_s_runtime_and_threads(populated_db, farm_env):
    """farm compare reads the two runs it names (not every run), and says what each one is: TVM's run and the
    reference runtime's beside it, on the threads each reported."""
    listed = {r["run_id"]: r for r in json.loads(run_farm("results", "--json", env=farm_env).stdout)}
    tvm = next(i for i, r in listed.items() if r["runtime"] == "tvm")
    reference = next(i for i, r in listed.items() if r["runtime"] != "tvm")
    proc = run_farm("compare", str(tvm), str(reference), env=farm_env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert f"run {tvm}: cpu-b · mlp · tvm, {listed[tvm]['threads']} threads" in lines[0], lines
    assert f"run {reference}: cpu-b · mlp · {listed[reference]['runtime']}, {listed[reference]['threads']} threads" \
        in lines[1], lines


def test_a_short_database_password_is_kept_out_of_urls_without_rewriting_the_rest_of_the_output():
    """A password like 'farm' written as *** wherever it stood turned "farm_version" in --json into "***_version";
    a short one is kept out where it stands in a URL, a long one everywhere."""
    import io

    from farm.cli.common import _Redacting

    out = io.StringIO()
    _Redacting(out, ["farm"]).write('{"farm_version": "0.1"} postgresql://u:farm@h/db?password=farm\n')
    _Redacting(out, ["a-long-secret"]).write("said a-long-secret\n")
    assert out.getvalue() == '{"farm_version": "0.1"} postgresql://u:***@h/db?password=***\nsaid ***\n'
