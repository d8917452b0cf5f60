"""A tuned compile's convolutions in NHWC (records.LAYOUT_RULE): the setting, the keys that keep its records apart,
and a tuned artifact whose convolutions run channels-last while its inputs and outputs keep the model's layout and
still match the reference runtime."""

import json

import pytest

from farm.inventory import parse_inventory
from farm.records import layout_setting
from tests.conftest import TEST_POPULATION, TEST_THREADS, run_farm

DEVICES = '''[devices.model]
kind = "local"
key = "k"
target = { kind = "llvm" }
threads = 2
[devices.nhwc]
kind = "local"
key = "k"
target = { kind = "llvm" }
threads = 2
layout = "NHWC"
'''


def test_the_layout_is_the_model_s_unless_set_and_its_records_are_kept_apart(tmp_path):
    from farm.compile import artifact_key, device_tuning_key, effective_target, key_without_prepack, tuning_key
    from farm.errors import FarmError, InventoryError
    from farm.models import load_model
    from farm.store import Store
    from farm.tune.packs import export_database, import_database

    devices = parse_inventory(DEVICES).devices
    model, nhwc = devices["model"], devices["nhwc"]
    assert [layout_setting(d) for d in (model, nhwc)] == ["model", "NHWC"]
    with pytest.raises(InventoryError, match="layout 'NCHWc' is not one of 'model', 'NHWC'"):
        parse_inventory(DEVICES.replace('layout = "NHWC"', 'layout = "NCHWc"'))
    # the model's own layout keeps the key records had before the setting; NHWC: other workloads, another key
    target = effective_target(model)
    assert device_tuning_key(model) == tuning_key(target, 2, True) == tuning_key(target, 2, True, layout="model")
    assert device_tuning_key(nhwc) == tuning_key(target, 2, True, layout="NHWC") != device_tuning_key(model)
    assert key_without_prepack(nhwc) == key_without_prepack(model)
    convnet = load_model("convnet")
    assert artifact_key(convnet, nhwc, target, "cc", "tuned") != artifact_key(convnet, model, target, "cc", "tuned")
    assert artifact_key(convnet, nhwc, target, "cc") == artifact_key(convnet, model, target, "cc")  # untuned: the same
    with Store(tmp_path / "r.db") as store:  # a pack says its layout, and a device with another refuses it
        export_database(store, model, tmp_path / "pack")
        assert json.loads((tmp_path / "pack" / "farm-pack.json").read_text())["layout"] == "model"
        with pytest.raises(FarmError, match="was tuned with layout 'model', 'nhwc' has 'NHWC'"):
            import_database(store, nhwc, tmp_path / "pack")
        assert import_database(store, model, tmp_path / "pack") == 0


def test_an_nhwc_tuned_artifact_converts_its_convolutions_and_still_matches_the_reference(
        farm_net, tmp_path, farm_env):
    """convnet's weights are seeded random values and it has two outputs, one of them a conv's NCHW features: its
    output check fails if a layout is wrong. Two trials of its second conv (--no-profile: no untuned record
    competes), so one conv is tuned in NHWC; the model's input and outputs keep their layout (a transpose at each
    end, which the model-layout device's tuned compile does not have)."""
    from farm.compile import main_calls

    inventory = tmp_path / "devices.toml"
    inventory.write_text(farm_net.inventory_text(
        f'\n[devices.cpu-nhwc]\nkind = "local"\nkey = "test-a"\ntarget = {{ kind = "llvm" }}\nthreads = {TEST_THREADS}\n'
        f'search_population = {TEST_POPULATION}\nlayout = "NHWC"\n'))
    base = ("--devices", str(inventory))
    for device in ("cpu-nhwc", "cpu-a"):
        tuned = run_farm(*base, "tune", "--device", device, "--model", "convnet", "--tasks", "conv2d1", "--no-profile",
                         "--trials", "2", "--json", env=farm_env)
        assert tuned.returncode == 0, tuned.stderr
        assert json.loads(tuned.stdout)["status"] == "done"
    calls = {}
    for device in ("cpu-nhwc", "cpu-a"):
        artifact = json.loads(run_farm(*base, "compile", "--device", device, "--model", "convnet", "--json",
                                       env=farm_env).stdout)[0]
        assert artifact["tuned_tasks"] >= 1, artifact
        calls[device] = main_calls(artifact["path"])
        bench = run_farm(*base, "bench", "--device", device, "--model", "convnet", "--repeat", "3", "--min-repeat-ms",
                         "5", "--json", env=farm_env)
        assert bench.returncode == 0, bench.stderr
        result = json.loads(bench.stdout)
        assert result["tuned_tasks"] == artifact["tuned_tasks"] and result["check"]["status"] == "passed", result
    assert [c for c in calls["cpu-nhwc"] if "transpose" in c], calls["cpu-nhwc"]
    assert not [c for c in calls["cpu-a"] if "transpose" in c], calls["cpu-a"]
