"""Reference runtimes: the model in the runtime its users would otherwise ship, ready to time beside TVM.

ONNX models run in onnxruntime, TFLite models in LiteRT, torch.export programs in torch (CPU), all on
this host. ``open_runtime`` loads the model (the load is timed by the caller) and returns a
``RuntimeSession`` whose ``run`` takes the same named inputs TVM's run gets and returns numpy outputs.
The runtime's own settings are written into ``settings``, which the measurement stores with the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from farm.errors import ModelError, message_line
from farm.models.frameworks import TFLITE_HINT, _torch, torch_program
from farm.records import ModelSource

RUNTIME_OF_FRONTEND = {"onnx": "onnxruntime", "tflite": "litert", "torch": "torch"}


@dataclass(frozen=True)
class RuntimeSession:
    """A model loaded in its reference runtime."""

    runtime: str  # onnxruntime | litert | torch
    version: str
    run: Callable[[dict[str, np.ndarray]], list[np.ndarray]] = field(repr=False)
    settings: dict[str, Any] = field(default_factory=dict)  # how it was configured (threads, optimisation level)


def runtime_name(model: ModelSource) -> str:
    return RUNTIME_OF_FRONTEND.get(model.frontend, "onnxruntime")


def open_runtime(model: ModelSource, threads: int | None) -> RuntimeSession:
    """Load ``model`` in its reference runtime with ``threads`` intra-op threads (None: the runtime's default).
    A runtime that is missing or refuses the model raises ModelError."""
    opener = {"onnx": _onnxruntime, "tflite": _litert, "torch": _torch_eager}[model.frontend]
    try:
        return opener(model, threads)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"{runtime_name(model)} could not load {model.name}: {message_line(exc)}",
                         "the TVM figure stands alone for this model") from exc


def onnxruntime_options(threads: int | None) -> Any:
    """The reference's ``onnxruntime.SessionOptions``: every graph optimization, ops in sequence, ``threads``."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return options


def _onnxruntime(model: ModelSource, threads: int | None) -> RuntimeSession:
    import onnxruntime

    session = onnxruntime.InferenceSession(model.data, onnxruntime_options(threads), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(o) for o in session.run(names, inputs)]

    return RuntimeSession("onnxruntime", onnxruntime.__version__, run,
                          {"graph_optimization_level": "ORT_ENABLE_ALL", "intra_op_num_threads": threads or "default",
                           "execution_mode": "sequential", "provider": "CPUExecutionProvider"})


ONNXRUNTIME_CLOCK = "onnxruntime's own profiler: each node's kernel time (whole µs), on the session's threads"


def profile_onnxruntime(model: ModelSource, threads: int | None, inputs: dict[str, np.ndarray], runs: int) -> Any:
    """``model``'s per-node profile in onnxruntime (a session of its own with profiling on, the reference's options
    and threads; one run not counted, then ``runs``): a ``records.KernelProfile``, its nodes grouped by the op
    classes TVM's kernels are (``op_classes.onnx_op_class``). Its nodes are not TVM's kernels (each runtime fuses
    its own way); the op classes compare."""
    import json
    import os
    import tempfile

    import onnxruntime

    from farm.op_classes import onnx_op_class
    from farm.records import KernelProfile, KernelTime

    with tempfile.TemporaryDirectory(prefix="farm-ort-profile-") as folder:
        options = onnxruntime_options(threads)
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(folder, "profile")
        session = onnxruntime.InferenceSession(model.data, options, providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            session.run(None, inputs)
        with open(session.end_profiling()) as f:
            events = json.load(f)
    model_runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    counted_from = model_runs[0]["ts"] + model_runs[0]["dur"]  # the first run's nodes are not counted
    counted = model_runs[1:]
    times: dict[str, float] = {}
    calls: dict[str, int] = {}
    facts: dict[str, tuple[str, tuple[str, ...]]] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time") or e["ts"] < counted_from:
            continue
        name = e["name"][: -len("_kernel_time")]
        times[name] = times.get(name, 0.0) + e["dur"] * 1e-6
        calls[name] = calls.get(name, 0) + 1
        args = e.get("args", {})
        facts.setdefault(name, (str(args.get("op_name", "")), tuple(
            f"{dtype}{list(shape)}".replace("float[", "float32[") for item in args.get("input_type_shape", ())
            for dtype, shape in item.items())))
    n = max(1, len(counted))
    kernels = tuple(KernelTime(f"{name} ({facts[name][0]})", onnx_op_class(facts[name][0]), calls[name] / n,
                               times[name] / n, facts[name][1]) for name in times)
    return KernelProfile("ok", "", ONNXRUNTIME_CLOCK, n, sum(e["dur"] for e in counted) * 1e-6 / n, kernels)


def _litert(model: ModelSource, threads: int | None) -> RuntimeSession:
    try:
        from ai_edge_litert.interpreter import Interpreter
        import ai_edge_litert
    except ImportError as exc:
        raise ModelError("LiteRT (ai-edge-litert) is not installed: no TFLite reference runtime", TFLITE_HINT) from exc
    interpreter = Interpreter(model_content=model.data, num_threads=threads or -1)
    interpreter.allocate_tensors()
    inputs_by_name = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    outputs = [d["index"] for d in interpreter.get_output_details()]

    def run(inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        for name, value in inputs.items():
            interpreter.set_tensor(inputs_by_name[name], value)
        interpreter.invoke()
        return [np.array(interpreter.get_tensor(i)) for i in outputs]

    version = getattr(ai_edge_litert, "__version__", "") or _dist_version("ai-edge-litert")
    return RuntimeSession("litert", version, run, {"num_threads": threads or "default"})


def _torch_eager(model: ModelSource, threads: int | None) -> RuntimeSession:
    torch = _torch()
    if threads:
        torch.set_num_threads(threads)
    module = torch_program(model).module()

    def run(inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            out = module(*[torch.from_numpy(v) for v in inputs.values()])
        flat = list(out) if isinstance(out, (tuple, list)) else [out]
        return [o.detach().numpy() for o in flat]

    return RuntimeSession("torch", torch.__version__, run, {"num_threads": torch.get_num_threads(), "mode": "eager, no_grad"})


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return ""
