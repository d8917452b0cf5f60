"""The slow-drift view on generated series with known truth (3 % night-to-night noise, 30 nights)."""

import numpy as np
import pytest

from farm.analysis.drift import drift_rows, find_drift
from tests.conftest import make_run


def nights(seed: int, shape) -> list[float]:
    rng = np.random.default_rng(seed)
    return [0.010 * shape(i) * (1 + rng.normal(0, 0.03)) for i in range(30)]


def test_flat_series_rarely_show_a_change_point():
    found = sum(bool(find_drift(nights(seed, lambda i: 1.0)).change_points) for seed in range(200))
    assert found <= 6  # ≤ 3 % of A/A series (1.25 % over 400 seeds when PENALTY was chosen)


def test_a_ten_percent_step_is_found_where_it_happened():
    hits = 0
    for seed in range(200):
        drift = find_drift(nights(seed, lambda i: 1.10 if i >= 18 else 1.0))
        hits += any(abs(p - 18) <= 2 for p in drift.change_points) and 0.05 < drift.total_change < 0.15
    assert hits >= 180  # ≥ 90 %


def test_a_slow_creep_no_single_night_would_flag_is_seen_in_total():
    drift = find_drift(nights(3, lambda i: 1.0 + 0.006 * i))  # 0.6 % a night, 17 % over 30 nights
    assert drift.change_points and drift.total_change > 0.08


def test_drift_rows_use_one_accepted_value_per_sweep():
    rows = []
    for sweep, value in enumerate(nights(5, lambda i: 1.2 if i >= 15 else 1.0), start=1):
        for attempt_value, status, unstable in ((99.0, "failed", False), (value, "ok", False), (50.0, "ok", True)):
            rows.append(make_run(len(rows) + 1, sweep, attempt_value, status, unstable))
    (row,) = drift_rows(rows, lambda r: r.steady_median_s)
    assert row["sweeps"] == list(range(1, 31)) and 14 <= row["change_points"][0] <= 18
    assert [s["nights"] for s in row["segments"]] == [row["change_points"][0] - 1, 31 - row["change_points"][0]]


def test_farm_drift_lists_the_step_from_stored_sweeps(tmp_path):
    import dataclasses
    import json

    from farm.models import load_model
    from farm.store import Store
    from tests.conftest import run_farm
    from tests.test_store import DEVICE, _result

    rng = np.random.default_rng(11)
    with Store(tmp_path / "r.db") as store:
        for night in range(12):
            sweep = store.start_sweep({"devices": ["cpu"], "models": ["mlp"]})
            level = 0.012 if night >= 6 else 0.010
            samples = tuple(level * (1 + rng.normal(0, 0.01)) for _ in range(5))
            store.record_result(dataclasses.replace(_result(samples=samples), threads=2), DEVICE, load_model("mlp"),
                                None, sweep_id=sweep)
            store.finish_sweep(sweep, "done")
    proc = run_farm("--db", str(tmp_path / "r.db"), "drift", "--json")
    assert proc.returncode == 0, proc.stderr
    (series,) = json.loads(proc.stdout)["series"]
    assert series["change_points"] == [7] and 0.15 < series["total_change"] < 0.25  # sweep ids start at 1
    assert (series["runtime"], series["threads"]) == ("tvm", 2)  # every view of runs names both
    table = run_farm("--db", str(tmp_path / "r.db"), "drift").stdout
    assert "runtime" in table and "threads" in table and " tvm " in table, table


def test_segmentation_is_the_exact_optimum_of_penalized_l2():
    """Against every segmentation of short series (brute force), with literal seeds."""
    import itertools

    from farm.analysis.drift import segment_l2

    def cost(x, ends, penalty):
        bounds = [0, *ends]
        return sum(((x[a:b] - x[a:b].mean()) ** 2).sum() for a, b in zip(bounds, bounds[1:])) + penalty * (len(ends) - 1)

    rng = np.random.default_rng(11)
    for trial in range(60):
        size = int(rng.integers(6, 13))
        x = rng.normal(0, 0.01, size) + (0.05 if trial % 2 else 0.0) * (np.arange(size) >= size // 2)
        penalty = float(rng.choice([1e-5, 1e-4, 1e-3]))
        splits = [c for k in range(size // 3) for c in itertools.combinations(range(3, size - 2), k)
                  if all(b - a >= 3 for a, b in zip((0, *c), (*c, size)))]
        best = min(cost(x, [*c, size], penalty) for c in splits)
        assert cost(x, segment_l2(x, penalty, 3), penalty) == pytest.approx(best, abs=1e-15), trial


def test_series_segmented_together_segment_as_each_alone():
    """``segment_l2_many`` (a report's series of one length at once) against ``segment_l2`` row by row."""
    from farm.analysis.drift import segment_l2, segment_l2_many

    rng = np.random.default_rng(5)
    x = rng.normal(0, 0.01, (40, 30)) + 0.05 * (np.arange(30) >= rng.integers(3, 28, (40, 1)))
    penalties = rng.choice([1e-5, 1e-4, 1e-3], 40)
    assert segment_l2_many(x, penalties, 3) == [segment_l2(row, p, 3) for row, p in zip(x, penalties)]
