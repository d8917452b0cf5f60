"""PyTorch (torch.export programs, ``module:factory``) and TFLite models; their packages are optional extras."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np

from farm.errors import ModelError, message_line
from farm.records import InputSpec, ModelSource


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise ModelError("torch is not installed", TORCH_HINT) from exc
    return torch


TORCH_HINT = "PyTorch models need torch: pip install 'farm[torch]' (the CPU build, torch==2.13.0)"


def load_torch(spec: str, shapes: dict[str, tuple[int, ...]]) -> ModelSource:
    """A .pt2 file (torch.export.save) or ``module:factory`` exported here with ``shapes``."""
    import importlib
    import inspect
    import io

    torch = _torch()
    if spec.endswith(".pt2"):
        path = Path(spec)
        if not path.exists():
            raise ModelError(f"model file {spec} does not exist", "save one with torch.export.save(program, path)")
        data = path.read_bytes()
        try:
            program = torch.export.load(io.BytesIO(data))
        except Exception as exc:
            raise ModelError(f"{spec} is not a torch.export program ({message_line(exc, 200)})",
                             "save it with torch.export.save(torch.export.export(model, example_inputs), path)") from exc
        name = path.stem
    else:
        module_name, _, factory_name = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), factory_name)
        except (ImportError, AttributeError) as exc:
            raise ModelError(f"cannot import {spec}: {exc}", "write module:factory, importable from here") from exc
        module = factory().eval()
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        missing = [p.name for p in params if p.name not in shapes]
        if missing:
            raise ModelError(f"{spec}: input {missing[0]!r} needs a shape",
                             f"pass --shape {missing[0]}=1,3,224,224 for each forward() argument")
        example = tuple(torch.from_numpy(np.random.default_rng(0).standard_normal(shapes[p.name]).astype(np.float32))
                        for p in params)
        try:
            program = torch.export.export(module, example)
        except Exception as exc:
            raise ModelError(f"torch.export could not export {spec}: {message_line(exc, 200)}",
                             "the module must be exportable by torch.export (no data-dependent control flow)") from exc
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        data, name = buffer.getvalue(), factory_name
        identity = factory_identity(importlib.import_module(module_name), factory_name, shapes)
    inputs = []
    user_inputs = set(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user_inputs:
            value = node.meta["val"]
            inputs.append(InputSpec(node.name, tuple(int(d) for d in value.shape), str(value.dtype).removeprefix("torch.")))
    return ModelSource(name=name, origin=spec, digest=hashlib.sha256(data).hexdigest(), data=data,
                       inputs=tuple(inputs), frontend="torch", identity=identity if not spec.endswith(".pt2") else "")


def factory_identity(module, factory_name: str, shapes: dict[str, tuple[int, ...]]) -> str:
    """A ``module:factory`` model's identity (``ModelSource.identity``): the digest of its module's file, the
    factory's name and its shapes. Its exported bytes are no identity: they change with torch's version and with
    initializers that are not seeded, though the model is the same."""
    source = getattr(module, "__file__", None)
    code = Path(source).read_bytes() if source else module.__name__.encode()
    blob = json.dumps({"module": hashlib.sha256(code).hexdigest(), "factory": factory_name,
                       "shapes": {k: list(v) for k, v in sorted(shapes.items())}}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


TFLITE_HINT = "TFLite models need the tflite parser and LiteRT: pip install 'farm[tflite]'"
TFLITE_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool", 7: "int16", 9: "int8"}


def tflite_model(model: ModelSource):
    try:
        import tflite
    except ImportError as exc:
        raise ModelError("the tflite package is not installed", TFLITE_HINT) from exc
    return tflite.Model.GetRootAsModel(model.data, 0)


def load_tflite(spec: str, shapes: dict[str, tuple[int, ...]]) -> ModelSource:
    path = Path(spec)
    if not path.exists():
        raise ModelError(f"model file {spec} does not exist", "give a path to a .tflite file")
    data = path.read_bytes()
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ModelError(f"{spec} is not a TFLite model (no TFL3 identifier)", "the file may be truncated; convert it again")
    source = ModelSource(name=path.stem, origin=spec, digest=hashlib.sha256(data).hexdigest(), data=data, inputs=(),
                         frontend="tflite")
    try:
        graph = tflite_model(source).Subgraphs(0)
        inputs = []
        for i in range(graph.InputsLength()):
            tensor = graph.Tensors(graph.Inputs(i))
            name = tensor.Name().decode()
            shape = shapes.get(name) or tuple(int(d) for d in tensor.ShapeAsNumpy())
            if any(d <= 0 for d in shape):
                raise ModelError(f"{spec}: input {name!r} has a dynamic dimension",
                                 f"bind it with --shape {name}=1,224,224,3")
            inputs.append(InputSpec(name, tuple(shape), TFLITE_TYPES.get(tensor.Type(), "float32")))
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"{spec} could not be parsed as TFLite ({exc})", "the file may be truncated; convert it again") from exc
    return dataclasses.replace(source, inputs=tuple(inputs))


def torch_program(model: ModelSource):
    import io

    return _torch().export.load(io.BytesIO(model.data))
