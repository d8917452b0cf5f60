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
``serve_rpc_here``          ``rpc.server._popen_start_rpc_server`` and             ``rpc.server``
                            ``PopenRPCServerState.current``'s listen thread
``unchecked``               ``RPCRunner``'s ``_sanity_check``                       ``tune.metaschedule``
``import_tensor_intrinsics``  ``s_tir.tensor_intrin``'s ``__init__``: imports only   ``tune.metaschedule``
``import_tvm_without_torch``  ``tvm_ffi``'s ``__init__``: imports torch if it can     ``cli``, ``rpc``
``quick_registration``      ``tvm_ffi.registry``'s ``list_global_func_names``, as    ``import_tvm_without_torch``
                            ``init_ffi_api`` calls it
``STARTUP_PTH``             ... in TVM's own worker processes (``popen_worker``)    ``tools/setup.sh``
``normalize_mod``           global ``tvm.s_tir.meta_schedule.normalize_mod``       ``compile``, ``tune``
``XGBState``                ``XGBModel``'s ``data``, ``data_size``,                 ``tune.costmodel``
                            ``last_train_size``, ``booster`` (its training state)
``runner_future``           ``rpc_runner.RPCRunnerFuture(future, timeout_sec)``    ``tune.metaschedule``
``stop_runner_pool``        ``RPCRunner.pool`` (its own process pool), shut down   ``tune.metaschedule``
``pseudo_files_have_no_module``  ``inspect.getmodule``, as TVMScript's              ``tune.metaschedule``
                            ``inspect.stack()`` calls it (patched for an import)
``pack_imports_with_cubin``  global ``runtime.ModulePackImportsToC``, the packed   ``compile.build``
                            module tree's bytes (``ModuleSerializer``) and a
                            ``cuda`` module's (``CUDAModuleNode::SaveToBytes``:
                            fmt, function table, code)
``runtime_only_env``        ``TVM_USE_RUNTIME_LIB=1`` (``tvm/base.py``): libtvm  ``rpc.tracker_server``,
                            without ``libtvm_compiler.so``                         ``tools/gpu_check.sh``
                                                                                   (the GPU kit's hosts)
==========================  =====================================================  ===========================

MetaSchedule's names load when first used (module ``__getattr__``): the RPC server imports this module too, and
must not import MetaSchedule.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import struct
import sys
import sysconfig
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Iterator

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


def guard_tracker_registrations(refused: Callable[[str, str, str | None], str]) -> None:
    """Make this process's TVM tracker refuse a server's registration when ``refused(key, peer address, claimed
    address)`` says why: its connection is closed and nothing of it is listed or handed out. TVM's tracker handles
    both of a server's words in ``TCPEventHandler.call_handler``: UPDATE_INFO (args: code, {"key": "server:KEY",
    "addr": [custom address, port]}), then PUT (args: code, key, (port, matchkey), custom address)."""
    from tvm.rpc.tracker import TCPEventHandler, TrackerCode

    handle = TCPEventHandler.call_handler

    def call_handler(self, args):
        peer = self._addr[0]  # pylint: disable=protected-access
        if args and args[0] == TrackerCode.PUT:
            key, claimed = str(args[1]), args[3] if len(args) >= 4 else None
        elif args and args[0] == TrackerCode.UPDATE_INFO and str(args[1].get("key", "")).startswith("server:"):
            key, claimed = str(args[1]["key"])[len("server:"):], (args[1].get("addr") or [None])[0]  # its first word
        else:
            return handle(self, args)
        if refused(key, peer, claimed):
            self.close()
            return None
        return handle(self, args)

    TCPEventHandler.call_handler = call_handler


def set_rpc_serving(serving: Callable) -> None:
    """Replace it: ``_listen_loop`` looks ``_serving`` up at each session, so the replacement serves the next one."""
    from tvm.rpc import server

    server._serving = serving  # pylint: disable=protected-access


def serve_rpc_here(host: str, port: int, key: str, tracker: tuple[str, int], init: Callable[[], None]) -> None:
    """TVM's RPC server, registered with ``tracker`` under ``key`` on exactly ``port``, in this process until its
    listen loop ends: what ``rpc.Server`` runs in a ``PopenWorker`` of its own, a second interpreter that imports
    TVM again (~1.6 s of CPU a server). ``init`` runs first, here; each session is a fork of this process, as it was
    of that worker."""
    from tvm.rpc import server

    server._popen_start_rpc_server(host, port, port + 1, tracker_addr=tracker, key=key,  # pylint: disable=protected-access
                                   server_init_callback=init)
    server.PopenRPCServerState.current.thread.join()


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


def unchecked(meta_schedule_class: Any) -> Any:
    """``meta_schedule_class`` (``RPCRunner``; ``LocalBuilder`` has one too) without its ``_sanity_check``: the
    constructor starts a one-use worker process only to look up the functions it was given, and waits for it to
    import TVM (about 4 s, every session). farm gives them its own functions, imported the same way, so there is nothing to
    check. Subclassed as ``derived_object`` asks: from the class it wraps (``_cls``)."""
    from tvm.ir.utils import derived_object

    inner = meta_schedule_class._cls  # pylint: disable=protected-access
    if inner not in _UNCHECKED:
        _UNCHECKED[inner] = derived_object(type(inner.__name__, (inner,), {
            "__doc__": inner.__doc__, "__module__": __name__, "_sanity_check": lambda self: None}))
    return _UNCHECKED[inner]


_UNCHECKED: dict[type, Any] = {}


def normalize_mod(mod: Any) -> Any:
    """MetaSchedule's normalization of a task's module before a database lookup (its global function, the same
    one ``tune_tasks`` and ``MetaScheduleApplyDatabase`` use), looked up once."""
    if not _NORMALIZE:
        import tvm

        _NORMALIZE.append(tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod"))
    return _NORMALIZE[0](mod)


_NORMALIZE: list[Callable] = []


@dataclass(frozen=True)
class XGBState:
    """An ``XGBModel``'s training state, which MetaSchedule keeps in plain attributes and never saves
    (``farm.tune.costmodel`` saves and restores it): its feature groups by hash (``data``), their candidate count
    (``data_size``), that count at its last training (``last_train_size``: its adaptive retraining) and the
    booster (None before any training)."""

    data: Any
    data_size: int
    last_train_size: int
    booster: Any


def xgb_state(model: Any) -> XGBState:
    return XGBState(model.data, int(model.data_size), int(model.last_train_size), model.booster)


def set_xgb_state(model: Any, state: XGBState) -> None:
    model.data, model.data_size, model.last_train_size = state.data, state.data_size, state.last_train_size
    if state.booster is not None:
        model.booster = state.booster


def runner_future(future: Any, timeout_s: float) -> Any:
    """A ``RunnerFuture`` over a ``concurrent.futures`` future of ``measure_in_worker``, as ``RPCRunner.run``
    makes them (its result is the worker's, or a timeout's error message)."""
    from tvm.s_tir.meta_schedule.runner import rpc_runner

    return rpc_runner.RPCRunnerFuture(future=future, timeout_sec=timeout_s)


def stop_runner_pool(rpc: Any) -> None:
    """Shut an ``RPCRunner``'s own worker pool down at once: farm measures with its functions in its own pool."""
    rpc.pool.shutdown(wait=False)


@contextlib.contextmanager
def pseudo_files_have_no_module() -> Iterator[None]:
    """While TVMScript functions are defined (the tensor intrinsics' modules): ``inspect.getmodule`` answers None
    at once for a frame of the import machinery's pseudo-files (``<frozen importlib._bootstrap>``). Each such
    function calls ``inspect.stack()``, which looks up every frame's module; for those pseudo-files none matches,
    and ``inspect.getmodule`` scans all of ``sys.modules`` (~2000 after importing TVM) again each time, whatever it
    finds: None gives ``inspect.stack()`` the same frames and source lines, in seconds instead of ~40 s."""
    import inspect

    scan = inspect.getmodule

    def getmodule(obj, _filename=None):
        if _filename is not None and _filename.startswith("<") and _filename.endswith(">") and inspect.isframe(obj):
            return None
        return scan(obj, _filename)

    inspect.getmodule = getmodule
    try:
        yield
    finally:
        inspect.getmodule = scan

# The tensor intrinsics MetaSchedule's rules for an LLVM CPU may tensorize with, by the CPU's architecture (TVM's
# GetRuleKindFromTarget: "vnni" and "avx512" use x86's, "dotprod" and "asimd" arm_cpu's, "rvv" riscv_cpu's).
CPU_INTRINSICS = {"x86_64": "x86", "amd64": "x86", "i686": "x86", "aarch64": "arm_cpu", "arm64": "arm_cpu",
                  "armv7": "arm_cpu", "arm": "arm_cpu", "riscv64": "riscv_cpu", "riscv32": "riscv_cpu"}
INTRINSICS_PACKAGE = "tvm.s_tir.tensor_intrin"


def import_tensor_intrinsics(arch: str | None) -> None:
    """Register the tensor intrinsics of ``tvm.s_tir.tensor_intrin`` that a tune context needs: for an LLVM CPU of
    ``arch`` (its ``mtriple``'s first word) only its architecture's module, else (a GPU target, an unknown CPU)
    every module, as importing the package does. The package's ``__init__`` does nothing but import its modules,
    CUDA's first and always (~75 % of the ~5 s the whole package takes): a CPU target skips it by registering the
    package without running its ``__init__``; asked for everything later, the ``__init__`` then runs in it."""
    module = CPU_INTRINSICS.get((arch or "").lower())
    package = sys.modules.get(INTRINSICS_PACKAGE)
    if module is None:
        if package is None:
            importlib.import_module(INTRINSICS_PACKAGE)
        elif _PARTIAL:  # registered without its __init__ for a CPU: run it now, in the same module
            _PARTIAL.clear()
            _package_spec().loader.exec_module(package)  # type: ignore[union-attr]
        return
    if package is None:
        sys.modules[INTRINSICS_PACKAGE] = importlib.util.module_from_spec(_package_spec())
        _PARTIAL.add(INTRINSICS_PACKAGE)
    importlib.import_module(f"{INTRINSICS_PACKAGE}.{module}")


_PARTIAL: set[str] = set()  # the package, while registered without running its __init__


def _package_spec() -> importlib.machinery.ModuleSpec:
    spec = importlib.util.find_spec(INTRINSICS_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(INTRINSICS_PACKAGE)
    return spec


def intrinsics_package_only_imports() -> bool:
    """What ``import_tensor_intrinsics`` relies on: the package's ``__init__`` only imports (its modules, and
    ``tvm.runtime.enabled`` to choose them), so skipping it loses nothing but the modules not asked for."""
    import ast

    tree = ast.parse(Path(str(_package_spec().origin)).read_text(encoding="utf-8"))
    return all(_only_imports(node) for node in tree.body)


def _only_imports(node: Any) -> bool:
    import ast

    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):  # the docstring
        return True
    if isinstance(node, ast.If):
        return all(_only_imports(child) for child in node.body + node.orelse)
    return False


def import_tvm_without_torch() -> None:
    """When this process imports TVM (now or later), import it without PyTorch; for farm's own processes (the CLI,
    its servers and tracker).

    ``tvm_ffi``'s ``__init__`` imports torch whenever it is installed (a workaround for a symbol clash on Windows),
    and so does ``relax.base_py_module`` (for Python functions in an IRModule, which farm has none of): most of
    TVM's import, about 2 s, 4 s of CPU when two cores are busy, in every process. Here torch reads as not
    installed while ``tvm`` imports, and is importable again afterwards: farm's PyTorch frontend imports it when a
    model needs it, and tensors reach TVM by DLPack (``from_dlpack``), so only TVM's own optional uses of torch
    are left off in the process. A command that never imports TVM pays nothing: the hook waits on
    ``sys.meta_path`` for ``tvm``. Nothing is done when TVM, tvm_ffi or torch is already imported."""
    os.environ[WITHOUT_TORCH_ENV] = "1"  # the processes it starts, through STARTUP_PTH
    if {"tvm", "tvm_ffi", "torch"} & set(sys.modules):
        return
    if not any(isinstance(finder, _TorchlessTvm) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TorchlessTvm())


# TVM starts worker processes of its own (``python -m tvm.exec.popen_worker``: MetaSchedule's builders and runners,
# three or more a tuning session), each importing TVM, so torch too: ~4 s of CPU each. A .pth file in site-packages
# runs at every interpreter's start: this one calls import_tvm_without_torch in the processes a farm process
# started (WITHOUT_TORCH_ENV, inherited), and does nothing in any other. ``tools/setup.sh`` writes it
# (``python -m farm.tvm_private``); without it TVM's workers import torch as before.
WITHOUT_TORCH_ENV = "FARM_TVM_WITHOUT_TORCH"
STARTUP_PTH = "farm-tvm-without-torch.pth"
STARTUP_LINE = (f"import os; os.environ.get({WITHOUT_TORCH_ENV!r}) == '1' and "
                "__import__('farm.tvm_private').tvm_private.import_tvm_without_torch()\n")


def install_startup(site_packages: Path | None = None) -> Path:
    """Write ``STARTUP_PTH`` into ``site_packages`` (this interpreter's, by default); returns its path."""
    folder = site_packages or Path(sysconfig.get_paths()["purelib"])
    path = folder / STARTUP_PTH
    if not path.exists() or path.read_text() != STARTUP_LINE:
        path.write_text(STARTUP_LINE)
    return path


class _TorchlessTvm(importlib.abc.MetaPathFinder):
    """Finds ``tvm`` as the path finder does, and runs its ``__init__`` (which imports tvm_ffi and relax) with
    ``torch`` absent."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ARG002  # the finder protocol's signature
        if fullname != "tvm":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _WithoutTorch(spec.loader)
        return spec


class _WithoutTorch(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        absent = "torch" not in sys.modules
        if absent:
            sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
        try:
            with quick_registration():
                self.loader.exec_module(module)
        finally:
            if absent and sys.modules.get("torch", False) is None:
                del sys.modules["torch"]


@contextlib.contextmanager
def quick_registration() -> Iterator[None]:
    """TVM's import with ~0.25 s less CPU (1.42 s → 1.18 s, median of 5 here), the same modules and functions:

    - ``tvm_ffi.init_ffi_api``, called 52 times (once per FFI namespace), lists every global function, one
      FFI call per name (~2,000): 0.23 s in all. Here the list is read again only when the count of functions has
      changed (TVM's Python modules register functions as they import).
    - The garbage collector, run 457 times by the import's allocations (0.12 s), waits until the import is over;
      then what the import made is frozen (``gc.freeze``), so later collections (a compile's many) skip it."""
    from tvm_ffi import registry

    list_names = registry.list_global_func_names
    names: list[str] = []

    def listed() -> list[str]:
        functor = registry.get_global_func("ffi.FunctionListGlobalNamesFunctor")()
        count = functor(-1)
        if count != len(names):
            names[:] = [functor(i) for i in range(count)]
        return list(names)

    collecting = gc.isenabled()
    gc.disable()
    registry.list_global_func_names = listed
    try:
        yield
    finally:
        registry.list_global_func_names = list_names
        if collecting:
            gc.enable()
    gc.freeze()


# pack_imports_with_cubin: TVM 0.27 serializes an executable's imported modules into the library as one blob
# (src/target/codegen.cc: ModuleSerializer, PackImportsToC): an 8-byte little-endian length, the import tree (two
# vectors of uint64, each its count then its items), then per module its kind and bytes (each a uint64 length and
# the bytes; "_lib" stands for the library itself and has no bytes). A "cuda" module's bytes are its format, its
# function table and its code, the code last (CUDAModuleNode::SaveToBytes; CUDAFallbackModuleNode mirrors it when
# no CUDA runtime is linked, as on a build host). With format "cuda" the code is C source that the runtime compiles
# when it loads; with "cubin" it is loaded as it is (CUDAModuleCreateImpl).
PACK_IMPORTS_TO_C = "runtime.ModulePackImportsToC"
CUDA_MODULE = "cuda"  # the kind() of TVM's CUDA module (CUDAModuleNode, CUDAFallbackModuleNode): not a device kind


def _take(blob: bytes, at: int) -> tuple[bytes, int]:
    """A length-prefixed string of TVM's byte stream at ``at``: (its bytes, where the next item starts)."""
    (size,) = struct.unpack_from("<Q", blob, at)
    if at + 8 + size > len(blob):
        raise ValueError(f"a string of {size} bytes at {at} runs past the blob's {len(blob)}")
    return blob[at + 8:at + 8 + size], at + 8 + size


def _string(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def rewrite_cuda_code(blob: bytes, sources: list[str], cubin_for: Callable[[str], bytes]) -> tuple[bytes, int]:
    """The packed module tree ``blob`` (with its length header) with every ``cuda`` module's source replaced by
    ``cubin_for(source)`` in format ``cubin``; and how many it replaced. ``sources`` are the CUDA modules' sources
    (``inspect_source``): a module's bytes must end in exactly one of them, or TVM's format has moved (ValueError)."""
    (size,) = struct.unpack_from("<Q", blob, 0)
    if size != len(blob) - 8:
        raise ValueError(f"the packed modules say {size} bytes and hold {len(blob) - 8}")
    at = 8
    for _ in range(2):  # the import tree: row pointers, then child indices
        (count,) = struct.unpack_from("<Q", blob, at)
        at += 8 + 8 * count
    out, replaced = [blob[8:at]], 0
    while at < len(blob):
        kind, at = _take(blob, at)
        out.append(_string(kind))
        if kind == b"_lib":
            continue
        payload, at = _take(blob, at)
        if kind == CUDA_MODULE.encode():
            payload = _cubin_payload(payload, sources, cubin_for)
            replaced += 1
        out.append(_string(payload))
    body = b"".join(out)
    return struct.pack("<Q", len(body)) + body, replaced


def _cubin_payload(payload: bytes, sources: list[str], cubin_for: Callable[[str], bytes]) -> bytes:
    fmt, rest = _take(payload, 0)
    if fmt != b"cuda":
        raise ValueError(f"a CUDA module in format {fmt!r}, not 'cuda' (source)")
    for source in sources:
        code = _string(source.encode())
        if payload.endswith(code):
            return _string(b"cubin") + payload[rest:len(payload) - len(code)] + _string(cubin_for(source))
    raise ValueError("a CUDA module's bytes do not end in its source: TVM's CUDAModuleNode::SaveToBytes has changed")


def cuda_sources(module: Any) -> list[str]:
    """The CUDA source of every ``cuda`` module ``module`` imports, at any depth."""
    found, stack, seen = [], [module], set()
    while stack:
        current = stack.pop()
        for child in current.imports:
            if id(child) not in seen:
                seen.add(id(child))
                stack.append(child)
        module_kind = current.kind  # a module's kind, not a device's
        if module_kind == CUDA_MODULE:
            found.append(current.inspect_source())
    return found


def pack_imports_with_cubin(cubin_for: Callable[[str], bytes], note: bytes) -> Callable[..., str]:
    """An ``fpack_imports`` for ``export_library``: TVM's own C file of the packed modules, with every CUDA module's
    source compiled by ``cubin_for`` and ``note`` kept in the library's read-only data (``compile/artifacts.py`` reads it)."""
    import tvm

    def pack(module: Any, is_system_lib: bool, prefix: str, workspace_dir: str) -> str:
        text = tvm.get_global_func(PACK_IMPORTS_TO_C)(module, is_system_lib, prefix)
        array = re.search(r"const unsigned char (\w+)\[(\d+)\] = \{(.*?)\};", text, re.S)
        if array is None:
            raise ValueError(f"{PACK_IMPORTS_TO_C} wrote no byte array: TVM's PackImportsToC has changed")
        blob = bytes(int(h, 16) for h in re.findall(r"0x([0-9a-f]{2})", array.group(3)))
        sources = cuda_sources(module)
        rewritten, replaced = rewrite_cuda_code(blob, sources, cubin_for)
        if replaced != len(sources):
            raise ValueError(f"{len(sources)} CUDA module(s) imported, {replaced} packed")
        data = ",".join(f"0x{b:02x}" for b in rewritten)
        text = text[:array.start()] + f"const unsigned char {array.group(1)}[{len(rewritten)}] = {{{data}}};" + \
            text[array.end():]
        text += f"\n__attribute__((used)) static const char farm_device_code_note[] = {json.dumps(note.decode())};\n"
        path = os.path.join(workspace_dir, f"{prefix}devc.c")
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        return path

    return pack


def runtime_only_env() -> dict[str, str]:
    """The environment under which ``import tvm`` loads libtvm_runtime alone, never ``libtvm_compiler.so`` (a
    host that only runs compiled artifacts: ``tools/gpu_kit.py`` carries no compiler, and ``tools/gpu_check.sh``
    sets it, in shell; farm's tracker, which is Python over sockets, imports TVM under it)."""
    return {"TVM_USE_RUNTIME_LIB": "1"}


if __name__ == "__main__":
    print(install_startup())
