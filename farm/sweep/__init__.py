"""Orchestration: compile, measure, check and store model × device cells; parallel sweeps.

Every cell ends as a stored result, ok or failed; only bad input (unknown model,
bad inventory) stops before the first cell.

A sweep compiles in the calling thread (each artifact once, cached) and hands the
artifacts to one worker thread per device, so compilation overlaps measurement and
devices measure in parallel. Each worker has its own database connection; every
result is one transaction, so a killed sweep loses at most the cells in flight and
``farm sweep --resume`` finishes exactly the missing ones.

    cell.py       the one cell pipeline: run_cell (CellContext, CellResult), bench_cell, compile_cell, compile_or_error
                  (COMPILE_LOCK), measure_cell, reference_run, the CPU fallback (fallback_run)
    inputs.py     cell_inputs: a cell's inputs and the outputs it is checked against
    failures.py   the stored result of a cell that failed before anything was measured
    run.py        run_sweep (workers, resume, offline devices), run_matrix, copy curves, cell_eta
"""

from farm.records import SweepSpec
from farm.sweep.cell import (COMPILE_LOCK, RETRYABLE_STEPS, UNREACHABLE_STEPS, CellContext, CellResult, Progress,
                             bench_cell, compile_cell, compile_or_error, fallback_blocked, fallback_run, measure_cell,
                             needs_fallback, reference_run, run_cell, with_health)
from farm.sweep.failures import compile_failure, crashed_cell, unmeasured_result
from farm.sweep.inputs import CellInputs, cell_inputs
from farm.sweep.run import (SweepOutcome, SweepWorker, cell_eta, is_gpu, missing_cells, offline_cell, offline_keys,
                            record_copy_curve, run_matrix, run_sweep)
from farm.tune.tuning_set import tuning_set, warn_records_that_do_not_apply

__all__ = [
    "COMPILE_LOCK", "RETRYABLE_STEPS", "UNREACHABLE_STEPS", "CellContext", "CellInputs", "CellResult", "Progress",
    "SweepOutcome", "SweepSpec", "SweepWorker", "bench_cell", "cell_eta", "cell_inputs", "compile_cell",
    "compile_failure", "compile_or_error", "crashed_cell", "fallback_blocked", "fallback_run", "is_gpu",
    "measure_cell", "missing_cells", "needs_fallback", "offline_cell", "offline_keys", "record_copy_curve",
    "reference_run", "run_cell", "run_matrix", "run_sweep", "tuning_set", "unmeasured_result",
    "warn_records_that_do_not_apply", "with_health",
]
