"""`farm --help` states the method's numbers from the constants the code runs on, never from a copy in prose."""

import dataclasses

import pytest

import farm.cli.regressions
from farm.cli import build_parser
from farm.analysis.drift import MIN_CHANGE, MIN_NIGHTS, MIN_SIZE, PENALTY
from farm.analysis.regress import CONFIRM_ROUNDS, METHOD, METRICS, Method, Thresholds
from farm.stats import MAD_TO_SD


def _help(verb: str) -> str:
    return build_parser()._subparsers._group_actions[0].choices[verb].format_help()


def test_regressions_help_shows_the_methods_constants():
    text = _help("regressions")
    assert f"last {METHOD.baseline_n} accepted nightly medians (at least {METHOD.baseline_min})" in text
    assert f"spread {MAD_TO_SD:g}·MAD (at least {METHOD.spread_floor * 100:g} % of the centre)" in text
    assert f"Wilcoxon p < {METHOD.p_confirm:g}" in text
    assert ", ".join(METRICS) in text
    for metric, limit in METHOD.thresholds.items():
        line = next(line for line in text.splitlines() if line.startswith("  ") and metric in line.split(":")[0])
        assert f"z ≥ {limit.z:g} and change ≥ +{limit.rel * 100:g} %" in line, line
    assert f"{CONFIRM_ROUNDS[0]} rounds, {CONFIRM_ROUNDS[1]} in all if inconclusive" in " ".join(text.split())
    assert "1.4826" in text and "last 20 accepted" in text and "p < 0.01" in text  # today's values, as a reader sees them


def test_drift_and_sweep_help_show_the_methods_constants():
    text = " ".join(_help("drift").split())
    assert f"penalty {PENALTY:g}·σ²·ln n" in text and f"≥ {MIN_SIZE} sweeps per segment" in text
    assert f"shifts under {MIN_CHANGE * 100:g} % merged" in text and f"Needs ≥ {MIN_NIGHTS} sweeps per series" in text
    assert "{" + ",".join(METRICS) + "}" in text  # --metric choices
    assert f"{CONFIRM_ROUNDS[0]} rounds" in " ".join(_help("sweep").split())


def test_help_follows_a_changed_method(monkeypatch: pytest.MonkeyPatch):
    """The numbers are read, not typed: another method, another help."""
    other = dataclasses.replace(METHOD, baseline_n=37, p_confirm=0.005,
                                thresholds={**METHOD.thresholds, "steady": Thresholds(1.5, 0.03)})
    assert isinstance(other, Method)
    monkeypatch.setattr(farm.cli.regressions, "METHOD", other)
    text = _help("regressions")
    assert "last 37 accepted" in text and "p < 0.005" in text and "  steady: z ≥ 1.5 and change ≥ +3 %" in text
