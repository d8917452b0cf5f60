"""farm tune's sessions on real RPC servers: what one session hands the next (cost model, packs, where the time is),
several servers of one key, tasks taking turns, MetaSchedule's own scheduler. A file of its own beside
tests/test_tune.py, so pytest-xdist's workers (a file each at a time) share the tuning tests."""

import json

from farm.procs.supervise import stop_process
from farm.rpc.launch import start_server
from farm.rpc.tracker import wait_for_servers
from tests.conftest import TEST_POPULATION, run_farm


def test_sessions_build_on_a_saved_cost_model_and_packs_carry_it(farm_net, inventory_file, farm_env, tmp_path):
    """Session 2 starts from session 1's cost model (kept with the target's records, as data); a pack carries
    records, cost model and a manifest; a pack for another target or TVM is refused."""
    from farm.compile import device_tuning_key
    from farm.tune.costmodel import dump_cost_model, load_cost_model, new_cost_model
    from farm.inventory import load_inventory
    from farm.store import Store

    tune = ("--devices", str(inventory_file), "tune", "--device", "cpu-a", "--model", "mlp")
    first = json.loads(run_farm(*tune, "--trials", "8", "--per-task", "4", "--json", env=farm_env).stdout)
    assert first["status"] == "done" and first["cost_model_samples_before"] == 0 and first["cost_model_samples"] > 0
    assert first["runners"] == 1  # one server under test-a: K = min(free servers, --max-runners 1)
    second = json.loads(run_farm(*tune, "--trials", "8", "--per-task", "8", "--json", env=farm_env).stdout)
    assert second["cost_model_samples_before"] == first["cost_model_samples"]  # started from what session 1 learned
    assert second["cost_model_samples"] >= second["cost_model_samples_before"] + second["trials"] - 8
    fresh = json.loads(run_farm(*tune, "--trials", "4", "--per-task", "8", "--fresh-cost-model", "--json",
                                env=farm_env).stdout)
    assert fresh["cost_model_samples_before"] == 0
    key = device_tuning_key(load_inventory(inventory_file).devices["cpu-a"])
    with Store(farm_env["FARM_DB"]) as store:
        saved = store.cost_model(key)
        blob, samples = saved.body, saved.samples
    model = new_cost_model(1)
    assert load_cost_model(model, blob) == samples == fresh["cost_model_samples"]
    again = new_cost_model(1)
    load_cost_model(again, dump_cost_model(model))  # data and booster survive a round trip unchanged
    assert [g.group_hash for g in again.data.values()] == [g.group_hash for g in model.data.values()]
    assert all((a.costs == b.costs).all() and all((x == y).all() for x, y in zip(a.features, b.features))
               for a, b in zip(again.data.values(), model.data.values()))
    assert model.booster is not None and bytes(again.booster.save_raw("ubj")) == bytes(model.booster.save_raw("ubj"))

    pack = tmp_path / "pack"
    run_farm(*tune, "--trials", "0", "--export", str(pack), env=farm_env)
    manifest = json.loads((pack / "farm-pack.json").read_text())
    assert manifest["tuning_key"] == key and manifest["cost_model"]["samples"] == samples
    assert manifest["records"] == len((pack / "database_tuning_record.json").read_text().splitlines())
    other = {**farm_env, "FARM_DB": str(tmp_path / "other.db")}
    imported = json.loads(run_farm(*tune, "--trials", "0", "--import", str(pack), "--json", env=other).stdout)
    assert imported["imported_records"] == manifest["records"]
    with Store(other["FARM_DB"]) as store:
        assert store.cost_model(key).samples == samples
    wrong_target = run_farm("--devices", str(inventory_file), "tune", "--device", "cpu-b", "--model", "mlp",
                            "--trials", "0", "--import", str(pack), env=other)
    assert wrong_target.returncode == 1 and "was tuned for target" in wrong_target.stderr.splitlines()[0]
    (pack / "farm-pack.json").write_text(json.dumps({**manifest, "tvm_version": "0.26.0"}))
    wrong_tvm = run_farm(*tune, "--trials", "0", "--import", str(pack), env=other)
    assert wrong_tvm.returncode == 1
    assert wrong_tvm.stderr.splitlines()[0].startswith(f"error: {pack} was tuned with TVM 0.26.0")


def test_tune_measures_on_every_free_server_of_the_key(farm_net, farm_env, tmp_path):
    """K = min(free servers, --max-runners): two servers under one key measure candidates at once, each as soon as
    its candidate is built (--builds-ahead; a local device builds first by default)."""
    servers = [start_server(farm_net.tracker, f"twin-{i}", "test-twins", tmp_path / f"twin-{i}") for i in range(2)]
    inventory = tmp_path / "devices.toml"
    inventory.write_text(farm_net.inventory_text(
        '\n[devices.twins]\nkind = "local"\nkey = "test-twins"\ntarget = { kind = "llvm" }\n'
        f'search_population = {TEST_POPULATION}\n'))
    try:
        wait_for_servers(farm_net.tracker, {"test-twins": 2}, timeout_s=120)
        base = ("--devices", str(inventory), "tune", "--device", "twins", "--model", "mlp", "--json")
        two = json.loads(run_farm(*base, "--trials", "8", "--per-task", "4", "--max-runners", "4", "--builds-ahead",
                                  env=farm_env).stdout)
    finally:
        for server in servers:
            stop_process(server)
    assert two["status"] == "done" and two["runners"] == 2 and two["trials"] >= 4  # min(2 free, 4 asked)
    assert two["builds_ahead"] is True
    # the servers' time on candidates is measured per candidate (session asked for → released), within K × search time
    assert 0 < two["device_busy_seconds"] <= two["runners"] * two["search_seconds"], two
    # candidates were measured, not failed (a task's first trial is its untuned code, which the profile timed)
    searched = [t for t in two["tasks"] if t["trials"] > 1]
    assert searched and all(t["best_s"] for t in searched), two["tasks"]


def test_a_pass_s_tasks_take_turns_in_one_search_when_builds_run_ahead(farm_net, tmp_path):
    """Builds ahead of the device: MetaSchedule generates a task's next batch only once its last is measured, so a
    pass's tasks take turns in one call (PassScheduler) and one task's batch is generated while another's is
    measured. Each task measures exactly its allotment (unless its search runs out of candidates)."""
    from farm.models import load_model
    from farm.records import Device
    from farm.store import Store
    from farm.tune import TuneConfig, tune_model

    # mlp's second matmul is ~1/7 of its first (1280 against 8192 MACs) but measures 1 µs untuned: its share
    # has come out as low as 0.08, which at 16 trials is one trial (its untuned record, no search). At 24 it gets
    # two from a share of 0.0625 up. A population of 8 keeps 24 one-candidate batches as quick as 16 were at 64.
    lines: list[str] = []
    with Store(str(tmp_path / "results.db")) as store:
        outcome = tune_model(farm_net.tracker, Device("cpu-a", "local", "test-a", {"kind": "llvm"}), load_model("mlp"),
                             store, tmp_path / "tune", TuneConfig(trials=24, trials_per_iter=1, builds_ahead=True,
                                                                  min_share=0.0, population=8),
                             progress=lines.append)
    assert outcome.status == "done" and outcome.builds_ahead, outcome
    searched = [t for t in outcome.tasks if (t.allotted or 0) > 1]  # more than its untuned record (a trial too)
    assert len(searched) >= 2 and all(t.trials <= t.allotted for t in searched), outcome.tasks
    assert outcome.trials_done == sum(t.trials for t in outcome.tasks)
    # the measure callback's lines name their task: another task was measured before the first one's last batch
    order = [line.split(":")[0].split()[-1] for line in lines if line.startswith("task ")]
    second = next(name for name in order if name != order[0])
    assert order.index(second) < len(order) - 1 - order[::-1].index(order[0]), order


def test_without_the_profile_metaschedule_s_scheduler_shares_the_trials_over_every_task(farm_net, inventory_file,
                                                                                       farm_env):
    """--no-profile: no task is timed first; one MetaSchedule search over every task decides where the trials go."""
    proc = run_farm("--devices", str(inventory_file), "tune", "--device", "cpu-b", "--model", "mlp", "--no-profile",
                    "--trials", "4", "--json", env=farm_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "done" and out["trials"] >= 1, out
    assert all(t["allotted"] is None and t["untuned_s"] is None for t in out["tasks"]), out["tasks"]
    assert out["trials"] == sum(t["trials"] for t in out["tasks"])  # each result counted on the task that measured it


def test_tune_times_each_task_first_and_shares_the_trials(farm_net, inventory_file, farm_env):
    out = json.loads(run_farm("--devices", str(inventory_file), "tune", "--device", "cpu-b", "--model", "convnet",
                              "--trials", "8", "--min-share", "0.05", "--json", env=farm_env).stdout)
    assert out["status"] == "done"
    tasks = {t["name"]: t for t in out["tasks"]}
    assert all(t["untuned_s"] > 0 for t in tasks.values()) and abs(sum(t["share"] for t in tasks.values()) - 1) < 1e-9
    biggest = max(tasks.values(), key=lambda t: t["share"])
    assert "conv2d" in biggest["name"] and biggest["allotted"] == max(t["allotted"] for t in tasks.values())
    from farm.tune.task_profile import small_tail

    # the smallest tasks, together under --min-share, get nothing (a task over it may still round to 0 of 8 trials)
    names, shares = list(tasks), [t["share"] for t in tasks.values()]
    left_out = [tasks[names[i]] for i in small_tail(shares, 0.05)]
    assert left_out and sum(t["share"] for t in left_out) < 0.05
    assert all(t["allotted"] == 0 and t["trials"] == 0 for t in left_out)
    assert sum(t["allotted"] for t in tasks.values()) == 8 and out["trials"] <= 8
    # the next session shares by where the time is now: the conv tuned above costs its best record's time
    again = json.loads(run_farm("--devices", str(inventory_file), "tune", "--device", "cpu-b", "--model", "convnet",
                                "--trials", "8", "--min-share", "0.05", "--json", env=farm_env).stdout)
    now = {t["name"]: t for t in again["tasks"]}
    assert now[biggest["name"]]["share"] < biggest["share"]
    assert abs(sum(t["share"] for t in now.values()) - 1) < 1e-9
