import numpy as np
import pytest

from farm.stats import (MAD_TO_SD, SUMMARY_RULE, Summary, TimeUnit, bootstrap_median_ci, format_duration, is_unstable,
                        SHORT, median, model_label, nonempty_median, robust_sd, summarize, summarize_rows, time_unit)


def plain_bootstrap_ci(values, confidence: float = 0.95, seed: int = 0, resamples: int = 2000) -> tuple[float, float]:
    """The textbook percentile bootstrap of the median, with the same draws as farm's: ``resamples`` rows of ``n``
    positions from ``default_rng(seed)``, each row a resample of the (sorted) sample, its median by np.median, the
    interval by np.quantile over all of them. Any resample of a sample is one of its sorted order as well, so
    indexing the sorted sample is the plain bootstrap, not a shortcut."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    draws = np.random.default_rng(seed).integers(0, x.size, size=(resamples, x.size))
    medians = np.median(x[draws], axis=1)
    low, high = np.quantile(medians, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def test_summary_rule_golden_values():
    """Literal numbers in, every Summary field out, exactly. A change here is a change of the summary rule: change
    SUMMARY_RULE with it (the store then recomputes the summaries it wrote) and these numbers together."""
    assert SUMMARY_RULE == ("1 median+p10/p90 linear, cv ddof=1, unstable cv>=0.10|max>=1.5*median, "
                            "bootstrap 95% 2000 seed 0")
    odd = [0.0123, 0.0119, 0.0131, 0.0120, 0.0125, 0.0140, 0.0122]  # 7 repeats, in the order measured
    assert summarize(odd) == Summary(
        n=7, median=0.0123, mean=0.01257142857142857, p10=0.01196, p90=0.013460000000000001, min=0.0119, max=0.014,
        cv=0.05912003943977779, mad=0.00044477999999999987, ci_low=0.012, ci_high=0.0131, unstable=False)
    even = [8.8, 8.7, 5.9, 4.7, 2.1, 7.7, 7.4, 1.4]  # 8 repeats: the median is the mean of the middle two
    assert summarize(even) == Summary(
        n=8, median=6.65, mean=5.8375, p10=1.8900000000000001, p90=8.73, min=1.4, max=8.8,
        cv=0.49241756436250134, mad=2.9651999999999994,
        ci_low=2.1, ci_high=8.261249999999938,  # interpolated between two resample medians
        unstable=True)  # cv ≥ 0.10


def test_the_fast_bootstrap_is_the_plain_bootstrap_exactly():
    """``summarize_rows`` reads the interval off a few hundred distinct middle-position pairs instead of building
    2,000 resamples per run; it claims the same numbers as the plain bootstrap with the same draws: bit for bit."""
    rng = np.random.default_rng(20)
    checked = 0
    for n in (2, 3, 4, 5, 8, 13, 30, 64):
        for _ in range(6):
            values = rng.lognormal(-5, 0.3, n)
            if rng.random() < 0.5:
                values = np.round(values, 4)  # ties, as a coarse clock gives
            for seed, resamples in ((0, 2000), (7, 999), (3, 50)):
                assert bootstrap_median_ci(values, seed=seed, resamples=resamples) == \
                    plain_bootstrap_ci(values, seed=seed, resamples=resamples), (n, seed, resamples)
                checked += 1
            summary = summarize(values.tolist())
            assert (summary.ci_low, summary.ci_high) == plain_bootstrap_ci(values)
    assert checked == 8 * 6 * 3
    # many runs at once (one matrix, the store's path) give each run's own plain bootstrap
    matrix = rng.lognormal(-5, 0.3, (40, 9))
    columns = summarize_rows(matrix)
    assert list(zip(columns["ci_low"].tolist(), columns["ci_high"].tolist())) == [plain_bootstrap_ci(row) for row in matrix]


def test_bootstrap_ci_is_the_seeded_plain_bootstrap_whatever_was_drawn_before():
    values = [5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
    assert bootstrap_median_ci(values) == (6.0, 10.0)
    assert bootstrap_median_ci(values, seed=3) == plain_bootstrap_ci(values, seed=3)
    # the draws of a length are cached: other seeds and lengths in between change nothing
    bootstrap_median_ci(values, seed=4)
    bootstrap_median_ci(values[:5], seed=3)
    assert bootstrap_median_ci(values, seed=3) == plain_bootstrap_ci(values, seed=3)
    assert bootstrap_median_ci(values, seed=3, resamples=9) == plain_bootstrap_ci(values, seed=3, resamples=9)
    low, high = bootstrap_median_ci(values)
    assert low <= 8.0 <= high and low >= 5.0 and high <= 11.0


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


def test_median_is_numpys_exactly():
    """Baselines, drift segments and confirmation rounds took np.median before they took ``stats.median``."""
    rng = np.random.default_rng(1)
    for n in (1, 2, 3, 4, 7, 10, 21):
        values = rng.lognormal(-4, 1, n)
        assert median(values) == float(np.median(values))
    assert median([3.0, 1.0, 2.0, 10.0]) == 2.5 and median([]) is None


def test_short_lists_take_pythons_median_and_it_is_numpys_to_the_bit():
    """Lists and tuples up to ``SHORT`` values are sorted in Python (a review takes thousands of short medians);
    arrays, long lists and NaN take numpy's path. Both give the same float, ties and even counts included."""
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 4, 5, 19, 20, 21, SHORT, SHORT + 1):
        for values in (rng.lognormal(-6, 1, n), np.round(rng.normal(0, 2, n)), np.full(n, 0.1)):
            as_list = [float(v) for v in values]
            assert nonempty_median(as_list) == nonempty_median(tuple(as_list)) == float(np.median(values))
            assert robust_sd(as_list) == robust_sd(values) == \
                float(1.4826 * np.median(np.abs(values - np.median(values))))
    with_nan = [1.0, float("nan"), 2.0]  # numpy's sort puts NaN last: farm's median of these has always been 2.0
    assert nonempty_median(with_nan) == nonempty_median(np.array(with_nan)) == 2.0
    assert np.isnan(robust_sd(with_nan)) and np.isnan(robust_sd(np.array(with_nan)))
    with pytest.raises(ValueError):
        nonempty_median([])


def test_robust_sd_literal_values():
    assert MAD_TO_SD == 1.4826
    assert robust_sd([1.0, 2.0, 3.0, 4.0, 100.0]) == 1.4826  # MAD 1: the outlier moves nothing
    # successive differences 1, 2, 3, 4: their MAD is 1, so σ = 1.4826 / √2
    assert robust_sd([0.0, 1.0, 3.0, 6.0, 10.0], of_differences=True) == 1.4826 / np.sqrt(2)
    # a step is a level shift, not noise: blind to it from the differences, not from the values
    step = [1.0, 1.0, 1.0, 5.0, 5.0, 5.0]
    assert robust_sd(step, of_differences=True) == 0.0 and robust_sd(step) == 1.4826 * 2.0
    assert np.isnan(robust_sd([])) and np.isnan(robust_sd([1.0], of_differences=True))


def test_robust_sd_is_the_formula_baselines_and_drift_wrote_inline():
    rng = np.random.default_rng(2)
    for n in (2, 5, 8, 20, 31):
        values = rng.lognormal(0, 0.05, n)
        assert robust_sd(values) == float(1.4826 * np.median(np.abs(values - float(np.median(values)))))
        diffs = np.diff(np.log(values))
        assert robust_sd(np.log(values), of_differences=True) == \
            float(1.4826 * np.median(np.abs(diffs - np.median(diffs))) / np.sqrt(2))


def test_one_time_unit_for_printed_durations_and_figure_axes():
    assert time_unit([0.0012, 0.0009]) == TimeUnit("ms", 1e-3)  # the largest value decides
    assert time_unit([2.5]) == ("s", 1.0) and time_unit([-3e-6]) == ("µs", 1e-6)
    assert time_unit([4e-10]) == ("ns", 1e-9) and time_unit([]) == ("ns", 1e-9) and time_unit([0.0]).name == "ns"
    assert [format_duration(s) for s in (0.00124, 1.18e-5, 2.31, 5e-10, 0.001, None)] == \
        ["1.24 ms", "11.8 µs", "2.31 s", "0.5 ns", "1 ms", ""]


def test_model_label():
    assert model_label("mlp@fp16", True) == "mlp@fp16 (tuned)" and model_label("mlp", False) == "mlp"
