"""What the compile knows of each kernel a profile times: its parameters' shapes and dtypes, its FLOPs as TIR
estimates them, and how it was scheduled. Read from the module Relax's pipeline built (``memory.BuiltModule``), by the
PrimFunc's name, which is the symbol the VM calls and the profile names (``measure.profile``)."""

from __future__ import annotations

import logging
from typing import Any

import tvm

from farm.errors import message_line

log = logging.getLogger(__name__)

TUNED_ATTR = "farm.tuned"  # set by compile.apply_records on a function a tuning record scheduled
SCHEDULED_ATTR = "tirx.is_scheduled"  # TVM's: a schedule was applied (a record, or a GPU's default rules)


def kernel_facts(mod: tvm.IRModule) -> dict[str, dict[str, Any]]:
    """name -> {"args": ["float32[1, 16, 32, 32]", ...], "flops": per call or None, "schedule": tuned | scheduled |
    untuned} for each PrimFunc of ``mod``. A FLOP estimate TIR cannot make (a data-dependent loop) is None."""
    from tvm.s_tir.analysis import estimate_tir_flops

    facts: dict[str, dict[str, Any]] = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        attrs = func.attrs or {}
        try:
            flops: float | None = float(estimate_tir_flops(tvm.IRModule({gv: func})))
        except Exception as exc:  # TVM's estimator refuses some loops
            log.debug("no FLOP estimate for %s: %s", gv.name_hint, message_line(exc))
            flops = None
        facts[str(attrs.get("global_symbol", gv.name_hint))] = {
            "args": [_param_text(p) for p in func.params], "flops": flops,
            "schedule": "tuned" if attrs.get(TUNED_ATTR) else "scheduled" if attrs.get(SCHEDULED_ATTR) else "untuned"}
    return facts


def _param_text(param) -> str:
    """'float32[1, 16, 32, 32]' for a buffer parameter; a scalar's dtype alone."""
    shape = getattr(param, "shape", None)
    if shape is None:
        return str(param.dtype)
    return f"{param.dtype}[{', '.join(str(int(d)) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in shape)}]"
