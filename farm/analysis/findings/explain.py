"""Which blocks of devices × models explain a set of alerted series: a greedy search under a two-part code (MDL).

The night is a 0/1 matrix over the judged series (devices × model labels): alerted or not. An explanation is a few
*blocks* (a side of devices × a side of models), then, for the alerts no block explains, a *scatter* or nothing.
A side is every member, the members sharing a trait (``traits.Trait``: a device's kind, target kind or tag; a
model's op, variant, tuning or runtime), one member, or a listed set. The statistics (sources in the docstring of
``farm.analysis.findings``):

- a block's evidence is the G statistic (likelihood-ratio test of independence, Wilks 1938) of the 2×2 table
  inside/outside × alerted/not over the series no earlier block took; ``gain = G/2`` is the log-likelihood (nats)
  that the block's own alert rate buys over one rate for all;
- its cost is the length of its description (Rissanen's two-part code; Grünwald, *The MDL Principle*, 2007):
  ln(named sides of its kind) for a named side, ln(n) + ln C(n, s) for s listed members of n, plus ½ ln N for its
  rate (the BIC's parameter cost). A block is taken while gain − cost > 0, best first, so a trait that fits as well
  as a list wins by being shorter, and a random scatter, whose blocks fit no better than chance, gets none;
- what no block explains is a scatter when it is more than the screen flags on a quiet night (one-sided binomial
  test against ``SCREEN_RATE``, p < ``P_SCATTER``); its independence of device and model is Pearson's chi-square
  test of homogeneity of the alert rate across devices and across models (the smaller p, Bonferroni × 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

import numpy as np

from farm.analysis.findings.traits import SeriesTraits, Trait


def special():
    """scipy.special (not scipy.stats: its import alone is ~2 s of CPU), imported when a finding is explained: a host
    that only measures and reports one night (tools/gpu_kit.py) carries no scipy."""
    import scipy.special  # pylint: disable=import-outside-toplevel

    return scipy.special

# regress.METHOD's steady screen (z ≥ 2, ≥ 2 %) flags at most 5 % of unchanged series a night at up to 2 %
# night-to-night noise (tools/bench_detect.py --costs, quoted in regress.Method): more than that is a cause
SCREEN_RATE = 0.05
P_SCATTER = 1e-3  # ... at this one-sided binomial p
SCATTER_MIN = 5  # and never fewer alerts than this: a handful of series is single series, not a lab-wide share
MAX_BLOCKS = 8  # the search stops here (each block is a cause; a night with more is read as a scatter)


@dataclass(frozen=True)
class Cell:
    """One judged series: a device and a model label (``stats.model_label``)."""

    device: str
    model: str


@dataclass(frozen=True)
class Side:
    """One side of a block: ``members`` of the ``of`` on that side; named by ``trait``, or ``listed`` (no trait names
    them), or neither: every member (``len(members) == of``) or one member."""

    members: tuple[str, ...]
    of: int
    trait: Trait | None = None
    listed: bool = False

    @property
    def whole(self) -> bool:
        return not self.listed and self.trait is None and len(self.members) == self.of


@dataclass(frozen=True)
class Block:
    """Alerted series explained by one cause: ``cells`` every alert in the block, ``own`` those no other block
    holds; ``n`` judged series in it; ``p`` its G test's p (1 df); ``gain``: gain − cost, nats."""

    devices: Side
    models: Side
    cells: tuple[Cell, ...]
    own: tuple[Cell, ...]
    n: int
    p: float
    gain: float


@dataclass(frozen=True)
class Scatter:
    """Alerts no block explains, more than the screen's quiet-night rate: ``cells`` of ``n`` series left, over
    ``devices``/``devices_of`` and ``models``/``models_of``; ``p_independent``: the homogeneity test's p (high: no
    device or model explains it); ``p_screen``: the binomial p against ``SCREEN_RATE``."""

    cells: tuple[Cell, ...]
    n: int
    devices: int
    devices_of: int
    models: int
    models_of: int
    p_independent: float
    p_screen: float


@dataclass(frozen=True)
class Explanation:
    blocks: tuple[Block, ...]
    scatter: Scatter | None
    residual: tuple[Cell, ...]  # alerts neither explains (a few single series, or the screen's noise)


@dataclass(frozen=True)
class _Candidates:
    """The named sides of one axis (every member, each trait, each member) and their membership matrix."""

    sides: tuple[Side, ...]
    matrix: np.ndarray  # sides × members, float 0/1


def explain(judged: Iterable[Cell], alerted: Iterable[Cell], traits: SeriesTraits) -> Explanation:
    """The blocks (best first), then the scatter or the residual, of ``alerted`` among ``judged`` series."""
    alerted = set(alerted)
    cells = set(judged) | alerted
    devices, models = sorted({c.device for c in cells}), sorted({c.model for c in cells})
    d_at, m_at = {d: i for i, d in enumerate(devices)}, {m: i for i, m in enumerate(models)}
    judged_m = np.zeros((len(devices), len(models)), dtype=bool)
    alerted_m = np.zeros_like(judged_m)
    for c in cells:
        judged_m[d_at[c.device], m_at[c.model]] = True
    for c in alerted:
        alerted_m[d_at[c.device], m_at[c.model]] = True
    rows, cols = _named(devices, traits.devices, "device"), _named(models, traits.models, "model")
    covered = np.zeros_like(judged_m)
    blocks, regions = [], []
    for _ in range(MAX_BLOCKS):
        best = _best(judged_m & ~covered, alerted_m & ~covered, rows, cols)
        if best is None:
            break
        gain, side_d, side_m = best
        inside = np.outer(np.isin(devices, side_d.members), np.isin(models, side_m.members)) & judged_m
        p = _p_value(inside, judged_m & ~covered, alerted_m & ~covered)
        blocks.append(Block(side_d, side_m, _cells(inside & alerted_m, devices, models), (), int(inside.sum()), p, gain))
        regions.append(inside)
        covered |= inside
    blocks = [replace(b, own=_own(i, regions, alerted_m, devices, models)) for i, b in enumerate(blocks)]
    left = judged_m & ~covered
    rest = _cells(alerted_m & left, devices, models)
    scatter = _scatter(left, alerted_m & left, rest)
    return Explanation(tuple(blocks), scatter, () if scatter else rest)


def _own(i: int, regions: list[np.ndarray], alerted: np.ndarray, devices: list[str], models: list[str]
         ) -> tuple[Cell, ...]:
    """The alerts of block ``i`` that no other block holds (its magnitude: a driver's own change, not a mass
    regression's on top); all of its alerts when every one is shared."""
    others = np.zeros_like(alerted)
    for j, region in enumerate(regions):
        if j != i:
            others |= region
    return _cells(regions[i] & alerted & ~others, devices, models) or _cells(regions[i] & alerted, devices, models)


def _cells(mask: np.ndarray, devices: list[str], models: list[str]) -> tuple[Cell, ...]:
    return tuple(Cell(devices[i], models[j]) for i, j in zip(*np.nonzero(mask)))


def _named(members: list[str], traits: Mapping[str, frozenset[Trait]], side: str) -> _Candidates:
    """Every member, each trait shared by two members or more (but not all: that is every member), each member; a
    trait naming the same members as an earlier one is left out (the earlier, in ``Trait``'s order, names them)."""
    sides = [Side(tuple(members), len(members))]
    seen = {tuple(members)}
    shared: dict[Trait, list[str]] = {}
    for m in members:
        for trait in traits.get(m, ()):
            if trait.side == side:
                shared.setdefault(trait, []).append(m)
    for trait, having in sorted(shared.items(), key=lambda item: item[0].order):
        if 2 <= len(having) < len(members) and tuple(having) not in seen:
            seen.add(tuple(having))
            sides.append(Side(tuple(having), len(members), trait))
    sides += [Side((m,), len(members)) for m in members if len(members) > 1]
    matrix = np.asarray([np.isin(members, s.members) for s in sides], dtype=np.float64)
    return _Candidates(tuple(sides), matrix)


def _g_gain(k_in: np.ndarray, n_in: np.ndarray, k: float, n: float) -> np.ndarray:
    """G/2 of the 2×2 tables (inside/outside × alerted/not) against one rate for all: Σ O ln(O/E), nats."""
    table = [k_in, n_in - k_in, k - k_in, (n - n_in) - (k - k_in)]
    expected = [n_in * k / n, n_in * (n - k) / n, (n - n_in) * k / n, (n - n_in) * (n - k) / n]
    with np.errstate(divide="ignore", invalid="ignore"):
        return sum(special().xlogy(o, o) - special().xlogy(o, e) for o, e in zip(table, expected))


def _log_choose(n: float, s: np.ndarray) -> np.ndarray:
    return special().gammaln(n + 1) - special().gammaln(s + 1) - special().gammaln(n - s + 1)


def _best(judged: np.ndarray, alerted: np.ndarray, rows: _Candidates, cols: _Candidates
          ) -> tuple[float, Side, Side] | None:
    """The block with the largest gain − cost > 0 among named × named, named devices × listed models and listed
    devices × named models (a listed side: the members with the highest alert share on the other side, the best
    prefix of them); None when none pays for itself."""
    k, n = float(alerted.sum()), float(judged.sum())
    if k < 2 or n <= k:
        return None
    a, j = alerted.astype(np.float64), judged.astype(np.float64)
    penalty = 0.5 * math.log(n)
    named_cost = math.log(len(rows.sides)) + math.log(len(cols.sides)) + penalty
    k_in, n_in = rows.matrix @ a @ cols.matrix.T, rows.matrix @ j @ cols.matrix.T
    score = np.where(_usable(k_in, n_in, k, n), _g_gain(k_in, n_in, k, n) - named_cost, -np.inf)
    i, jj = np.unravel_index(int(score.argmax()), score.shape)
    best = (float(score[i, jj]), rows.sides[i], cols.sides[jj])
    for transpose in (False, True):
        named, other = (cols, rows) if transpose else (rows, cols)
        found = _best_listed(named.matrix @ (a.T if transpose else a), named.matrix @ (j.T if transpose else j),
                             k, n, math.log(len(named.sides)) + penalty, other)
        if found is not None and found[0] > best[0]:
            best = (found[0], found[2], named.sides[found[1]]) if transpose else (found[0], named.sides[found[1]],
                                                                                   found[2])
    return best if best[0] > 0 else None


def _p_value(inside: np.ndarray, judged: np.ndarray, alerted: np.ndarray) -> float:
    """The G test's p (1 df) of a block against the series no earlier block took."""
    k_in, n_in = float((inside & alerted).sum()), float((inside & judged).sum())
    g = 2 * float(_g_gain(np.asarray(k_in), np.asarray(n_in), float(alerted.sum()), float(judged.sum())))
    return float(special().chdtrc(1, g))


def _names(candidates: _Candidates) -> list[str]:
    return list(candidates.sides[0].members)  # the first side is every member, in order


def _usable(k_in: np.ndarray, n_in: np.ndarray, k: float, n: float) -> np.ndarray:
    """A block with two alerts or more, a higher alert rate than outside it, and something outside it."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (k_in >= 2) & (n_in < n) & (k_in * (n - n_in) > (k - k_in) * n_in)


def _best_listed(per_k: np.ndarray, per_n: np.ndarray, k: float, n: float, named_cost: float,
                 other: _Candidates) -> tuple[float, int, Side] | None:
    """The best (named side, listed prefix of the other side's members by alert share) block."""
    members = _names(other)
    size = len(members)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where((per_n > 0) & (per_k > 0), per_k / per_n, -1.0)
    order = np.argsort(-share, axis=1, kind="stable")
    k_in = np.cumsum(np.take_along_axis(per_k, order, axis=1), axis=1)
    n_in = np.cumsum(np.take_along_axis(per_n, order, axis=1), axis=1)
    s = np.arange(1, size + 1, dtype=np.float64)
    cost = named_cost + math.log(size) + _log_choose(size, s)
    valid = _usable(k_in, n_in, k, n) & (np.take_along_axis(share, order, axis=1) > 0) & (s >= 2) & (s < size)
    score = np.where(valid, _g_gain(k_in, n_in, k, n) - cost, -np.inf)
    if not np.isfinite(score.max()):
        return None
    i, prefix = np.unravel_index(int(score.argmax()), score.shape)
    chosen = tuple(sorted(members[m] for m in order[i, : prefix + 1]))
    return float(score[i, prefix]), int(i), Side(chosen, size, listed=True)


def _scatter(left: np.ndarray, alerted: np.ndarray, cells: tuple[Cell, ...]) -> Scatter | None:
    """The alerts left as one scatter, when they are more than the screen's quiet-night share."""
    k, n = int(alerted.sum()), int(left.sum())
    if k < SCATTER_MIN or n == 0:
        return None
    p_screen = float(special().bdtrc(k - 1, n, SCREEN_RATE))  # P(X ≥ k) of Binomial(n, SCREEN_RATE)
    if p_screen >= P_SCATTER:
        return None
    p_values = [_homogeneity(alerted.sum(axis=axis), left.sum(axis=axis)) for axis in (1, 0)]
    return Scatter(cells, n, int(alerted.any(axis=1).sum()), int(left.any(axis=1).sum()),
                   int(alerted.any(axis=0).sum()), int(left.any(axis=0).sum()), min(1.0, 2 * min(p_values)), p_screen)


def _homogeneity(k: np.ndarray, n: np.ndarray) -> float:
    """Pearson's chi-square p that every group (device, or model) has the same alert rate: Σ (O − E)² / E over the
    groups × (alerted, not) table, with groups − 1 degrees of freedom."""
    keep = n > 0
    table = np.stack([k[keep], n[keep] - k[keep]], axis=1).astype(np.float64)
    if table.shape[0] < 2 or (table.sum(axis=0) == 0).any():
        return 1.0
    expected = np.outer(table.sum(axis=1), table.sum(axis=0)) / table.sum()
    return float(special().chdtrc(table.shape[0] - 1, float(((table - expected) ** 2 / expected).sum())))
