"""What a finding started with: the manifest fields (``farm.manifest``) that changed between its series' baseline
runs and tonight's, ranked by how well each explains the series that moved and not those that did not (#63).

Every field that changed between a moved series' last baseline run and its run tonight is a candidate cause. A
candidate is scored by the share of the moved series it changed on, less the share of the judged series that did not
move that it also changed on: an OTA update on the three phones that slowed ranks above a farm commit that changed on
every device, slowed or not. Candidates that changed on exactly the same series cannot be told apart by the night
and are said so. Runs stored without a manifest (before schema 22) have no candidates: their fields are unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from farm.manifest import Change, changes, label, shown, unchanged_words
from farm.analysis.runs import Run

Pair = tuple[Run, Run]  # (baseline's last run, tonight's run) of one series
MOST_SHOWN = 2  # distinct old → new values a candidate's words show (an OTA to one build, or a few)


@dataclass(frozen=True)
class Candidate:
    """One manifest field as a cause: the series that moved and changed it, of those that moved; the series that did
    not move but changed it too, of those. ``changes``: its distinct old → new values, most common first."""

    field: str
    changes: tuple[Change, ...]
    moved: int
    of_moved: int
    still: int
    of_still: int
    series: frozenset[int]  # the indexes of the moved series it changed on (candidates alike cannot be told apart)

    @property
    def score(self) -> float:
        return self.moved / max(self.of_moved, 1) - self.still / max(self.of_still, 1)

    @property
    def words(self) -> str:
        shown_changes = [c.words for c in self.changes[:MOST_SHOWN]]
        more = len(self.changes) - MOST_SHOWN
        text = ", ".join(shown_changes) + (f" (+{more} other values)" if more > 0 else "")
        if len(self.changes) > 1 and all(c.field == self.field for c in self.changes):
            text = f"{label(self.field)} " + ", ".join(f"{shown(self.field, c.old)} → {shown(self.field, c.new)}"
                                                        for c in self.changes[:MOST_SHOWN])
        return f"{text} ({self.moved}/{self.of_moved} moved, {self.still}/{self.of_still} unmoved series)"


def candidates(moved: list[Pair], still: list[Pair], manifests: Mapping[str, Mapping[str, Any]]) -> list[Candidate]:
    """The manifest fields that changed on at least one moved series, best explanation first."""
    moved_changes = [_changes(pair, manifests) for pair in moved]
    still_changes = [_changes(pair, manifests) for pair in still]
    fields = sorted({c.field for each in moved_changes for c in each})
    out = []
    for field in fields:  # each field counted over the pairs where it is known on both sides: unknown is no "same"
        of_moved = sum(_known_both(pair, field, manifests) for pair in moved)
        of_still = sum(_known_both(pair, field, manifests) for pair in still)
        hit = [i for i, each in enumerate(moved_changes) if any(c.field == field for c in each)]
        values: dict[tuple[str, str], list[Change]] = {}
        for i in hit:
            for c in moved_changes[i]:
                if c.field == field:
                    values.setdefault((repr(c.old), repr(c.new)), []).append(c)
        ordered = tuple(group[0] for group in sorted(values.values(), key=lambda g: -len(g)))
        still_hit = sum(any(c.field == field for c in each) for each in still_changes)
        out.append(Candidate(field, ordered, len(hit), of_moved, still_hit, of_still, frozenset(hit)))
    return sorted(out, key=lambda c: (-c.score, -c.moved, c.field))


def cause_words(sweep_id: int, moved: list[Pair], found: list[Candidate],
                manifests: Mapping[str, Mapping[str, Any]]) -> str:
    """"started with sweep 57: OS build QP1A → RQ3A (3/3 moved, 0/40 unmoved series); TVM, model and records
    unchanged"; candidates that changed on the same series are said to be inseparable; '' without candidates."""
    if not found:
        return ""
    best = found[0]
    if best.score <= 0:  # every change of the night was as common on the series that did not move
        return (f"sweep {sweep_id} also changed, on moved and unmoved series alike (no cause of its own): "
                + "; ".join(c.words for c in found[:3]))
    # causes that changed on no unmoved series each explain their share (records for one model, a new file for
    # another); else the best, with those that changed on exactly its series
    lead = [c for c in found if c.still == 0] if best.still == 0 else \
        [c for c in found if c.series == best.series and c.score == best.score]
    others = [c for c in found if c not in lead]
    text = f"started with sweep {sweep_id}: " + "; ".join(c.words for c in lead)
    if len({c.series for c in lead}) < len(lead):
        text += " (some changed together on the same series: farm cannot tell those apart)"
    if others:
        text += "; other candidates: " + "; ".join(c.words for c in others[:3])
    pairs = [(manifests.get(b.manifest or "", {}), manifests.get(n.manifest or "", {})) for b, n in moved]
    if unchanged := unchanged_words(pairs):
        text += f"; {unchanged}"
    return text


def _known_both(pair: Pair, field: str, manifests: Mapping[str, Mapping[str, Any]]) -> bool:
    before, now = pair
    return all(manifests.get(r.manifest or "", {}).get(field) is not None for r in (before, now))


def _changes(pair: Pair, manifests: Mapping[str, Mapping[str, Any]]) -> list[Change]:
    before, now = pair
    if not before.manifest or not now.manifest or before.manifest == now.manifest:
        return []
    return changes(manifests.get(before.manifest, {}), manifests.get(now.manifest, {}))


def pairs_of(rows: Iterable[Any], runs: Mapping[int, Run]) -> list[Pair]:
    """(baseline's last run, tonight's run) of each alert or verdict whose two runs ``runs`` holds."""
    return [(before, now) for row in rows
            if (now := runs.get(row.run_id)) is not None and (before := runs.get(row.baseline_run_id or -1)) is not None]
