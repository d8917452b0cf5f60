"""Threads are a setting of the device, applied by farm's servers and read back from the session, never assumed:
a real local server started as `farm serve` starts it, a real stock TVM server, real TVM and onnxruntime runs."""

import json
import os
import subprocess
import sys

import pytest

from farm.devices import kinds
from farm.errors import InventoryError
from farm.inventory import parse_inventory
from farm.measure import THREADS_BY_FARM, THREADS_NOT_SET
from farm.models import load_model
from farm.records import BenchConfig, threads_setting
from farm.procs.supervise import stop_process
from farm.rpc.tracker import wait_for_servers
from farm.analysis.series import context_of, describe_change
from farm.stats import versus_text
from farm.store import Store
from farm.sweep import bench_cell
from tests.conftest import stock_remote_device

FAST = BenchConfig(repeat=3, min_repeat_ms=5, timeout_s=30)


def tvm_default_threads() -> int:
    """What TVM's thread pool takes here when nobody sets it (half the CPUs on x86: 1 on a 2-core VM)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", "import tvm; print(tvm.get_global_func('runtime.NumThreads')())"],
                         env=env, capture_output=True, text=True, check=True).stdout
    return int(out.split()[-1])


def test_a_local_device_runs_on_its_threads_setting_and_the_reference_gets_the_same(farm_net, tmp_path):
    default = tvm_default_threads()
    wanted = 2 if default == 1 else 1  # a setting TVM would not pick by itself here
    inv = parse_inventory(farm_net.inventory_text(
        f'\n[devices.threaded]\nkind = "local"\nkey = "test-threads"\ntarget = {{ kind = "llvm" }}\nthreads = {wanted}\n'))
    device = inv.devices["threaded"]
    assert threads_setting(device) == wanted
    started = kinds()["local"].bring_up(device, inv.tracker, tmp_path)  # as `farm serve` starts it
    try:
        wait_for_servers(inv.tracker, {"test-threads": 1}, timeout_s=120)
        with Store(tmp_path / "r.db") as store:
            cell = bench_cell(inv.tracker, device, load_model("convnet"), store, tmp_path / "cache", FAST)
    finally:
        for record in started:
            stop_process(record)
    assert cell.result.status == "ok", cell.result.reason
    assert cell.result.threads == wanted != default  # read back from the session: runtime.NumThreads
    assert cell.result.context["threads_by"] == THREADS_BY_FARM
    reference = cell.reference.result
    assert reference.status == "ok" and reference.threads == wanted
    assert reference.context["runtime_settings"]["intra_op_num_threads"] == wanted
    assert json.loads(context_of(cell.result.context, "0.27", threads=cell.result.threads))["threads"] == wanted


def test_a_stock_server_stores_what_it_reports_marked_not_set_by_farm(farm_net, tmp_path):
    with stock_remote_device(farm_net, tmp_path / "devices.toml", "stock", "test-stock-threads") as path:
        inv = parse_inventory(path.read_text())
        with Store(tmp_path / "r.db") as store:
            cell = bench_cell(inv.tracker, inv.devices["stock"], load_model("mlp"), store, tmp_path / "cache", FAST)
    assert cell.result.status == "ok", cell.result.reason
    assert cell.result.threads == tvm_default_threads()  # the stock server's own default, as it reports it
    assert cell.result.context["threads_by"] == THREADS_NOT_SET


def test_the_threads_setting_defaults_to_num_cores_and_refuses_nonsense():
    inv = parse_inventory('[devices.a]\nkind = "local"\nkey = "a"\ntarget = { kind = "llvm", num-cores = 3 }\n'
                          '[devices.b]\nkind = "local"\nkey = "b"\ntarget = { kind = "llvm" }\n'
                          '[devices.c]\nkind = "local"\nkey = "c"\ntarget = { kind = "llvm", num-cores = 3 }\nthreads = 1\n')
    assert [threads_setting(inv.devices[n]) for n in "abc"] == [3, None, 1]  # None: the server counts its CPUs
    for bad in ("0", "2.5", '"4"', "true"):
        with pytest.raises(InventoryError, match="threads"):
            parse_inventory(f'[devices.a]\nkind = "local"\nkey = "a"\ntarget = {{ kind = "llvm" }}\nthreads = {bad}\n')


def test_a_change_of_threads_is_a_new_series_said_in_words():
    old = context_of({"target": {"kind": "llvm"}}, "0.27", threads=None)
    new = context_of({"target": {"kind": "llvm"}}, "0.27", threads=2)
    assert old != new and old == context_of({"target": {"kind": "llvm"}}, "0.27")  # runs stored before: unchanged
    assert describe_change(old, new) == "threads unknown → 2"
    ref = context_of({}, None, "onnxruntime", "1.20", threads=2)
    assert describe_change(ref, context_of({}, None, "onnxruntime", "1.20", threads=1)) == "threads 2 → 1"


def test_every_comparison_states_its_threads():
    assert versus_text(8.1e-3, 2.6e-3, "onnxruntime", 2, 2) == "TVM 3.12× slower, 2 threads each"
    assert versus_text(1e-3, 4e-3, "onnxruntime", 1, 1) == "TVM 4× faster, 1 thread each"
    assert versus_text(1e-3, 4e-3, "onnxruntime", 1, 2) == "TVM 4× faster (unequal threads: TVM 1, onnxruntime 2)"
    assert versus_text(1e-3, 4e-3, "onnxruntime") == "TVM 4× faster (threads not known: TVM ?, onnxruntime ?)"


def test_tuning_records_are_keyed_by_threads_and_older_ones_are_explained_once(tmp_path, caplog):
    from farm.compile import device_tuning_key, effective_target, key_before_threads
    from farm.sweep import tuning_set

    inv = parse_inventory('[devices.one]\nkind = "local"\nkey = "k"\ntarget = { kind = "llvm" }\nthreads = 1\n'
                          '[devices.two]\nkind = "local"\nkey = "k"\ntarget = { kind = "llvm" }\nthreads = 2\n')
    one, two = inv.devices["one"], inv.devices["two"]
    assert effective_target(one) == effective_target(two) and device_tuning_key(one) != device_tuning_key(two)
    with Store(tmp_path / "r.db") as store:
        store.add_tuning_lines(device_tuning_key(one), ['{"w": 1}'], [(0, '[0, "record on 1 thread"]', 1e-3)], None)
        assert len(tuning_set(store, one).records) == 1 and tuning_set(store, two).records == ()  # never mixed
        store.add_tuning_lines(key_before_threads(effective_target(two)), ['{"w": 1}'], [(0, '[0, "old"]', 1e-3)], None)
        with caplog.at_level("WARNING", logger="farm.sweep"):
            for _ in range(3):
                assert tuning_set(store, two).records == ()  # measured on TVM's default threads: they do not apply
    said = [r.getMessage() for r in caplog.records if "before farm set threads" in r.getMessage()]
    assert len(said) == 1 and "farm tune --device two tunes it again on 2 threads" in said[0]
