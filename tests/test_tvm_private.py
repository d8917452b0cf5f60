"""TVM's private names farm relies on (farm/tvm_private.py), each checked against the installed TVM: after an
upgrade that moves one, the test names it, instead of a tuning session failing in a worker process."""

import inspect

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import RPCConfig, RPCRunner, RunnerInput

from farm.tvm_private import (RUNNER_ARGS, artifact_path, build_in_worker, measure_in_worker, outer_object, rpc_serving,
                               runner_args)


def _parameters(func) -> tuple[str, ...]:
    return tuple(inspect.signature(func).parameters)


def test_the_rpc_server_serves_each_session_through_one_replaceable_function():
    import tvm.rpc.server

    assert rpc_serving() is tvm.rpc.server._serving
    assert _parameters(rpc_serving()) == ("sock", "addr", "opts", "load_library")
    assert "_serving(" in inspect.getsource(tvm.rpc.server._listen_loop)  # looked up at each session: replaceable


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
