"""Tuning times a CPU candidate with its weights flushed from the caches (records.COLD_WEIGHTS_RULE): on the device,
through its real server; the tuning key that keeps those records apart from records timed warm; the one line that
explains warm records; a warm pack refused."""

import json
import logging

import pytest

from farm.inventory import parse_inventory
from tests.conftest import settings_inventory

DEVICES = settings_inventory("", on="cold", off="cold-too")


def test_a_cpu_task_is_timed_on_the_device_after_each_flush_and_warm_otherwise(farm_net):
    """The profile and the anchor-block seeds time tasks as the runner times candidates: cold, COLD_RUNS single runs,
    each after TVM's cache_flush_cpu_non_first_arg on the device's server (a server without it fails the call)."""
    import functools

    import tvm
    from tvm import te

    from farm.compile import effective_target, make_target, toolchain_for
    from farm.records import COLD_RUNS
    from farm.tune.task_profile import time_modules
    from farm.tune.metaschedule import export_to

    device = parse_inventory(farm_net.inventory_text()).devices["cpu-a"]
    target = effective_target(device)
    a, w = te.placeholder((64, 256), name="a"), te.placeholder((256, 256), name="w")
    k = te.reduce_axis((0, 256), name="k")
    matmul = te.compute((64, 256), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="c")
    mod = tvm.IRModule({"main": te.create_prim_func([a, w, matmul])})
    export = functools.partial(export_to, toolchain_for(device, target))
    cold, warm = (time_modules(farm_net.tracker, device, [("matmul", mod)], make_target(target), export, 30.0,
                               number=3, repeat=2, cold=flushed)[0] for flushed in (True, False))
    assert len(cold) == COLD_RUNS and len(warm) == 2  # a result a repeat: one run each after its flush, cold
    assert all(s > 0 for s in cold + warm)


def test_records_timed_warm_are_kept_apart_explained_once_and_a_warm_pack_is_refused(tmp_path, caplog):
    from farm.compile import device_tuning_key, effective_target, tuning_key
    from farm.errors import FarmError
    from farm.records import cold_weights, layout_setting, threads_setting, weight_prepack_setting
    from farm.store import Store
    from farm.sweep import tuning_set
    from farm.tune.packs import export_database, import_database

    devices = parse_inventory(DEVICES).devices
    cpu, gpu = devices["cold"], devices["gpu"]
    target, gpu_target = effective_target(cpu), effective_target(gpu)
    assert cold_weights(target) and not cold_weights(gpu_target)  # a GPU's weights live in its own memory
    # the CPUs whose flush TVM's runtime implements (elsewhere it does nothing: the runs would be warm, and single)
    assert cold_weights({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})
    assert not cold_weights({"kind": "llvm", "mtriple": "armv7a-linux-androideabi"})
    settings = (threads_setting(cpu, target), weight_prepack_setting(cpu, target))
    warm_key = tuning_key(target, *settings, layout=layout_setting(cpu, target), cold=False)
    assert device_tuning_key(cpu) == tuning_key(target, *settings, layout="NHWC", cold=True) != warm_key
    assert device_tuning_key(gpu) == tuning_key(gpu_target, threads_setting(gpu, gpu_target), cold=False)
    with Store(tmp_path / "r.db") as store:
        store.add_tuning_lines(warm_key, ['{"w": 1}'], [(0, '[0, "timed warm"]', 1e-3)], None)
        with caplog.at_level(logging.WARNING, logger="farm.sweep"):
            for _ in range(3):
                assert tuning_set(store, cpu).records == ()  # ranked warm: never mixed with records timed cold
        said = [r.getMessage() for r in caplog.records if "weights in the CPU's caches" in r.getMessage()]
        assert len(said) == 1 and "farm tune --device cold tunes it again on 2 threads" in said[0], said
    with Store(tmp_path / "model-layout.db") as store:  # warm records of other settings: said too, not silently lost
        store.add_tuning_lines(tuning_key(target, *settings, layout="model", cold=False), ['{"w": 1}'],
                               [(0, '[0, "timed warm in the model\'s layout"]', 1e-3)], None)
        with caplog.at_level(logging.WARNING, logger="farm.sweep"):
            assert tuning_set(store, devices["cold-too"]).records == ()
        said = [r.getMessage() for r in caplog.records if "'cold-too'" in r.getMessage() or "cold-too:" in r.getMessage()]
        assert len(said) == 1 and "weights in the CPU's caches" in said[0], said
    with Store(tmp_path / "r.db") as store:
        pack = tmp_path / "pack"
        export_database(store, cpu, pack)
        manifest = json.loads((pack / "farm-pack.json").read_text())
        assert manifest["cold_weights"] is True
        assert import_database(store, devices["cold-too"], pack) == 0  # timed the same way: taken
        del manifest["cold_weights"]  # a pack exported before farm flushed the weights
        (pack / "farm-pack.json").write_text(json.dumps(manifest))
        with pytest.raises(FarmError, match="timed with their weights in the CPU's caches"):
            import_database(store, devices["cold-too"], pack)
