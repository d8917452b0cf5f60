"""Step 8, check: a run's outputs against the reference's, with tolerance."""

from __future__ import annotations

import numpy as np

from farm.records import BenchConfig, CheckResult


def check_outputs(outputs: list, reference: list[np.ndarray] | None, config: BenchConfig, reference_name: str) -> CheckResult:
    if reference is None:
        return CheckResult("skipped", reference=reference_name, detail="no reference outputs")
    if len(reference) != len(outputs):
        return CheckResult("failed", reference=reference_name, rtol=config.rtol, atol=config.atol,
                           detail=f"{len(outputs)} outputs, reference has {len(reference)}")
    worst = 0.0
    bad = []
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        got = out.numpy() if hasattr(out, "numpy") else np.asarray(out)  # TVM tensors, or a runtime's arrays
        if got.shape != ref.shape:
            return CheckResult("failed", reference=reference_name, rtol=config.rtol, atol=config.atol,
                               detail=f"output {i} has shape {got.shape}, reference {ref.shape}")
        err = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)))) if got.size else 0.0
        worst = max(worst, err)
        if not np.allclose(got, ref, rtol=config.rtol, atol=config.atol, equal_nan=True):
            bad.append(i)
    if bad:
        return CheckResult("failed", worst, config.rtol, config.atol, reference_name,
                           f"output(s) {bad} exceed rtol={config.rtol:g} atol={config.atol:g}; max abs error {worst:.3g}")
    return CheckResult("passed", worst, config.rtol, config.atol, reference_name)
