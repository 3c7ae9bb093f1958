"""Rerun differences split by whether the two calls had the same known system fingerprint."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np

from noisefloor.analyzer.floors.registry import Arms, FloorSettings, Line, Statistic, number, register
from noisefloor.analyzer.matrices import runs_matrix


@dataclass(frozen=True)
class FingerprintSplit:
    fingerprints: int
    within_pairs: int
    within_sd: float | None
    across_pairs: int
    across_sd: float | None
    unknown_pairs: int  # pairs where a fingerprint is missing: in neither group


def _known(x: object) -> bool:
    return x is not None and x == x and str(x).strip() != ""  # x == x: not NaN


def fingerprint_split(y: np.ndarray, fp: np.ndarray) -> FingerprintSplit:
    """`fp` holds one fingerprint label per (instance, run); '' or None where unknown. An unknown
    fingerprint is not a value: a pair with one is neither within nor across."""
    m = runs_matrix(y, 2)
    f = np.asarray(fp, dtype=object)
    known = np.vectorize(_known, otypes=[bool])(f) if f.size else np.zeros(f.shape, bool)
    within: list[float] = []
    across: list[float] = []
    unknown = 0
    for a, b in combinations(range(m.shape[1]), 2):
        d = m[:, a] - m[:, b]
        both = known[:, a] & known[:, b]
        same = both & (f[:, a] == f[:, b])
        within.extend(d[same])
        across.extend(d[both & ~same])
        unknown += int((~both).sum())

    def sd(xs: list[float]) -> float | None:
        return float(np.std(xs, ddof=1)) if len(xs) > 1 else None

    labels = {x for x, k in zip(f.ravel(), known.ravel()) if k}
    return FingerprintSplit(len(labels), len(within), sd(within), len(across), sd(across), unknown)


def _compute(arms: Arms, s: FloorSettings) -> FingerprintSplit | None:
    if arms.main is None or arms.fingerprints is None:
        return None
    return fingerprint_split(arms.main, arms.fingerprints)


def _lines(f: FingerprintSplit) -> list[Line]:
    unknown = f"; {f.unknown_pairs} pairs with an unknown fingerprint left out" if f.unknown_pairs else ""
    return [Line(f"fingerprints: {f.fingerprints} distinct; within {f.within_pairs} pairs, SD {number(f.within_sd)}; "
                 f"across {f.across_pairs} pairs, SD {number(f.across_sd)}{unknown}")]


register(Statistic("fingerprints", _compute, _lines, order=40))
