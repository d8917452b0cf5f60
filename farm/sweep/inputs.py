"""A cell's inputs and what its outputs are checked against (``cell_inputs``): a reference file or test_data_set
folder, else the model's shipped test data, else its reference runtime's outputs; a variant's drift tolerance."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np

from farm.errors import FarmError
from farm.models import (VARIANT_TOLERANCE, load_reference_file, load_test_data, make_inputs, reference_outputs,
                         shipped_test_data)
from farm.models.runtimes import runtime_name
from farm.records import BenchConfig, ModelSource

log = logging.getLogger(__name__)


def cell_inputs(model: ModelSource, config: BenchConfig, reference_file: str | None = None,
                ) -> tuple[dict[str, np.ndarray], list[np.ndarray] | None, str, BenchConfig]:
    """A cell's inputs, the outputs its runs are checked against, what those are, and the config whose tolerance
    checks them: a reference file or test_data_set folder, else the model's shipped test data, else its runtime's."""
    inputs = make_inputs(model, config.seed)
    reference_name = runtime_name(model)
    shipped = shipped_test_data(model)
    reference: list[np.ndarray] | None
    try:
        if reference_file and Path(reference_file).is_dir():  # a test_data_set folder: its inputs and outputs
            inputs, reference = load_test_data(reference_file, model)
            reference_name = f"file:{reference_file}"
        elif reference_file:
            reference, reference_name = load_reference_file(reference_file), f"file:{reference_file}"
        elif shipped is not None:  # the model's own test data beats any runtime's opinion (old opsets included)
            inputs, reference = load_test_data(shipped, model)
            reference_name = f"shipped test data ({shipped.name})"
        else:
            reference = reference_outputs(model, inputs)
    except FarmError as exc:
        log.warning("%s; output check skipped", exc.message)
        reference = None
    if model.variant != "fp32" and reference is not None and not reference_file:
        # a variant is checked against fp32 with a tolerance relative to the output's range: its drift
        spread = max(float(np.ptp(r)) for r in reference) or 1.0
        config = dataclasses.replace(config, rtol=0.0, atol=VARIANT_TOLERANCE[model.variant] * spread)
        reference_name = f"onnxruntime fp32 (drift tolerance {VARIANT_TOLERANCE[model.variant]:.0%} of range {spread:.3g})"
    return inputs, reference, reference_name, config


CellInputs = tuple[dict[str, np.ndarray], list[np.ndarray] | None, str, BenchConfig]  # what cell_inputs returns
