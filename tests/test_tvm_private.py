"""TVM's private names farm relies on (farm/tvm_private.py), each checked against the installed TVM: after an
upgrade that moves one, the test names it, instead of a tuning session failing in a worker process."""

import importlib.util
import json
import inspect
import struct
import os
from pathlib import Path

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import RPCConfig, RPCRunner, RunnerInput

from farm.tvm_private import (RUNNER_ARGS, WITHOUT_TORCH_ENV, artifact_path, build_in_worker, measure_in_worker,
                               outer_object, rpc_serving, runner_args)


def _parameters(func) -> tuple[str, ...]:
    return tuple(inspect.signature(func).parameters)


def _env_without_farm_s_hook() -> dict[str, str]:
    """This process's environment without WITHOUT_TORCH_ENV (conftest ran farm's hook, as farm's main does), for a
    child that must import TVM as any other process would."""
    return {k: v for k, v in os.environ.items() if k != WITHOUT_TORCH_ENV}


def test_the_rpc_server_serves_each_session_through_one_replaceable_function():
    import tvm.rpc.server

    assert rpc_serving() is tvm.rpc.server._serving
    assert _parameters(rpc_serving()) == ("sock", "addr", "opts", "load_library")
    assert "_serving(" in inspect.getsource(tvm.rpc.server._listen_loop)  # looked up at each session: replaceable


def test_the_rpc_server_s_worker_function_starts_its_listen_loop_in_a_thread_of_the_calling_process():
    import tvm.rpc.server

    start = tvm.rpc.server._popen_start_rpc_server
    assert _parameters(start)[:3] == ("host", "port", "port_end")
    assert {"tracker_addr", "key", "server_init_callback"} <= set(_parameters(start))
    assert "PopenRPCServerState.current = state" in inspect.getsource(start)
    assert "self.thread = threading.Thread(" in inspect.getsource(tvm.rpc.server.PopenRPCServerState.__init__)


def test_the_builder_worker_takes_build_export_module_target_params():
    assert _parameters(build_in_worker) == ("_f_build", "_f_export", "mod", "target", "params")


def test_the_runner_worker_takes_its_arguments_in_farm_s_order_the_library_9th():
    assert _parameters(measure_in_worker) == RUNNER_ARGS
    assert RUNNER_ARGS.index("artifact_path") == 8  # args[8], as AfterBuildRunner's workers read it


def test_runner_args_are_rpc_runner_s_own_with_the_candidate_s_library_where_the_worker_reads_it():
    rpc = RPCRunner(RPCConfig("127.0.0.1", 9, "nobody"), max_workers=1)
    try:
        args = runner_args(rpc, RunnerInput("/tmp/candidate.so", "cpu", []))
    finally:
        rpc.pool.shutdown(wait=False)
    assert len(args) == len(RUNNER_ARGS)
    named = dict(zip(RUNNER_ARGS, args))
    assert named["rpc_config"] is rpc.rpc_config and named["evaluator_config"] is rpc.evaluator_config
    assert named["alloc_repeat"] == rpc.alloc_repeat and named["_f_create_session"] is rpc.f_create_session
    assert artifact_path(args) == "/tmp/candidate.so" and named["device_type"] == "cpu" and named["args_info"] == ()


def test_a_derived_object_reaches_the_tvm_object_wrapped_around_it():
    @derived_object
    class Scheduler(ms.task_scheduler.PyTaskScheduler):
        def outer(self):
            return outer_object(self)

        def next_task_id(self) -> int:
            return -1

    wrapped = Scheduler()
    assert wrapped.outer() is wrapped
    assert hasattr(wrapped, "tasks_") and callable(wrapped.touch_task)  # what PassScheduler asks of it


def test_the_runner_checks_its_functions_in_a_method_farm_s_subclass_leaves_out():
    from farm.tvm_private import unchecked

    assert "_sanity_check" in vars(RPCRunner._cls)  # what unchecked() replaces; gone after an upgrade: this fails
    assert "self._sanity_check()" in inspect.getsource(RPCRunner._cls.__init__)  # called by the constructor
    rpc = unchecked(RPCRunner)(RPCConfig("127.0.0.1", 9, "nobody"), max_workers=1)
    try:
        assert rpc.rpc_config.tracker_key == "nobody"  # built as RPCRunner is, its check left out
        assert type(rpc._inst)._sanity_check is not RPCRunner._cls._sanity_check and isinstance(rpc._inst, RPCRunner._cls)
    finally:
        rpc.pool.shutdown(wait=False)
    assert unchecked(RPCRunner) is unchecked(RPCRunner)  # one class per wrapped class


def test_tensor_intrinsics_package_only_imports_so_a_cpu_can_register_its_architecture_s_alone():
    import subprocess
    import sys

    from farm.tvm_private import CPU_INTRINSICS, INTRINSICS_PACKAGE, intrinsics_package_only_imports

    assert intrinsics_package_only_imports()
    package = Path(importlib.util.find_spec(INTRINSICS_PACKAGE).origin).parent  # found, not imported (~40 s)
    for module in set(CPU_INTRINSICS.values()):
        assert (package / f"{module}.py").is_file(), module
    # in a fresh process: x86's only, then (a GPU target after it) every module, CUDA's too
    script = (
        "import sys\nfrom tvm.s_tir import TensorIntrin\nfrom farm.tune.metaschedule import load_tensor_intrinsics\n"
        "load_tensor_intrinsics({'kind': 'llvm', 'mtriple': 'x86_64-linux-gnu'})\n"
        "print(sorted(m.rsplit('.', 1)[-1] for m in sys.modules if m.startswith('tvm.s_tir.tensor_intrin.')))\n"
        "print(TensorIntrin.get('dot_16x4_avx512', allow_missing=True) is not None)\n"
        "load_tensor_intrinsics({'kind': 'opencl'})\n"
        "print(TensorIntrin.get('mma_ldmatrix_f16_a', allow_missing=True) is not None)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "['x86']" and out[1] == "True", out
    assert out[2] == "True", out  # CUDA's, registered once a target needed them all



def test_tvm_imports_torch_when_installed_and_farm_s_processes_import_it_without_then_torch_still_works():
    import subprocess
    import sys

    probe = "import sys, tvm, tvm.relax\nprint('torch' in sys.modules)\n"
    env = _env_without_farm_s_hook()
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env).stdout
    assert plain.split() == ["True"]  # what the hook is for; False after an upgrade: the hook can go
    hooked = subprocess.run([sys.executable, "-c", (
        "from farm.tvm_private import import_tvm_without_torch\nimport_tvm_without_torch()\n" + probe +
        "import torch\nimport tvm\nprint(tvm.runtime.from_dlpack(torch.arange(3.0)).numpy().tolist())\n")],
        capture_output=True, text=True, check=True, env=env).stdout
    assert hooked.split("\n")[:2] == ["False", "[0.0, 1.0, 2.0]"], hooked  # torch imports afterwards, and reaches TVM


def test_farm_s_quick_import_of_tvm_registers_every_function_a_plain_import_does_and_leaves_the_collector_on():
    """quick_registration lists TVM's global functions again only when their count changes: each ``_ffi_api``
    module must still get every function a plain import gives it (one missed would fail in a compile, not here)."""
    import subprocess
    import sys

    probe = ("import gc, sys, json, tvm, tvm.relax, tvm.s_tir.meta_schedule, tvm.rpc\n"
             "names = {m: sorted(n for n in vars(mod) if not n.startswith('_')) for m, mod in list(sys.modules.items())"
             " if m.startswith('tvm') and m.rsplit('.', 1)[-1].startswith('_ffi')}\n"
             "print(json.dumps([names, gc.isenabled(), gc.get_freeze_count()]))\n")
    env = _env_without_farm_s_hook()
    plain = json.loads(subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None\n" + probe],
                                      capture_output=True, text=True, check=True, env=env).stdout)
    quick = json.loads(subprocess.run([sys.executable, "-c", (
        "from farm.tvm_private import import_tvm_without_torch\nimport_tvm_without_torch()\n" + probe)],
        capture_output=True, text=True, check=True, env=env).stdout)
    assert len(plain[0]) >= 40 and sum(map(len, plain[0].values())) >= 1500, plain[0].keys()  # what is compared
    assert quick[0] == plain[0]
    assert (plain[1], plain[2]) == (True, 0) and quick[1] is True and quick[2] > 100_000, (plain[1:], quick[1:])
    # a function registered while it lists (as a module of TVM's may, between two _ffi_api modules) is listed too
    import types

    import tvm_ffi

    from farm.tvm_private import quick_registration

    with quick_registration():
        first, second = types.ModuleType("farm_quick_first"), types.ModuleType("farm_quick_second")
        sys.modules.update({"farm_quick_first": first, "farm_quick_second": second})
        tvm_ffi.register_global_func("farm_quick_first.one", lambda: 1, override=True)
        tvm_ffi.init_ffi_api("farm_quick_first", "farm_quick_first")
        tvm_ffi.register_global_func("farm_quick_second.two", lambda: 2, override=True)
        tvm_ffi.init_ffi_api("farm_quick_second", "farm_quick_second")
    assert (first.one(), second.two()) == (1, 2)
    for name in ("farm_quick_first", "farm_quick_second"):
        del sys.modules[name]


def test_tvm_s_own_worker_processes_started_by_a_farm_process_import_tvm_without_torch():
    """TVM starts its popen workers itself (MetaSchedule's builders and runners): STARTUP_PTH, which tools/setup.sh
    writes into site-packages, hooks them when a farm process started them, and leaves every other process alone."""
    import subprocess
    import sys

    script = ("import sys\n{hook}from tvm.support.popen_pool import PopenPoolExecutor\n"
              "def probe():\n    import sys, tvm, tvm.relax\n    return 'torch' in sys.modules\n"
              "print(PopenPoolExecutor(max_workers=1).submit(probe).result())\n")
    hook = "from farm.tvm_private import import_tvm_without_torch\nimport_tvm_without_torch()\n"
    env = _env_without_farm_s_hook()
    farm_started = subprocess.run([sys.executable, "-c", script.format(hook=hook)], capture_output=True, text=True,
                                  check=True, env=env).stdout
    other = subprocess.run([sys.executable, "-c", script.format(hook="")], capture_output=True, text=True,
                           check=True, env=env).stdout
    assert (farm_started.split(), other.split()) == (["False"], ["True"]), (farm_started, other)


def test_normalize_mod_is_metaschedule_s_own_global_and_gives_a_module_back():
    import tvm
    from tvm.script import tirx as T

    from farm.tvm_private import normalize_mod

    @T.prim_func
    def add_one(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in range(4):
            b[i] = a[i] + T.float32(1)

    normalized = normalize_mod(add_one)
    assert isinstance(normalized, tvm.IRModule) and len(normalized.functions) == 1
    assert tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod", True) is not None


def test_an_xgb_model_keeps_its_training_state_in_the_attributes_farm_saves():
    from farm.tune.costmodel import new_cost_model
    from farm.tvm_private import XGBState, set_xgb_state, xgb_state

    model = new_cost_model(1)
    fresh = xgb_state(model)  # before any training: no data, no booster
    assert (len(fresh.data), fresh.data_size, fresh.last_train_size, fresh.booster) == (0, 0, 0, None)
    set_xgb_state(model, XGBState({"h": "group"}, 3, 2, None))
    assert (model.data, model.data_size, model.last_train_size) == ({"h": "group"}, 3, 2)


def test_a_runner_future_reads_its_worker_s_result_and_a_runner_s_pool_stops():
    from concurrent.futures import Future

    from farm.tvm_private import runner_future, stop_runner_pool

    done: Future = Future()
    done.set_result([0.5, 0.25])
    assert [float(s) for s in runner_future(done, 10.0).result().run_secs] == [0.5, 0.25]
    rpc = RPCRunner(RPCConfig("127.0.0.1", 9, "nobody"), max_workers=1)
    stop_runner_pool(rpc)
    assert rpc.pool._shutdown  # TVM's PopenPoolExecutor: stopped, not waited for


def test_a_pseudo_file_frame_has_no_module_while_intrinsics_load_and_inspect_is_itself_after():
    import sys

    from farm.tvm_private import pseudo_files_have_no_module

    real = inspect.getmodule
    frame = sys._getframe()
    with pseudo_files_have_no_module():
        assert inspect.getmodule(frame, "<frozen importlib._bootstrap>") is None
        assert inspect.getmodule(frame, __file__) is sys.modules[__name__]
    assert inspect.getmodule is real


CUDA_ROUND_TRIP = """
import json, os, sys, tempfile
import tvm, tvm_ffi
from farm.compile.frontends import import_model
from farm.models import load_model
from farm.tvm_private import _take, cuda_sources, pack_imports_with_cubin

target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"}, host={"kind": "llvm"})
executable = tvm.compile(import_model(load_model("mlp")), target)
sources = cuda_sources(executable.mod)
path = os.path.join(tempfile.mkdtemp(), "mlp.so")
executable.export_library(path, fpack_imports=pack_imports_with_cubin(lambda s: b"CUBIN:%d" % len(s), b"note"))
seen = []
def load(data):  # stands in for libtvm_runtime_cuda.so's loader, which TVM's deserializer calls by this name
    seen.append(bytes(data))
    return tvm_ffi.system_lib()
tvm_ffi.register_global_func("ffi.Module.load_from_bytes.cuda", load, override=True)
tvm.runtime.load_module(path)
fmt, at = _take(seen[0], 0)
print(json.dumps({"modules": len(seen), "sources": len(sources), "fmt": fmt.decode(),
                  "tail": seen[0][-20:].hex(), "source_bytes": len(sources[0].encode())}))
"""


def test_cuda_modules_packed_as_cubins_reach_tvm_s_own_loader_as_cubin_with_their_function_table():
    """TVM's deserializer (DeserializeModuleFromBytes) hands the "cuda" loader the bytes pack_imports_with_cubin
    wrote: format "cubin", then the function table as TVM wrote it, then the compiled code, in place of the source.
    In a process of its own: the stand-in loader is a global registration."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", CUDA_ROUND_TRIP], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert (said["modules"], said["sources"], said["fmt"]) == (1, 1, "cubin")
    code = b"CUBIN:%d" % said["source_bytes"]
    assert bytes.fromhex(said["tail"]).endswith(struct.pack("<Q", len(code)) + code)


def test_a_cuda_module_whose_bytes_do_not_end_in_its_source_is_refused_as_a_moved_format():
    import pytest

    from farm.tvm_private import rewrite_cuda_code

    def string(data: bytes) -> bytes:
        return struct.pack("<Q", len(data)) + data

    tree = struct.pack("<Q", 2) + struct.pack("<2Q", 0, 0) + struct.pack("<Q", 0)  # one module, no imports
    good = tree + string(b"cuda") + string(string(b"cuda") + b"FMAP" + string(b"__global__ k"))
    blob, replaced = rewrite_cuda_code(struct.pack("<Q", len(good)) + good, ["__global__ k"], lambda s: b"BIN")
    assert replaced == 1 and blob.endswith(string(string(b"cubin") + b"FMAP" + string(b"BIN")))
    moved = tree + string(b"cuda") + string(string(b"cuda") + string(b"__global__ k") + b"FMAP")
    with pytest.raises(ValueError, match="SaveToBytes has changed"):
        rewrite_cuda_code(struct.pack("<Q", len(moved)) + moved, ["__global__ k"], lambda s: b"BIN")


def test_the_runtime_only_environment_loads_tvm_s_runtime_and_never_its_compiler():
    """What the GPU kit's hosts run with (tools/gpu_check.sh): TVM reads the variable when it loads its libraries."""
    import json
    import subprocess
    import sys

    from farm.tvm_private import runtime_only_env

    probe = "import json, tvm.base as b; print(json.dumps([b._RUNTIME_ONLY, sorted(b._LOADED_LIBS)]))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **runtime_only_env()})
    assert done.returncode == 0, done.stderr[-1000:]
    runtime_only, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert runtime_only is True and "tvm_runtime" in loaded and "tvm_compiler" not in loaded
