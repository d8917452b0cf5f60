"""What a built module plans to hold, read from the Relax module the build produced (``BuiltModule`` keeps it)."""

from __future__ import annotations

import math
from typing import Any

import tvm
from tvm import relax


@tvm.instrument.pass_instrument
class BuiltModule:
    """Keeps the last module with Relax functions that an outermost pass returned: the Relax pipeline's output,
    which the VM code generator turns into the executable (the TIR passes that follow see PrimFuncs only).
    Observed, not chosen: TVM picks the pipeline (a GPU target's own, with DLight) as it always does."""

    def __init__(self) -> None:
        self.depth = 0
        self.module: tvm.IRModule | None = None

    def run_before_pass(self, mod, info) -> None:
        self.depth += 1

    def run_after_pass(self, mod, info) -> None:
        self.depth -= 1
        if self.depth == 0 and any(isinstance(f, relax.Function) for f in mod.functions.values()):
            self.module = mod


ALLOC_STORAGE = {"relax.vm.alloc_storage": (1, 2), "relax.memory.alloc_storage": (1, 3)}  # op -> (device, dtype) args


def planned_memory(mod: tvm.IRModule, gpu: bool) -> dict[str, int]:
    """What the built module plans to hold, from its IR (``relax.analysis.estimate_memory_usage`` only prints text):

    - ``params_bytes``: its constant tensors (the weights, each tensor once), which the VM places on its first
      device, the target's;
    - ``planned_host_bytes`` / ``planned_device_bytes``: the sizes of its storage allocations (``alloc_storage``,
      Relax's memory planning) of static size, by where they live: the device index names the VM's device (the
      module's ``vdevice`` list when it has one; else 0 is the target's device, a GPU's, and the rest the host);
    - ``planned_dynamic``: allocations whose size is known only at run time (not in the sums)."""
    tensors: dict[Any, int] = {}
    sums = {"planned_host_bytes": 0, "planned_device_bytes": 0, "planned_dynamic": 0}
    vdevices = list((mod.global_infos or {}).get("vdevice", []))

    def on_device(index: int) -> bool:
        if index < len(vdevices):
            return "gpu" in vdevices[index].target.keys
        return gpu and index == 0

    def visit(expr) -> None:
        if isinstance(expr, tvm.ir.expr.GenericConst) and isinstance(expr.value, tvm.runtime.Tensor):
            tensors[expr.value] = math.prod(int(d) for d in expr.value.shape) * expr.value.dtype.itemsize
        elif isinstance(expr, tvm.ir.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in ALLOC_STORAGE:
            device_arg, dtype_arg = ALLOC_STORAGE[expr.op.name]
            dims = [d.value if isinstance(d, tvm.tirx.IntImm) else None for d in expr.args[0].values]
            if None in dims:
                sums["planned_dynamic"] += 1
                return
            nbytes = math.prod(dims) * expr.args[dtype_arg].value.itemsize  # type: ignore[arg-type]
            index = expr.args[device_arg]
            index = int(index.value) if hasattr(index, "value") else 0
            sums["planned_device_bytes" if on_device(index) else "planned_host_bytes"] += nbytes

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return {"params_bytes": sum(tensors.values()), **sums}
