"""Where the time goes (farm/measure/profile.py): `farm bench --profile` times each kernel on the device through the
server's own helper (farm.KernelProfile: farm's Python server and its native one answer the same), in runs of its
own after the stored ones; a stock TVM server says "not available" and the run stands."""

import csv
import io
import json
from dataclasses import replace

import pytest

from farm.measure.profile import parse_profile
from farm.op_classes import onnx_op_class, op_class
from tests.conftest import native_fleet, run_farm, stock_remote_device


def test_kernels_are_put_in_op_classes_by_their_names():
    named = {"fused_conv2d_add_relu": "conv", "conv2d1": "conv", "fused_matmul_add_relu": "matmul/dense",
             "dense3": "matmul/dense", "max_pool2d": "pool", "adaptive_avg_pool2d": "pool", "concatenate2": "layout/copy/concat",
             "fused_transpose_reshape": "layout/copy/concat", "mean": "reduction", "softmax": "reduction",
             "fused_add_multiply": "elementwise", "relu1": "elementwise", "vm.builtin.alloc_tensor": "vm",
             "erfinv_custom": "other"}
    assert {name: op_class(name) for name in named} == named


def test_onnxruntime_s_nodes_go_in_the_same_op_classes_by_their_op_types():
    named = {"FusedConv": "conv", "Conv": "conv", "FusedMatMul": "matmul/dense", "Gemm": "matmul/dense",
             "GlobalAveragePool": "pool", "MaxPool": "pool", "ReorderOutput": "layout/copy/concat",
             "Concat": "layout/copy/concat", "Softmax": "reduction", "ReduceMean": "reduction",
             "BatchNormalization": "elementwise", "Relu": "elementwise", "SomeNewOp": "other"}
    assert {op: onnx_op_class(op) for op in named} == named


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


def _profile(*kernels):
    from farm.records import KernelProfile, KernelTime

    return KernelProfile("ok", "", "wall", 10, sum(t for _, t in kernels) + 0.0001,
                         tuple(KernelTime(name, op_class(name), 1.0, t) for name, t in kernels))


def test_a_change_is_put_on_the_kernels_that_moved_and_other_kernels_compare_by_op_class():
    from farm.analysis.kernel_diff import kernel_diff

    before = _profile(("fused_conv2d_add_relu", 0.00106), ("fused_conv2d1_add", 0.0004), ("max_pool2d", 0.0001))
    after = _profile(("fused_conv2d_add_relu", 0.00131), ("fused_conv2d1_add", 0.00041), ("max_pool2d", 0.0001))
    diff = kernel_diff(before, after, same_artifact=True)
    assert diff.by == "kernel" and [m.name for m in diff.moves][:2] == ["fused_conv2d_add_relu", "fused_conv2d1_add"]
    assert round(diff.moves[0].share, 3) == round(0.00025 / 0.00026, 3)
    assert diff.headline() == "96% of the +260 µs is fused_conv2d_add_relu (1.06 ms → 1.31 ms)"
    faster = kernel_diff(after, before, same_artifact=True)  # a speedup: the largest decrease first
    assert faster.moves[0].name == "fused_conv2d_add_relu" and faster.moves[0].share > 0.9
    # a record that packed the conv's weights removed: the same kernel, renamed, carries the change
    packed = _profile(("fused_conv2d_add_relu_prepacked", 0.0009), ("fused_conv2d1_add", 0.0004), ("max_pool2d", 0.0001))
    unpacked = kernel_diff(packed, before)
    assert unpacked.moves[0].name == "fused_conv2d_add_relu_prepacked → fused_conv2d_add_relu"
    assert round(unpacked.moves[0].share, 6) == 1.0 and not unpacked.appeared and not unpacked.disappeared
    # another fusion: the conv's epilogue split off, the pool gone into it: kernels appear and disappear
    refused = _profile(("fused_conv2d_add_relu", 0.00106), ("fused_conv2d1_add", 0.0004), ("add7", 0.0002))
    moved = kernel_diff(before, refused)
    assert moved.appeared == ("add7",) and moved.disappeared == ("max_pool2d",) and "matched by name" in moved.note
    # another library altogether: no kernel name in common, compared by op class, and it says so
    other = _profile(("conv2d_nchw", 0.0012), ("conv2d_nchw1", 0.0005), ("pool_max", 0.0001))
    by_class = kernel_diff(before, other)
    assert by_class.by == "op class" and "compared by op class" in by_class.note
    assert {m.name for m in by_class.moves} == {"conv", "pool"} and by_class.moves[0].name == "conv"
    # a session every kernel of which ran the same factor slower (float rounding leaves a leftover of ~1e-20 either
    # way): no kernel stands out, whatever the sign of that leftover
    times = [("conv2d", 3.92e-5), ("conv2d1", 1.3e-4), ("add", 1.7e-5), ("relu", 1.1e-5), ("mean", 2.9e-5),
             ("add1", 3.3e-5)]
    for drift in (1.1, 1.2, 1.3, 1.7):
        alike = kernel_diff(_profile(*times), _profile(*[(n, t * drift) for n, t in times]), same_artifact=True)
        assert alike.headline().startswith(f"every kernel moved alike ({drift - 1:+.0%}"), alike.headline()


def test_farm_compare_names_the_kernels_of_two_profiled_runs_and_says_when_a_run_has_none(inventory_file, farm_env):
    first = _profiled(farm_env, inventory_file, "cpu-a")
    second = _profiled(farm_env, inventory_file, "cpu-a")
    plain = run_farm("--devices", str(inventory_file), "bench", "--device", "cpu-a", "--model", "mlp", "--tvm-only",
                     "--json", env=farm_env)
    done = run_farm("compare", str(first["run_id"]), str(second["run_id"]), "--json", env=farm_env)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    compared = said["kernels"]
    # kernels are named where the samples show a change between two libraries; two runs of one library name none,
    # whatever their samples say (a change between them is the device's or the session's, not a kernel's code)
    assert compared["same_library"] is True and compared["named"] is False
    assert compared["by"] == "kernel" and compared["note"] == "" and not compared["appeared"]  # one library
    assert {m["name"] for m in compared["moves"]} == {k["name"] for k in first["profile"]["kernels"]
                                                      if k["op_class"] != "vm"}
    assert round(sum(m["share"] for m in compared["moves"]) * compared["change_s"], 12) == \
        round(sum(m["delta_s"] for m in compared["moves"]), 12)
    text = run_farm("compare", str(first["run_id"]), str(second["run_id"]), env=farm_env).stdout
    assert "kernels: none named: " in text and "of the change" in text
    unprofiled = json.loads(plain.stdout)["run_id"]
    done = run_farm("compare", str(first["run_id"]), str(unprofiled), "--json", env=farm_env)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["kernels"] == {"status": "not available",
                               "reason": f"run {unprofiled} has no profile (bench it with --profile)"}


def test_onnxruntime_s_own_profile_is_stored_beside_tvm_s_by_the_same_op_classes(inventory_file, farm_env):
    """On a host device the reference runtime is profiled too, by its own profiler, on the same threads and inputs:
    its nodes grouped by the op classes TVM's kernels are, and the text sets the classes side by side."""
    done = run_farm("--devices", str(inventory_file), "bench", "--device", "cpu-a", "--model", "convnet", "--profile",
                    env=farm_env)
    assert done.returncode == 0, done.stderr
    assert "beside onnxruntime's own profile (same threads and inputs; by op class): conv: TVM " in done.stdout
    listed = json.loads(run_farm("results", "--json", env=farm_env).stdout)
    ours, theirs = (next(r for r in listed if r["runtime"] == runtime) for runtime in ("tvm", "onnxruntime"))
    assert theirs["threads"] == ours["threads"]  # the reference's terms: TVM's reported threads
    assert theirs["profile"]["status"] == "ok" and theirs["profile"]["clock"].startswith("onnxruntime's own profiler")
    # convnet: two Conv, a MaxPool, a GlobalAveragePool and a Gemm in either runtime
    assert {"conv", "pool", "matmul/dense"} <= set(theirs["profile"]["by_class_s"]) & set(ours["profile"]["by_class_s"])
    nodes = json.loads(run_farm("results", "--kernels", "--json", env=farm_env).stdout)
    convs = [k for k in nodes if k["runtime"] == "onnxruntime" and k["op_class"] == "conv"]
    assert sorted(k["args"][1] for k in convs) == ["float32[16, 3, 3, 3]", "float32[32, 16, 3, 3]"], convs


def test_the_report_draws_where_a_profiled_cell_s_time_goes(inventory_file, farm_env, tmp_path):
    """The report's "Where the time goes: kernels": a profiled cell's figure (TVM beside onnxruntime by op class),
    its op classes and its top kernels with share, GFLOP/s and schedule, opened in a real Chromium."""
    from tests.test_report import needs_chromium, open_in_chromium

    done = run_farm("--devices", str(inventory_file), "bench", "--device", "cpu-a", "--model", "convnet", "--profile",
                    "--json", env=farm_env)
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    html = tmp_path / "report.html"
    assert run_farm("report", "--out", str(html), env=farm_env).returncode == 0
    page = html.read_text()
    from farm.views.dashboard import collect_state
    from farm.inventory import load_inventory

    latest = collect_state(load_inventory(inventory_file), farm_env["FARM_DB"])["profiles"]  # the dashboard's
    assert [(p["run"], p["model"], p["runtime"]) for p in latest[:2]] == [(run_id + 1, "convnet", "onnxruntime"),
                                                                       (run_id, "convnet", "tvm")]
    assert latest[1]["by op class"].startswith("conv ") and latest[1]["top kernels"].count(" · ") == 2
    assert f'id="kernels-{run_id}"' in page and "time by op class for cpu-a · convnet" in page
    if needs_chromium.args[0]:  # no Chromium here: the HTML's own content is checked above
        return
    text, errors, images = open_in_chromium(html)
    assert errors == [] and images and all(width > 0 for width in images)
    section = text.split("Where the time goes: kernels", 1)[1].split("Phases per cell", 1)[0]
    assert "cpu-a · convnet" in section and "TVM / reference" in section and "GFLOP/s" in section
    assert "conv" in section and "untuned" in section


def test_a_sweep_file_profiles_the_cells_of_the_models_it_names(inventory_file, farm_env, tmp_path):
    """profile = ["convnet"] in a sweep file: convnet's cells are profiled, mlp's are not; each profile is stored
    with its run; a wrong value is one error naming the key, before any work."""
    nightly = tmp_path / "nightly.toml"
    nightly.write_text('devices = ["cpu-a"]\nmodels = ["mlp", "convnet"]\nreference = "none"\nprofile = ["convnet"]\n'
                       "[bench]\nrepeat = 3\n")
    done = run_farm("--devices", str(inventory_file), "sweep", "--file", str(nightly), "--tvm-only", "--no-report",
                    "--json", env=farm_env)
    assert done.returncode == 0, done.stderr
    listed = {r["model"]: r for r in json.loads(run_farm("results", "--json", env=farm_env).stdout)}
    assert listed["convnet"]["profile"]["status"] == "ok" and listed["mlp"]["profile"] is None
    assert "conv" in listed["convnet"]["profile"]["by_class_s"]
    nightly.write_text('devices = ["cpu-a"]\nprofile = "yes"\n')
    wrong = run_farm("--devices", str(inventory_file), "sweep", "--file", str(nightly), env=farm_env)
    assert wrong.returncode != 0 and wrong.stderr.startswith(f"error: {nightly}: profile must be true, false or a list")


def test_the_profile_takes_a_share_of_the_cell_and_one_counted_run_for_a_slow_model():
    """A sweep's default profile: at most a second's worth at the steady median (farm's median: numpy's) and
    PROFILE_SHARE of the cell so far, after one run not counted, up to 10 runs; a model of which not two runs fit: its
    first run, counted (0). A profile asked for: about a second's worth, 3 to 10 runs."""
    from farm.measure.profile import ONE_COUNTED_RUN, PROFILE_SHARE, profile_runs

    assert PROFILE_SHARE == 0.06 and ONE_COUNTED_RUN == 0
    assert profile_runs(()) == 10 and profile_runs([0.001] * 5) == 10  # no samples; a fast model
    assert profile_runs([0.2, 0.25, 0.3]) == 4 and profile_runs([0.2, 0.3]) == 4  # asked for: 1 s / 0.25 s
    assert profile_runs([4.82]) == 3  # asked for: an untuned resnet50, the floor
    assert profile_runs([0.2, 0.25, 0.3], cell_s=100.0) == 3  # a sweep's: 1 s / 0.25 s, less the one not counted
    assert profile_runs([0.0274], cell_s=3.1) == 5  # the stand-in phone's convnet: 0.186 s / 27.4 ms, less one
    assert profile_runs([0.335], cell_s=11.0) == 0  # squeezenet: 0.66 s is under two runs
    assert profile_runs([4.82], cell_s=69.0) == 0  # an untuned resnet50: 4.1 s, not one run: the first, counted


def test_a_cell_whose_one_run_is_over_its_share_is_not_profiled_and_says_why():
    from farm.measure.profile import PROFILE_MAX_SHARE, skipped

    assert PROFILE_MAX_SHARE == 0.10 and skipped([4.82], 69.0) is None and skipped((), 1.0) is None
    too_slow = skipped([4.82], 29.0)  # resnet50 at 3 repeats: one run is 17 % of the cell
    assert too_slow is not None and too_slow.status == "not available"
    assert too_slow.reason.startswith("not profiled: one run (4.82 s) is over 10% of the cell's device time (29 s)")


def _as_profile(said: dict):
    from farm.records import KernelProfile, KernelTime

    return KernelProfile(said["status"], said["reason"], said["clock"], said["runs"], said["main_s"], tuple(
        KernelTime(k["name"], k["op_class"], k["calls"], k["time_s"]) for k in said["kernels"]))


@pytest.fixture(scope="module")
def mobile_profile(farm_net, tmp_path_factory):
    """A real profile of mobile-block (its time spread over nine kernels) on cpu-a."""
    from tests.conftest import farm_workspace

    inventory, env = farm_workspace(farm_net, tmp_path_factory.mktemp("drift"))
    done = run_farm("--devices", str(inventory), "bench", "--device", "cpu-a", "--model", "mobile-block", "--profile",
                    "--tvm-only", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return _as_profile(json.loads(done.stdout)["profile"])


@pytest.mark.parametrize("drift", [1.10, 1.20, 1.30])
def test_a_planted_kernel_keeps_its_share_when_the_whole_session_drifted(mobile_profile, drift):
    """A night whose session ran a uniform ``drift`` slower on every kernel (the device's clock, a neighbour's load)
    than its baseline's, on a real profile's kernels, with the kernel nearest 15 % of the time planted 3× slower on
    top (a lost tuning record): the plant is named first with >= 80 % of the change beyond the common shift, which the
    headline states; its plain share (its change over the whole change) is at least 10 points less. A night that
    only drifted names no kernel."""
    from farm.analysis.kernel_diff import kernel_diff
    from farm.records import KernelTime

    before = mobile_profile
    total = before.kernel_sum_s
    planted = min((k for k in before.kernels if k.op_class != "vm"), key=lambda k: abs(k.time_s / total - 0.15))
    night = replace(before, kernels=tuple(
        KernelTime(k.name, k.op_class, k.calls, k.time_s * drift * (3.0 if k.name == planted.name else 1.0))
        for k in before.kernels))
    diff = kernel_diff(before, night, same_artifact=True)
    assert len([k for k in before.kernels if k.op_class != "vm"]) >= 5
    assert diff.moves[0].name == planted.name and diff.moves[0].share >= 0.80, diff.to_json()
    assert round(diff.common, 9) == drift and f"beyond every kernel's {drift - 1:+.0%}" in diff.headline()
    diluted = (diff.moves[0].new_s - diff.moves[0].old_s) / diff.change_s
    assert diluted <= diff.moves[0].share - 0.1, (diluted, diff.to_json())  # the old rule: diluted by the drift
    alike = kernel_diff(before, replace(before, kernels=tuple(
        KernelTime(k.name, k.op_class, k.calls, k.time_s * drift) for k in before.kernels)), same_artifact=True)
    assert alike.headline().startswith(f"every kernel moved alike ({drift - 1:+.0%}"), alike.headline()