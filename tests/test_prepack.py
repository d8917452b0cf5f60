"""CPU weight prepacking (records.PREPACK_RULE): the setting, the keys that keep its records apart, and a tuned
artifact whose weights were repacked at build time and whose outputs still match the reference runtime."""

import json

import pytest

from farm.inventory import parse_inventory
from farm.records import weight_prepack_setting
from farm.store import Store
from tests.conftest import assert_records_kept_apart, run_farm, settings_inventory

DEVICES = settings_inventory("weight_prepack = false")


def test_prepacking_is_on_for_llvm_off_for_gpus_and_its_records_are_kept_apart(tmp_path, caplog):
    from farm.compile import device_tuning_key, effective_target, fallback_device, tuning_key
    from farm.errors import InventoryError

    devices = parse_inventory(DEVICES).devices
    on, off, gpu = devices["on"], devices["off"], devices["gpu"]
    assert [weight_prepack_setting(d) for d in (on, off, gpu, fallback_device(gpu))] == [True, False, False, True]
    with pytest.raises(InventoryError, match="weight_prepack needs an llvm target, not 'opencl'"):
        parse_inventory(DEVICES.replace('host = { kind = "llvm" }', 'host = { kind = "llvm" }\nweight_prepack = true'))
    with pytest.raises(InventoryError, match="weight_prepack 'no' must be true or false"):
        parse_inventory(DEVICES.replace("weight_prepack = false", 'weight_prepack = "no"'))
    # off: the key records had before the setting (pipeline 2) where the layout is the model's own; on: other
    # workloads, another key
    target = effective_target(off)
    assert device_tuning_key(off) == tuning_key(target, 2, False, layout="NHWC")
    assert device_tuning_key(on) == tuning_key(target, 2, True, layout="NHWC") != device_tuning_key(off)
    assert tuning_key(target, 2, False, layout="model") == tuning_key(target, 2)
    with Store(tmp_path / "r.db") as store:
        assert_records_kept_apart(store, off, on, caplog, "without weight prepacking",
                                  "weight_prepack = false in devices.toml uses them")


def test_a_tuned_artifact_prepacks_its_weights_at_build_time_and_still_matches_the_reference(
        farm_net, inventory_file, farm_env):
    """mlp's weights are seeded random values (not one constant), so its output check can fail. Two trials of its
    first matmul (one task: one search), every measured one kept (--no-profile: no untuned record competes), so it is
    tuned and MetaSchedule's RewriteLayout packed its weight."""
    from farm.compile import main_calls

    base = ("--devices", str(inventory_file))
    tuned = run_farm(*base, "tune", "--device", "cpu-a", "--model", "mlp", "--tasks", "matmul_add_relu", "--no-profile",
                     "--trials", "2", "--json", env=farm_env)
    assert tuned.returncode == 0, tuned.stderr
    assert json.loads(tuned.stdout)["status"] == "done"
    artifact = json.loads(run_farm(*base, "compile", "--device", "cpu-a", "--model", "mlp", "--json",
                                   env=farm_env).stdout)[0]
    assert artifact["tuned_tasks"] >= 1, artifact
    calls = main_calls(artifact["path"])
    assert not [c for c in calls if c.endswith("_weight_prepack")], calls  # folded into the library's constants
    assert [c for c in calls if c.endswith("_prepacked")], calls  # the tuned matmul reads its packed weight
    # and nothing is left of the folded repacking: no tuple of packed weights built for nothing every run
    assert not [c for c in calls if c in ("vm.builtin.make_tuple", "vm.builtin.tuple_getitem")], calls
    bench = run_farm(*base, "bench", "--device", "cpu-a", "--model", "mlp", "--repeat", "3", "--min-repeat-ms",
                     "5", "--json", env=farm_env)
    assert bench.returncode == 0, bench.stderr
    result = json.loads(bench.stdout)
    assert result["tuned_tasks"] == artifact["tuned_tasks"] and result["check"]["status"] == "passed", result["check"]
