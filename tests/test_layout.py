"""A tuned compile's convolutions in NHWC (records.LAYOUT_RULE): the setting, the keys that keep its records apart,
and a tuned artifact whose convolutions run channels-last while its inputs and outputs keep the model's layout and
still match the reference runtime."""

import json
import logging

import pytest

from farm.inventory import parse_inventory
from farm.records import layout_setting
from tests.conftest import TEST_POPULATION, TEST_THREADS, assert_records_kept_apart, run_farm, settings_inventory

DEVICES = settings_inventory('layout = "model"', on="nhwc", off="model")  # NHWC: the default on llvm


def test_the_layout_is_the_model_s_unless_set_and_its_records_are_kept_apart(tmp_path, caplog):
    from farm.compile import artifact_key, device_tuning_key, effective_target, fallback_device, tuning_key
    from farm.errors import FarmError, InventoryError
    from farm.models import load_model
    from farm.store import Store
    from farm.tune.packs import export_database, import_database

    devices = parse_inventory(DEVICES).devices
    nhwc, model, gpu = devices["nhwc"], devices["model"], devices["gpu"]
    # NHWC by default on llvm targets (a GPU's CPU fallback included), the model's own elsewhere
    assert [layout_setting(d) for d in (model, nhwc, gpu, fallback_device(gpu))] == ["model", "NHWC", "model", "NHWC"]
    with pytest.raises(InventoryError, match="layout 'NCHWc' is not one of 'model', 'NHWC'"):
        parse_inventory(DEVICES.replace('layout = "model"', 'layout = "NCHWc"'))
    # the model's own layout keeps the key records had before the setting; NHWC: other workloads, another key
    target = effective_target(model)
    assert device_tuning_key(model) == tuning_key(target, 2, True) == tuning_key(target, 2, True, layout="model")
    assert device_tuning_key(nhwc) == tuning_key(target, 2, True, layout="NHWC") != device_tuning_key(model)
    convnet = load_model("convnet")
    assert artifact_key(convnet, nhwc, target, "cc", "tuned") != artifact_key(convnet, model, target, "cc", "tuned")
    assert artifact_key(convnet, nhwc, target, "cc") == artifact_key(convnet, model, target, "cc")  # untuned: the same
    with Store(tmp_path / "r.db") as store:  # a pack says its layout, and a device with another refuses it
        export_database(store, model, tmp_path / "pack")
        assert json.loads((tmp_path / "pack" / "farm-pack.json").read_text())["layout"] == "model"
        with pytest.raises(FarmError, match="was tuned with layout 'model', 'nhwc' has 'NHWC'"):
            import_database(store, nhwc, tmp_path / "pack")
        assert import_database(store, model, tmp_path / "pack") == 0
        assert_records_kept_apart(store, model, nhwc, caplog, "model's own layout",
                                  'layout = "model" in devices.toml uses them')


def test_an_nhwc_tuned_artifact_converts_its_convolutions_and_still_matches_the_reference(
        farm_net, tmp_path, farm_env):
    """convnet's weights are seeded random values and it has two outputs, one of them a conv's NCHW features: its
    output check fails if a layout is wrong. Two trials of its second conv (--no-profile: no untuned record
    competes), so one conv is tuned in NHWC; the model's input and outputs keep their layout (a transpose at each
    end, which the model-layout device's tuned compile does not have)."""
    from farm.compile import main_calls

    inventory = tmp_path / "devices.toml"
    inventory.write_text(farm_net.inventory_text(  # cpu-a: NHWC, the default on llvm
        f'\n[devices.cpu-model]\nkind = "local"\nkey = "test-a"\ntarget = {{ kind = "llvm" }}\nthreads = {TEST_THREADS}\n'
        f'search_population = {TEST_POPULATION}\nlayout = "model"\n'))
    base = ("--devices", str(inventory))
    for device in ("cpu-a", "cpu-model"):
        tuned = run_farm(*base, "tune", "--device", device, "--model", "convnet", "--tasks", "conv2d1", "--no-profile",
                         "--trials", "2", "--json", env=farm_env)
        assert tuned.returncode == 0, tuned.stderr
        assert json.loads(tuned.stdout)["status"] == "done"
    calls = {}
    for device in ("cpu-a", "cpu-model"):
        artifact = json.loads(run_farm(*base, "compile", "--device", device, "--model", "convnet", "--json",
                                       env=farm_env).stdout)[0]
        assert artifact["tuned_tasks"] >= 1, artifact
        calls[device] = main_calls(artifact["path"])
        bench = run_farm(*base, "bench", "--device", device, "--model", "convnet", "--repeat", "3", "--min-repeat-ms",
                         "5", "--json", env=farm_env)
        assert bench.returncode == 0, bench.stderr
        result = json.loads(bench.stdout)
        assert result["tuned_tasks"] == artifact["tuned_tasks"] and result["check"]["status"] == "passed", result
    assert [c for c in calls["cpu-a"] if "transpose" in c], calls["cpu-a"]
    assert not [c for c in calls["cpu-model"] if "transpose" in c], calls["cpu-model"]


def test_a_convolution_s_leakyrelu_epilogue_follows_it_into_nhwc(tmp_path):
    """TVM 0.27 gives LeakyRelu no layout rule: without farm's, ConvertLayout puts a transpose on each side of every
    one. convnet with LeakyRelu for Relu converts with exactly convnet's transposes (one at the input, one at each
    output), and its LeakyRelus run on NHWC tensors, alpha kept."""
    import re

    from farm.compile import channels_last, import_model
    from farm.models import load_model
    from farm.models.zoo import leaky_variant

    def main_text(spec: str) -> str:
        return channels_last(import_model(load_model(spec)), spec)["main"].script(show_meta=False)

    relu, leaky = main_text("convnet"), main_text(str(leaky_variant("convnet", tmp_path)))
    assert relu.count("R.permute_dims(") == leaky.count("R.permute_dims(") == 3, relu
    leaky_lines = [line for line in leaky.splitlines() if "R.nn.leakyrelu(" in line]
    assert len(leaky_lines) == 2 and all(re.search(r"\(1, \d+, \d+, (16|32)\)", line) for line in leaky_lines), leaky_lines
    assert all("alpha=0.01" in line for line in leaky_lines), leaky_lines


def test_a_model_nhwc_would_fill_with_transposes_keeps_its_own_layout(caplog):
    """Two convs with a Relu6 (clip, which TVM 0.27 gives no layout rule) between them: converted, the clip would sit
    between two transposes, copies where NHWC should save time, so the model keeps its layout, with a warning."""
    import numpy as np
    from tvm import relax
    from tvm.script import ir as I
    from tvm.script import relax as R

    from farm.compile import channels_last

    @I.ir_module
    class TwoConvs:
        @R.function
        def main(x: R.Tensor((1, 16, 8, 8), "float32")):
            with R.dataflow():
                w = R.const(np.ones((16, 16, 3, 3), "float32"))
                c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
                six = R.clip(c, R.prim_value(0), R.prim_value(6))
                o = R.nn.conv2d(six, w, padding=[1, 1, 1, 1])
                R.output(o)
            return o

    converted = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"]})(TwoConvs)
    assert converted["main"].script(show_meta=False).count("R.permute_dims(") > 2  # what the guard is for
    with caplog.at_level(logging.WARNING, logger="farm.compile"):
        kept = channels_last(TwoConvs, "two-convs")
    assert "R.permute_dims(" not in kept["main"].script(show_meta=False)
    assert "R.nn.conv2d(" in kept["main"].script(show_meta=False) and 'data_layout="NHWC"' not in kept.script()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("two-convs: ")]
    assert len(said) == 1 and "left 2 transposes inside it" in said[0], said


def onnx_file_model(folder, name: str, nodes: list, x_shape: list[int], y_shape: list[int], initializers: list):
    """A float32 ONNX graph ``x`` → ``y`` of ``nodes``, saved in ``folder`` and loaded as farm loads a model file."""
    import onnx
    from onnx import helper

    from farm.models import load_model

    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, y_shape)], initializers)
    path = folder / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return load_model(str(path))


def assert_matches_reference(mod, model, x) -> None:
    """``mod`` compiled for this CPU gives onnxruntime's output for ``model`` on ``x``, to 1e-4."""
    import numpy as np
    import tvm
    from tvm import relax

    from farm.models import reference_outputs

    vm = relax.VirtualMachine(tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), reference_outputs(model, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)


def test_an_onnx_sum_of_two_branches_converts_to_nhwc_and_still_matches_the_reference(tmp_path):
    """ONNX's Sum (resnet50's residual adds) imports as a 5-D stack and sum, each term broadcast to its own shape:
    ops ConvertLayout has no rule for, so resnet50 kept its layout. A conv block with a residual Sum now converts with
    one transpose at each end, and the compiled NHWC module's output matches onnxruntime's."""
    import numpy as np
    from onnx import helper, numpy_helper

    from farm.compile import channels_last, import_model

    rng = np.random.default_rng(7)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype("float32") * 0.2, f"w{i}")
               for i in (0, 1, 2)]
    model = onnx_file_model(tmp_path, "residual", [  # a stem conv, then a residual block: two convs and their input summed
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Sum", ["c2", "r0"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
        [1, 8, 10, 10], [1, 8, 10, 10], weights)
    imported = import_model(model)
    assert "R.stack(" in imported["main"].script(show_meta=False)  # what the rewrite is for
    converted = channels_last(imported, "residual")
    text = converted["main"].script(show_meta=False)
    assert text.count("R.permute_dims(") == 2 and "R.stack(" not in text and 'data_layout="NHWC"' in text, text
    assert_matches_reference(converted, model, rng.standard_normal((1, 8, 10, 10)).astype("float32"))


def test_a_batch_norm_after_a_convolution_is_folded_into_its_weights_and_still_matches_the_reference(tmp_path):
    """A BatchNormalization after a Conv (resnet50's 53) is folded into the conv's weights and a bias at import, as
    onnxruntime folds it: no divide is left for that one in the module, so none lands in the tuned kernel's epilogue.
    One after a conv with a bias (an add between them) is decomposed as before. Compiled in the model's layout and in
    NHWC, the output matches onnxruntime's."""
    import numpy as np
    from onnx import helper, numpy_helper
    from tvm import relax

    from farm.compile import channels_last, import_model
    from farm.models import make_variant

    rng = np.random.default_rng(11)

    def arrays(prefix: str, channels: int) -> list:  # a batch norm's scale, bias, mean and variance: none trivial
        values = (rng.uniform(0.5, 2.0, channels), rng.standard_normal(channels), rng.standard_normal(channels),
                  rng.uniform(0.2, 3.0, channels))
        return [numpy_helper.from_array(v.astype("float32"), f"{prefix}{n}") for n, v in zip("sbmv", values)]

    initializers = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype("float32") * 0.3, "w0"),
                    numpy_helper.from_array(rng.standard_normal((8, 8, 1, 1)).astype("float32") * 0.3, "w1"),
                    numpy_helper.from_array(rng.standard_normal(8).astype("float32"), "b1"),
                    *arrays("n0", 8), *arrays("n1", 8)]
    model = onnx_file_model(tmp_path, "conv_bn", [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c0", "n0s", "n0b", "n0m", "n0v"], ["n0"], epsilon=1e-3),
        helper.make_node("Relu", ["n0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"]),  # with a bias: not the pattern TVM folds
        helper.make_node("BatchNormalization", ["c1", "n1s", "n1b", "n1m", "n1v"], ["y"])],
        [1, 3, 12, 12], [1, 8, 12, 12], initializers)
    imported = import_model(model)
    text = relax.transform.FoldConstant()(imported)["main"].script(show_meta=False)  # the new weights computed
    assert "batch_norm" not in text and text.count("R.divide(") == 1, text  # the second one's, decomposed
    x = rng.standard_normal((1, 3, 12, 12)).astype("float32")
    for mod in (imported, channels_last(imported, "conv_bn")):
        assert_matches_reference(mod, model, x)
    # its fp16 variant keeps its batch norms (TVM's pass adds a float32 epsilon to a float16 variance), decomposed
    half = import_model(make_variant(model, "fp16"))["main"].script(show_meta=False)
    assert "batch_norm" not in half and half.count("R.divide(") == 2, half


def test_a_convolution_with_output_channels_short_of_whole_vectors_is_padded_and_still_matches_the_reference(
        tmp_path):
    """In NHWC a conv's output channels are the axis its kernel vectorizes: squeezenet's last conv (1,000 channels)
    ran at half its other convs' rate. With AVX-512's 16 float32 lanes, a conv with 130 channels (a classifier's,
    with bias, relu and global pool) computes 144, zero weights for the extra 14, sliced off after its relu; one with
    128 is left as it is. The compiled module's outputs match onnxruntime's. A target's lanes come from its CPU."""
    import numpy as np
    import tvm
    from onnx import helper, numpy_helper

    from farm.compile import channels_last, import_model
    from farm.compile.frontends import float32_lanes

    assert [float32_lanes(tvm.target.Target(t)) for t in (
        {"kind": "llvm", "mcpu": "znver5"}, {"kind": "llvm", "mcpu": "haswell"}, {"kind": "llvm", "mcpu": "x86-64"},
        {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, {"kind": "opencl"})] == [16, 8, 4, 4, 0]

    rng = np.random.default_rng(5)

    def classifier(channels: int):  # a conv of 128 channels, then one of ``channels`` with bias, relu, global pool
        initializers = [numpy_helper.from_array(rng.standard_normal((128, 8, 3, 3)).astype("float32") * 0.2, "w0"),
                        numpy_helper.from_array(rng.standard_normal((channels, 128, 1, 1)).astype("float32") * 0.1,
                                                "w1"),
                        numpy_helper.from_array(rng.standard_normal(channels).astype("float32"), "b1")]
        return onnx_file_model(tmp_path, f"classifier{channels}", [
            helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r0"]),
            helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"]), helper.make_node("Relu", ["c1"], ["r1"]),
            helper.make_node("GlobalAveragePool", ["r1"], ["y"])],
            [1, 8, 6, 6], [1, channels, 1, 1], initializers)

    def widths(mod) -> list[str]:  # each conv's output channels, and the slices
        text = mod["main"].script(show_meta=False)
        return [line.split("R.Tensor((1, 6, 6, ")[1].split(")")[0] for line in text.splitlines()
                if "R.nn.conv2d(" in line] + [f"{text.count('R.strided_slice(')} slice(s)"]

    model = classifier(130)
    imported = import_model(model)
    assert widths(channels_last(imported, "classifier")) == ["128", "130", "0 slice(s)"]  # lanes not given
    assert widths(channels_last(imported, "classifier", 8)) == ["128", "136", "1 slice(s)"]
    converted = channels_last(imported, "classifier", 16)
    assert widths(converted) == ["128", "144", "1 slice(s)"]
    assert_matches_reference(converted, model, rng.standard_normal((1, 8, 6, 6)).astype("float32"))

    # 1,000 channels (squeezenet's classifier) come in whole pairs of vectors where that costs little: 1,024 with
    # 16 lanes (2.4 % more work; 1,008 = 16 × 63 left a tuned kernel's register tile one vector wide); with 8 they
    # are whole vectors already and stay 1,000; 130 stays 144 above (160 would be 23 % more)
    wide = classifier(1000)
    assert widths(channels_last(import_model(wide), "classifier1000", 8)) == ["128", "1000", "0 slice(s)"]
    paired = channels_last(import_model(wide), "classifier1000", 16)
    assert widths(paired) == ["128", "1024", "1 slice(s)"]
    assert_matches_reference(paired, wide, rng.standard_normal((1, 8, 6, 6)).astype("float32"))


def test_a_concatenation_alone_is_one_copy_per_input_on_a_cpu_and_still_matches_the_reference(tmp_path):
    """TVM lowers a concatenation to one block choosing every output element by an if_then_else, which no schedule
    vectorizes well: squeezenet's fire modules' concatenations (NHWC, innermost axis) took 2.5x onnxruntime's time.
    On a CPU (lanes given), a function that is a concatenation alone becomes one copy per input into its slice; on
    other targets it is left as TVM lowers it. The compiled module's outputs match onnxruntime's."""
    import numpy as np
    from onnx import helper, numpy_helper
    from tvm.s_tir import Schedule

    from farm.compile.frontends import tuning_module

    rng = np.random.default_rng(7)
    initializers = [numpy_helper.from_array(rng.standard_normal(shape).astype("float32") * 0.2, name)
                    for name, shape in (("ws", (4, 8, 1, 1)), ("w1", (6, 4, 1, 1)), ("w3", (10, 4, 3, 3)))]
    model = onnx_file_model(tmp_path, "fire", [
        helper.make_node("Conv", ["x", "ws"], ["s"]), helper.make_node("Relu", ["s"], ["rs"]),
        helper.make_node("Conv", ["rs", "w1"], ["e1"]), helper.make_node("Relu", ["e1"], ["r1"]),
        helper.make_node("Conv", ["rs", "w3"], ["e3"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["e3"], ["r3"]),
        helper.make_node("Concat", ["r1", "r3"], ["c"], axis=1),
        helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2])],
        [1, 8, 5, 5], [1, 16, 2, 2], initializers)

    def concatenations(mod) -> dict[str, list[str]]:  # each function with "concatenate" in its name: its blocks
        out = {}
        for gv, func in mod.functions.items():
            if "concatenate" in gv.name_hint:
                sch = Schedule(func)
                out[gv.name_hint] = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
        return out

    assert list(concatenations(tuning_module(model, False, "NHWC", 0)).values()) == [["T_concat"]]  # not a CPU
    for layout in ("model", "NHWC"):
        mod = tuning_module(model, False, layout, 16)
        assert list(concatenations(mod).values()) == [["copy_0", "copy_1"]], layout
        assert not [gv for gv, f in mod.functions.items() if "concatenate" in gv.name_hint and "if_then_else" in f.script()]
        assert_matches_reference(mod, model, rng.standard_normal((1, 8, 5, 5)).astype("float32"))
