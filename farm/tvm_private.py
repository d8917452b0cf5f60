"""TVM's private names that farm relies on, each in one place: the file to mend after a TVM upgrade.

Each name here is one TVM may move or change without notice; ``tests/test_tvm_private.py`` checks every one
against the installed TVM (that it exists, and its signature or position), so an upgrade that moves one fails
there, by name, rather than in the middle of a tuning session.

==========================  =====================================================  ===========================
farm's name                 TVM's private name (0.27)                              used by
==========================  =====================================================  ===========================
``build_in_worker``         ``meta_schedule.builder.local_builder._worker_func``   ``tune.metaschedule``
``measure_in_worker``       ``meta_schedule.runner.rpc_runner._worker_func``       ``tune.metaschedule``
``RUNNER_ARGS``             that worker's positional parameters, in order          ``tune.metaschedule``
``artifact_path``           ... its 9th (``args[8]``): the candidate's library     ``tune.metaschedule``
``outer_object``            ``derived_object``'s ``_outer`` weak reference          ``tune.metaschedule``
``rpc_serving``             ``rpc.server._serving`` (one session of the server)    ``rpc.server``
``set_rpc_serving``         ... replaced: the listen loop looks it up per session  ``rpc.server``
==========================  =====================================================  ===========================

MetaSchedule's names load when first used (module ``__getattr__``): the RPC server imports this module too, and
must not import MetaSchedule.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

# build_in_worker: MetaSchedule's builder worker, (f_build, f_export, mod, target, params) -> the exported library's
# path. Run in farm's own pool (AheadBuilder), so a device starts on a candidate as soon as it is built.
# measure_in_worker: MetaSchedule's RPC runner worker (session, upload, alloc, run, clean-up) -> the run seconds, with
# its positional parameters (RUNNER_ARGS): farm's runner (AfterBuildRunner) calls it with RPCRunner's own functions.
_METASCHEDULE = {"build_in_worker": "tvm.s_tir.meta_schedule.builder.local_builder",
                 "measure_in_worker": "tvm.s_tir.meta_schedule.runner.rpc_runner"}


def __getattr__(name: str) -> Any:
    if name in _METASCHEDULE:
        return importlib.import_module(_METASCHEDULE[name])._worker_func  # pylint: disable=protected-access
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def rpc_serving() -> Callable:
    """TVM's rpc server's function that serves one session: ``(sock, addr, opts, load_library)``."""
    from tvm.rpc import server

    return server._serving  # pylint: disable=protected-access


def set_rpc_serving(serving: Callable) -> None:
    """Replace it: ``_listen_loop`` looks ``_serving`` up at each session, so the replacement serves the next one."""
    from tvm.rpc import server

    server._serving = serving  # pylint: disable=protected-access


RUNNER_ARGS = ("_f_create_session", "_f_upload_module", "_f_alloc_argument", "_f_run_evaluator", "_f_cleanup",
               "rpc_config", "evaluator_config", "alloc_repeat", "artifact_path", "device_type", "args_info")


def runner_args(rpc: Any, runner_input: Any) -> tuple:
    """``measure_in_worker``'s arguments for one candidate (``RUNNER_ARGS``), as ``RPCRunner.run`` passes them:
    ``rpc``'s functions and configs, then the candidate's library, device type and argument info."""
    return (rpc.f_create_session, rpc.f_upload_module, rpc.f_alloc_argument, rpc.f_run_evaluator, rpc.f_cleanup,
            rpc.rpc_config, rpc.evaluator_config, rpc.alloc_repeat, str(runner_input.artifact_path),
            str(runner_input.device_type), tuple(arg_info.as_json() for arg_info in runner_input.args_info))


def artifact_path(args: tuple) -> str:
    """The candidate's library among ``measure_in_worker``'s arguments (``RUNNER_ARGS``)."""
    return args[RUNNER_ARGS.index("artifact_path")]


def outer_object(inst: Any) -> Any:
    """The TVM object that ``tvm.ir.utils.derived_object`` wraps around ``inst`` (a ``Py*`` subclass's instance):
    a PyTaskScheduler reaches its own tasks, and joins and ends them, through it."""
    return inst._outer()  # pylint: disable=protected-access
