"""Where the time goes (farm/measure/profile.py): `farm bench --profile` times each kernel on the device through the
server's own helper (farm.KernelProfile: farm's Python server and its native one answer the same), in runs of its
own after the stored ones; a stock TVM server says "not available" and the run stands."""

import csv
import io
import json

from farm.measure.profile import op_class, parse_profile
from tests.conftest import native_fleet, run_farm, stock_remote_device


def test_kernels_are_put_in_op_classes_by_their_names():
    named = {"fused_conv2d_add_relu": "conv", "conv2d1": "conv", "fused_matmul_add_relu": "matmul/dense",
             "dense3": "matmul/dense", "max_pool2d": "pool", "adaptive_avg_pool2d": "pool", "concatenate2": "layout/copy/concat",
             "fused_transpose_reshape": "layout/copy/concat", "mean": "reduction", "softmax": "reduction",
             "fused_add_multiply": "elementwise", "relu1": "elementwise", "vm.builtin.alloc_tensor": "vm",
             "erfinv_custom": "other"}
    assert {name: op_class(name) for name in named} == named


def test_the_helper_s_sums_become_per_run_figures():
    said = json.dumps({"clock": "wall", "runs": 4, "main_s": 0.008,
                       "kernels": [{"name": "fused_conv2d_add", "calls": 4, "time_s": 0.006},
                                   {"name": "vm.builtin.alloc_tensor", "calls": 8, "time_s": 0.0004},
                                   {"name": "mean", "calls": 4, "time_s": 0.0008}]})
    profile = parse_profile(said)
    assert (profile.status, profile.runs, profile.main_s) == ("ok", 4, 0.002)
    assert [(k.name, k.op_class, k.calls, k.time_s) for k in profile.kernels] == [
        ("fused_conv2d_add", "conv", 1.0, 0.0015), ("vm.builtin.alloc_tensor", "vm", 2.0, 0.0001),
        ("mean", "reduction", 1.0, 0.0002)]
    assert round(profile.kernel_sum_s, 12) == 0.0017  # the VM's own calls are not kernels
    assert list(profile.by_class()) == ["conv", "reduction", "vm"]


def _profiled(env, inventory, device: str) -> dict:
    done = run_farm("--devices", str(inventory), "bench", "--device", device, "--model", "mlp", "--profile",
                    "--tvm-only", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _assert_mlp_profile(bench: dict) -> None:
    profile = bench["profile"]
    assert profile["status"] == "ok" and profile["runs"] == 10, profile
    kernels = {k["name"]: k for k in profile["kernels"]}
    matmuls = [k for k in kernels.values() if k["op_class"] == "matmul/dense"]
    assert len(matmuls) == 2 and all(k["calls"] == 1.0 and k["time_s"] > 0 for k in matmuls), kernels  # mlp's 2 Gemms
    assert 0 < profile["kernel_sum_s"] <= profile["main_s"]  # the kernels run inside main's runs
    assert bench["status"] == "ok" and bench["steady_samples_s"]  # the stored run, untouched by the profile


def test_farm_s_python_server_profiles_a_model_s_kernels_and_the_run_stores_it(inventory_file, farm_env):
    """The profile is stored with its run: `farm results` carries its sums (--json, CSV) and `--kernels` its kernels,
    each with what the compile knew of it (args, FLOPs, schedule)."""
    bench = _profiled(farm_env, inventory_file, "cpu-a")
    _assert_mlp_profile(bench)
    listed = json.loads(run_farm("results", "--json", env=farm_env).stdout)
    stored = next(r for r in listed if r["run_id"] == bench["run_id"])["profile"]
    assert stored["status"] == "ok" and stored["kernel_sum_s"] == bench["profile"]["kernel_sum_s"]
    assert stored["by_class_s"] == bench["profile"]["by_class_s"]
    table = list(csv.DictReader(io.StringIO(run_farm("results", "--csv", env=farm_env).stdout)))
    row = next(r for r in table if r["run_id"] == str(bench["run_id"]))
    assert row["profile_status"] == "ok" and "matmul/dense=" in row["profile_by_class_s"]
    kernels = json.loads(run_farm("results", "--kernels", "--json", env=farm_env).stdout)
    mine = [k for k in kernels if k["run_id"] == bench["run_id"]]
    assert [k["kernel"] for k in mine] == [k["name"] for k in bench["profile"]["kernels"]]
    first = next(k for k in mine if k["op_class"] == "matmul/dense" and k["args"][0] == "float32[1, 64]")
    # mlp's first Gemm, 1×64 by 64×128, as the compile knew it: parameters in order, 2·64·128 FLOPs, not tuned
    assert first["args"] == ["float32[1, 64]", "float32[64, 128]", "float32[1, 128]"] and first["flops"] == 16384
    assert first["gflops"] == first["flops"] / first["time_s"] / 1e9 and first["schedule"] == "untuned"
    listed_csv = run_farm("results", "--kernels", "--csv", env=farm_env).stdout.splitlines()
    assert listed_csv[0].startswith("run_id,device,model,runtime,threads,kernel,op_class") and len(listed_csv) > len(mine)


def test_farm_s_native_server_profiles_them_the_same_way(tmp_path, farm_env):
    with native_fleet(tmp_path, {"native-a": "profile-native-a"}):
        _assert_mlp_profile(_profiled(farm_env, tmp_path / "devices.toml", "native-a"))


def test_a_stock_tvm_server_has_no_profile_and_the_run_stands(farm_net, tmp_path, farm_env):
    with stock_remote_device(farm_net, tmp_path / "devices.toml", "stock", "profile-stock") as inventory:
        bench = _profiled(farm_env, inventory, "stock")
    assert bench["status"] == "ok"
    assert bench["profile"] == {**bench["profile"], "status": "not available", "kernels": []}
    assert "has no farm.KernelProfile (a stock TVM server)" in bench["profile"]["reason"]
