import pytest

from farm.stats import bootstrap_median_ci, is_unstable, summarize


def test_summarize_literal_samples():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.n == 5 and s.median == 3.0 and s.min == 1.0 and s.max == 100.0
    assert s.mad == pytest.approx(1.4826 * 1.0)
    assert s.unstable is True  # max ≥ 1.5 × median


def test_summarize_stable_series():
    s = summarize([10.0, 10.1, 9.9, 10.0, 10.05, 9.95])
    assert s.median == 10.0
    assert s.cv < 0.01
    assert s.unstable is False
    assert s.ci_low <= 10.0 <= s.ci_high


def test_summarize_empty_is_none():
    assert summarize([]) is None


def test_is_unstable_by_cv_alone():
    # CV ≈ 0.115 with max = 1.15 × median: unstable through the CV rule only
    assert is_unstable([1.0, 0.85, 1.15, 1.0, 0.85, 1.15]) is True
    assert is_unstable([1.0, 0.95, 1.05, 1.0]) is False


def test_bootstrap_ci_is_deterministic_and_brackets_median():
    values = [5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
    assert bootstrap_median_ci(values, seed=3) == bootstrap_median_ci(values, seed=3)
    low, high = bootstrap_median_ci(values)
    assert low <= 8.0 <= high and low >= 5.0 and high <= 11.0
