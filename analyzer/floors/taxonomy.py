"""Failure classes of the main arm's failed units, with an exact interval on the malformed share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from noisefloor.analyzer.floors.registry import Arms, FloorSettings, Line, Statistic, number, register
from noisefloor.analyzer.intervals import Interval, clopper_pearson

TAXONOMY_CLASSES = ("wrong_function", "wrong_arguments", "malformed_output", "other")


@dataclass(frozen=True)
class Taxonomy:
    counts: Mapping[str, int]
    failures: int
    malformed_share: float | None
    malformed_ci: Interval | None


def taxonomy(rows: Sequence[tuple[int, str | None]]) -> Taxonomy:
    """Failure classes of the failed (instance, run) units: `(outcome, label)` pairs. A failure is
    decided by the outcome, not the label: a failed unit without a known label is `other`, a
    passing unit is never a failure whatever its label says."""
    counts = dict.fromkeys(TAXONOMY_CLASSES, 0)
    for outcome, label in rows:
        if outcome:
            continue
        counts[label if label in counts else "other"] += 1
    total = sum(counts.values())
    malformed = counts["malformed_output"]
    return Taxonomy({k: v for k, v in counts.items() if v}, total, malformed / total if total else None,
                    clopper_pearson(malformed, total) if total else None)


def _compute(arms: Arms, s: FloorSettings) -> Taxonomy:
    return taxonomy(arms.failures)


def _lines(t: Taxonomy) -> list[Line]:
    if not t.failures:
        return []
    return [Line(f"failures: {dict(sorted(t.counts.items()))}, malformed share "
                 f"{number(t.malformed_share, t.malformed_ci, '.1%')}")]


register(Statistic("taxonomy", _compute, _lines, order=50))
