"""farm tune on real RPC servers: records in the store, tuned artifacts, resume, lost devices."""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from farm.records import COLD_RUNS
from farm.procs.supervise import stop_process
from farm.rpc.launch import start_server
from farm.rpc.tracker import wait_for_servers
from tests.conftest import REPO, TEST_POPULATION, run_farm


def _records(db_path) -> int:
    if not db_path.exists():
        return 0
    try:
        with sqlite3.connect(db_path) as db:
            return db.execute("SELECT COUNT(*) FROM tune_records").fetchone()[0]
    except sqlite3.OperationalError:  # schema not created yet
        return 0


def _baselines_and_best(db_path) -> tuple[dict[str, float], dict[str, float]]:
    """{workload: its untuned record's time} and {workload: its best scheduled record's time}, from the store."""
    baselines: dict[str, float] = {}
    best: dict[str, float] = {}
    with sqlite3.connect(db_path) as db:
        for workload, body, run_s in db.execute("SELECT workload_sha, body, run_s FROM tune_records"):
            if run_s is None:
                continue
            if [inst[0] for inst in json.loads(body)[0][0]] == ["GetSBlock"]:  # compile.untuned_trace: untuned code
                assert workload not in baselines, "one untuned record per task"
                baselines[workload] = run_s
            else:
                best[workload] = min(best.get(workload, run_s), run_s)
    return baselines, best


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
    output = proc.stderr.read() if proc.poll() is not None else ""
    raise AssertionError(f"no tuning record appeared (exit {proc.poll()}): {output}")


def test_short_tune_stores_records_and_changes_the_artifact(farm_net, inventory_file, farm_env, tmp_path):
    proc = run_farm("--devices", str(inventory_file), "tune", "--device", "cpu-a", "--model", "mlp",
                    "--trials", "8", "--per-task", "4", "--json", env=farm_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "done" and out["trials"] >= 4
    assert out["ended_by"] in ("its 8 trials", "every task's allotment measured (or no new candidate left)")
    assert out["new_records"] == out["total_records"] == _records(tmp_path / "results.db") > 0
    assert any(t["best_s"] for t in out["tasks"])
    # the device's search_population reached MetaSchedule's search: each batch sampled from at most that many
    sampled = [int(n) for log in (tmp_path / "home" / "tune" / "sessions").glob("*/logs/*.log")
               for n in re.findall(r"Sampled (\d+) candidate", log.read_text())]
    assert out["population"] == TEST_POPULATION and sampled and max(sampled) <= TEST_POPULATION, sampled
    untuned = json.loads(run_farm("--devices", str(inventory_file), "compile", "--device", "cpu-a", "--model", "mlp",
                                  "--untuned", "--json", env=farm_env).stdout)[0]
    tuned = json.loads(run_farm("--devices", str(inventory_file), "compile", "--device", "cpu-a", "--model", "mlp",
                                "--json", env=farm_env).stdout)[0]
    assert untuned["tuned_tasks"] == 0
    # each searched task's untuned code is a record too, timed by the profile: compile applies a task's best record,
    # so a task whose candidates all lost to untuned (mlp's matmuls take ~1 µs: a few random schedules often lose)
    # compiles untuned and is not counted as tuned
    baselines, best_tuned = _baselines_and_best(tmp_path / "results.db")
    searched = [t for t in out["tasks"] if t["allotted"]]
    assert sorted(baselines.values()) == pytest.approx(sorted(t["untuned_s"] for t in searched))
    assert tuned["tuned_tasks"] == sum(1 for w, secs in baselines.items() if best_tuned.get(w, 1e9) < secs), \
        (out["tasks"], baselines, best_tuned, tuned)
    assert tuned["cache_key"] != untuned["cache_key"] and tuned["path"] != untuned["path"]
    # a CPU's candidates timed as inside a model (records.COLD_WEIGHTS_RULE): COLD_RUNS single runs, each after its
    # weights were flushed (back to back, farm's runner gave one result: 3 runs repeated until 20 ms)
    with sqlite3.connect(tmp_path / "results.db") as db:
        timed = [json.loads(body) for body, run_s in db.execute("SELECT body, run_s FROM tune_records") if run_s]
    candidates = [record[1] for record in timed if [inst[0] for inst in record[0][0]] != ["GetSBlock"]]
    assert candidates and all(len(runs) == COLD_RUNS for runs in candidates), candidates
    bench = run_farm("--devices", str(inventory_file), "bench", "--device", "cpu-a", "--model", "mlp", "--repeat", "3",
                     "--min-repeat-ms", "5", "--json", env=farm_env)
    assert bench.returncode == 0, bench.stderr
    data = json.loads(bench.stdout)
    assert data["tuned_tasks"] == tuned["tuned_tasks"] and data["check"]["status"] == "passed"
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


def test_records_apply_by_anchor_block_to_a_model_whose_convs_have_another_epilogue(farm_net, inventory_file,
                                                                                    farm_env, tmp_path):
    """convnet's convs tuned; a variant whose convs end in LeakyRelu instead of Relu has no identical workload, yet
    compiles with those records (the same conv, the anchor block) and still computes its model."""
    from farm.models.zoo import leaky_variant

    leaky_variant("convnet", tmp_path)
    env = {**farm_env, "FARM_DB": str(tmp_path / "anchor.db")}
    base = ("--devices", str(inventory_file))
    tuned = run_farm(*base, "tune", "--device", "cpu-b", "--model", "convnet", "--trials", "8", "--json", env=env)
    assert tuned.returncode == 0, tuned.stderr
    compiled = run_farm(*base, "compile", "--device", "cpu-b", "--model", str(tmp_path / "convnet-leaky.onnx"),
                        "--json", env=env)
    assert compiled.returncode == 0, compiled.stderr
    artifact = json.loads(compiled.stdout)[0]
    assert artifact["tuned_tasks"] >= 1 and artifact["anchor_tasks"] == artifact["tuned_tasks"]  # none exact
    bench = run_farm(*base, "bench", "--device", "cpu-b", "--model", str(tmp_path / "convnet-leaky.onnx"),
                     "--repeat", "3", "--min-repeat-ms", "5", "--json", env=env)
    assert bench.returncode == 0, bench.stderr
    assert json.loads(bench.stdout)["check"]["status"] == "passed"  # the transferred schedule computes the model
    # tuning the variant starts from the transferred schedule, measured on the device as its first record
    seeded = run_farm(*base, "tune", "--device", "cpu-b", "--model", str(tmp_path / "convnet-leaky.onnx"), "--trials",
                      "2", "--fresh-cost-model", "--json", env=env)
    assert seeded.returncode == 0, seeded.stderr
    out = json.loads(seeded.stdout)
    assert out["seeded"] >= 1 and out["status"] == "done"
    start = [t for t in out["tasks"] if t["trials"]]
    assert start and all(t["best_s"] < t["untuned_s"] for t in start)  # the seed is the tuned conv, not naive loops


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
    baselines, _ = _baselines_and_best(db_path)  # one untuned record per task over both sessions (it asserts so)
    assert baselines


def test_tune_whose_device_dies_ends_with_one_line_and_keeps_records(farm_net, farm_env, tmp_path):
    victim = start_server(farm_net.tracker, "victim", "test-victim", tmp_path)
    inventory = tmp_path / "devices.toml"
    inventory.write_text(farm_net.inventory_text(
        '\n[devices.victim]\nkind = "local"\nkey = "test-victim"\ntarget = { kind = "llvm" }\n'
        f'search_population = {TEST_POPULATION}\n'))
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


def test_trials_go_where_the_untuned_time_is():
    from farm.tune.task_profile import allocate_trials

    # convnet's tasks as timed here untuned (µs a call): one conv is ~90 % of the model's time
    names = ["matmul", "reshape", "mean", "conv2", "max_pool2d", "conv1"]
    times = [0.1e-6, 0.02e-6, 2.9e-6, 419.6e-6, 0.9e-6, 29.8e-6]
    shares = allocate_trials(names, [1] * 6, times, 64, 0.01)
    assert {s.name: s.trials for s in shares} == {"matmul": 0, "reshape": 0, "mean": 0, "conv2": 60, "max_pool2d": 0,
                                                  "conv1": 4}
    assert sum(s.share for s in shares) == 1.0 or abs(sum(s.share for s in shares) - 1.0) < 1e-12
    # call sites count: a task called 3 times costs three calls; the threshold 0 searches every task
    weighted = allocate_trials(["a", "b"], [3, 1], [1e-3, 1e-3], 8, 0.0)
    assert [(s.trials, s.share) for s in weighted] == [(6, 0.75), (2, 0.25)]
    assert [s.trials for s in allocate_trials(["a", "b"], [1, 1], None, 8, 0.01)] == [0, 0]  # not profiled
    # the threshold bounds the tail's sum, not each task: five pools of 0.6 % each are 3 % of the time together,
    # and only the smallest ones that add up to under 1 % go unsearched (a rule per task left all five out)
    pools = allocate_trials(["conv", "p1", "p2", "p3", "p4", "p5"], [1] * 6,
                            [0.97e-3, 0.006e-3, 0.006e-3, 0.006e-3, 0.006e-3, 0.0061e-3], 640, 0.01)
    assert [s.trials > 0 for s in pools] == [True, False, True, True, True, True]


def test_a_time_bounded_budget_is_searched_in_passes_not_all_on_the_biggest_task():
    from farm.tune import overlapped_calls, search_passes

    # a budget bounded by minutes asks for 100,000 trials: the biggest task's share must not be one endless search
    plan = search_passes({0: 70_000, 1: 29_000, 2: 1_000, 3: 0, 4: 100}, {0: 0.7, 1: 0.29, 2: 0.01, 3: 0.001, 4: 0.001},
                         16)
    passes = [next(plan) for _ in range(20)]
    assert passes[:2] == [[(0, 176), (1, 64)], [(0, 176), (1, 80)]]  # 256 a pass by share, in whole batches
    given = {i: sum(n for searches in passes for j, n in searches if j == i) for i in range(5)}
    # ... and the trials go by share over the passes: a task of 1 % is searched a batch every few passes, not a
    # batch each (which gave 30 small tasks most of a pass, and squeezenet's last conv a sixth of the trials)
    assert given[3] == given[4] == 0 and 1 <= given[2] // 16 <= 4  # 0.1 %: no whole batch yet after 20 passes
    assert abs(given[0] / sum(given.values()) - 0.7) < 0.02 and abs(given[1] / sum(given.values()) - 0.29) < 0.02
    assert all(n % 16 == 0 for searches in passes for _, n in searches)
    # small allotments (a trial budget) are searched in one go each, biggest first, and add up to the budget
    assert list(search_passes({0: 60, 1: 4, 2: 0}, {0: 0.9, 1: 0.06, 2: 0.04}, 16)) == [[(0, 60), (1, 4)]]
    whole = [search for searches in search_passes({0: 700, 1: 290, 2: 10}, {0: 0.7, 1: 0.29, 2: 0.01}, 16)
             for search in searches]
    assert sum(t for i, t in whole if i == 0) == 700 and sum(t for i, t in whole if i == 1) == 290
    assert [i for i, _ in whole][:2] == [0, 1] and whole[-1] == (2, 10)  # the 1 % task's 10, once its credit covers them
    # a search does not leave less than a batch of its allotment for a search of its own (a generation for 4 trials)
    assert next(search_passes({0: 1000, 1: 20}, {0: 0.934, 1: 0.066}, 16)) == [(0, 224), (1, 20)]
    # a task with an allotment and next to no share is still searched in the end (no endless empty passes)
    assert list(search_passes({0: 16, 1: 16}, {0: 1.0, 1: 0.0}, 16))[-1] == [(1, 16)]
    # tasks never searched lead the first pass with a batch at least (their first batch buys most), then by share
    fresh = search_passes({0: 700, 1: 290, 2: 10}, {0: 0.7, 1: 0.29, 2: 0.01}, 16, first={2, 1})
    assert [[i for i, _ in searches] for searches in (next(fresh), next(fresh))] == [[1, 2, 0], [0, 1]]
    barely = search_passes({0: 700, 1: 290}, {0: 0.99, 1: 0.01}, 16, first={1})
    assert next(barely) == [(1, 16), (0, 240)]
    # a task whose search ran out of new candidates (a concatenate's few schedules) is not searched again
    exhausted: set[int] = set()
    plan = search_passes({0: 700, 1: 290}, {0: 0.7, 1: 0.29}, 16, exhausted=exhausted)
    assert next(plan) == [(0, 176), (1, 64)]
    exhausted.add(1)
    assert {i for searches in plan for i, _ in searches} == {0}
    # builds running ahead: a pass's searches of whole batches take turns in one call, the rest run alone
    assert overlapped_calls([(0, 176), (1, 80), (2, 10)], 16) == [[(0, 176), (1, 80)], [(2, 10)]]
    assert overlapped_calls([(2, 10)], 16) == [[(2, 10)]]
    # a never-searched task's few trials, first in its pass, stay first (not behind the tuned tasks' whole batches)
    assert overlapped_calls([(3, 5), (0, 176), (1, 80), (2, 10)], 16) == [[(3, 5)], [(0, 176), (1, 80)], [(2, 10)]]


def test_a_batch_s_builds_stop_at_the_session_s_deadline():
    """A session given minutes: builds not done when its time is spent fail as not built and their workers stop,
    so a batch of slow compiles cannot run it minutes past its budget; the restarted workers build again. A
    candidate built and never measured leaves no folder behind once the builder stops."""
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    from farm.compile import effective_target, make_target, toolchain_for
    from farm.tune.metaschedule import NOT_BUILT, PooledBuilder
    from tests.test_compile import LOCAL

    a = te.placeholder((64,), name="a")
    mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute((64,), lambda i: a[i] + 1.0, name="b")])})
    target = effective_target(LOCAL)
    inputs = [ms.builder.BuilderInput(mod, make_target(target))] * 2
    spent = PooledBuilder(toolchain_for(LOCAL, target), 120.0, 1, deadline=time.monotonic())  # before any build ends
    try:
        assert [result.error_msg for result in spent.build(inputs)] == [NOT_BUILT] * 2
        spent.deadline = None  # the same builder, time left: its restarted workers build
        built = spent.build(inputs[:1])
        assert built[0].error_msg is None and os.path.isfile(built[0].artifact_path), built[0].error_msg
    finally:
        spent.shutdown()
    # built and never measured (the session's time spent): its folder goes with the builder, not left in /tmp
    assert not os.path.exists(os.path.dirname(built[0].artifact_path))


def test_a_candidate_whose_build_failed_is_measured_as_failed_with_the_build_error(tmp_path):
    from farm.tune.metaschedule import BUILD_FAILED, measure_when_built
    from farm.tvm_private import RUNNER_ARGS

    library = tmp_path / "candidate.so"
    (tmp_path / ("candidate.so" + BUILD_FAILED)).write_text("build failed: LLVM ERROR: out of registers")
    args = tuple(str(library) if name == "artifact_path" else None for name in RUNNER_ARGS)  # RPCRunner's worker's
    with pytest.raises(RuntimeError, match="out of registers"):
        measure_when_built(5.0, str(tmp_path / "busy.txt"), *args)
    (tmp_path / ("candidate.so" + BUILD_FAILED)).unlink()
    with pytest.raises(RuntimeError, match="no library after 0.2 s"):
        measure_when_built(0.2, str(tmp_path / "busy.txt"), *args)


def test_a_record_s_time_is_the_mean_of_its_runs_the_rule_metaschedule_ranks_by(tmp_path):
    """One rule for a record's time (``records.record_s``): the store's run_s, a task's best, the untuned guard and
    the seeds use it, and it must order records as MetaSchedule's database does (the best is what compiles)."""
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    from farm.compile import untuned_trace
    from farm.tune.database import record_s

    a = te.placeholder((4,), name="a")
    mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute((4,), lambda i: a[i] + 1.0, name="b")])})
    database = ms.database.JSONDatabase(str(tmp_path / "w.json"), str(tmp_path / "r.json"), allow_missing=True)
    workload = database.commit_workload(mod)
    for secs in ([1.0, 5.0], [2.0, 2.0], [1.5, 6.0]):  # by the minimum the order would be 1.0, 1.5, 2.0
        database.commit_tuning_record(ms.database.TuningRecord(untuned_trace(mod), workload, secs, tvm.target.Target(
            "llvm"), ms.arg_info.ArgInfo.from_prim_func(mod["main"])))
    assert [record_s(r.run_secs) for r in database.get_top_k(workload, 3)] == [2.0, 3.0, 3.75]
    assert record_s([1e10]) is None and record_s([]) is None and record_s(None) is None  # failed, or not run


def test_a_task_counts_as_searched_once_a_candidate_of_its_own_was_measured_even_a_losing_one(tmp_path):
    """``searched_before`` decides which tasks lead a session's first pass: its untuned record alone (committed for
    every task a session plans to search, reached or not) is not a search; a schedule slower than it is."""
    import tvm
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    from farm.compile import effective_target, make_target, device_tuning_module, untuned_trace
    from farm.models import load_model
    from farm.records import TuningSet
    from farm.tune.metaschedule import extract_tasks
    from farm.tune.database import prior_databases, searched_before
    from tests.test_compile import LOCAL

    model = load_model("convnet")
    target = make_target(effective_target(LOCAL))
    tasks = tuple(extract_tasks(device_tuning_module(model, LOCAL), target, model))
    assert len(tasks) >= 3
    normalize = tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod")
    database = ms.database.JSONDatabase(str(tmp_path / "w.json"), str(tmp_path / "r.json"), allow_missing=True)

    def commit(task, trace, secs):
        mod = normalize(task.dispatched[0])
        database.commit_tuning_record(ms.database.TuningRecord(trace, database.commit_workload(mod), [secs], target,
                                                               ms.arg_info.ArgInfo.from_prim_func(mod["main"])))

    losing = Schedule(normalize(tasks[1].dispatched[0]))
    losing.annotate(losing.get_sblock("root"), "meta_schedule.unroll_explicit", 16)  # a schedule, slower than untuned
    commit(tasks[0], untuned_trace(normalize(tasks[0].dispatched[0])), 1e-3)  # planned, never reached
    commit(tasks[1], untuned_trace(normalize(tasks[1].dispatched[0])), 1e-3)
    commit(tasks[1], losing.trace, 2e-3)
    workloads, records = (tuple((tmp_path / name).read_text().splitlines()) for name in ("w.json", "r.json"))
    exact, _ = prior_databases(TuningSet("k", workloads, records))
    assert searched_before(exact, tasks) == (False, True) + (False,) * (len(tasks) - 2)


def test_the_tune_package_s_defaults_import_no_tvm():
    """The CLI's parser reads TuneConfig's defaults (DEFAULT_TRIALS, RUNNER_TIMEOUT_S): importing farm.tune must not
    cost TVM's import; the names that need TVM load when first named, and each of them resolves."""
    code = ("import sys, farm.tune; farm.tune.TuneConfig(); farm.tune.DEFAULT_TRIALS; farm.tune.RUNNER_TIMEOUT_S; "
            "print(sorted(m for m in sys.modules if m == 'tvm' or m.startswith('tvm.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
    import farm.tune

    assert [name for name in farm.tune.__all__ if getattr(farm.tune, name, None) is None] == []
    assert farm.tune.TuneConfig().trials == farm.tune.DEFAULT_TRIALS
    assert farm.tune.TuneConfig().runner_timeout_s == farm.tune.RUNNER_TIMEOUT_S


def test_minutes_alone_mean_tune_for_the_minutes_and_trials_alone_or_both_bound_it():
    from farm.tune.config import DEFAULT_TRIALS, UNBOUNDED_TRIALS, session_trials

    assert session_trials(None, 8.0) == UNBOUNDED_TRIALS  # --minutes 8: the session runs for 8 minutes
    assert session_trials(None, None) == DEFAULT_TRIALS
    assert session_trials(100, 8.0) == 100 and session_trials(0, 8.0) == 0  # both: whichever ends first; 0: none


def test_a_time_budget_ends_the_session_rather_than_start_a_batch_it_cannot_finish(tmp_path):
    from farm.tune.config import TuneConfig
    from farm.tune.session import TuneSession, TuneStatus

    def session(batch_secs: list[float], left_s: float) -> TuneSession:
        minutes = 10.0
        return TuneSession(tasks=[], config=TuneConfig(minutes=minutes), say=lambda _: None,
                           started=time.monotonic() - minutes * 60 + left_s, tracker=None, device_key="cpu",
                           store=None, key="k", session_id=1, work_dir=tmp_path, weights=None,
                           batch_secs=batch_secs)

    assert not session([], 60.0).stopping()  # no batch yet: nothing to foresee
    assert not session([40.0, 50.0], 60.0).stopping()  # half a batch fits in the time left
    early = session([300.0, 20.0, 20.0], 60.0)  # one search of a big task took 5 minutes: half of it overruns
    assert early.stopping() and early.status is TuneStatus.TIME_BUDGET
    assert "before its 10 min" in early.reason and "300 s" in early.reason, early.reason
    assert not session([300.0, 20.0, 20.0, 20.0, 20.0], 60.0).stopping()  # the estimate follows the recent batches
    spent = session([], -1.0)
    assert spent.stopping() and spent.reason == "stopped after 10 min"


def test_a_session_given_minutes_alone_runs_for_them_and_says_so(farm_net, inventory_file, farm_env):
    proc = run_farm("--devices", str(inventory_file), "tune", "--device", "cpu-b", "--model", "mlp", "--minutes", "0.1",
                    "--json", env=farm_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["status"], out["ended_by"], out["trials_budget"]) == ("time-budget", "its 0.1 minutes", None), out
