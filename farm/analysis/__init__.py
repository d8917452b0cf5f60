"""Judging what was stored: the read model (runs.py, results.py, series.py), regressions and drift
(regress.py, drift.py), kernels (kernel_diff.py), findings (findings/), comparisons (compare.py). It imports
neither TVM nor a device kind (tests/test_layers.py)."""
