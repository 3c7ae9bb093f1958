"""Rerun and prompt-perturbation floors for repeated, matched runs (the BFCL audit's statistics).

Input per endpoint: a 0/1 matrix of instances x runs for the main arm (reruns at fixed settings)
and, for the perturbation arm, one such matrix per named prompt variant, all on the same matched
instances. Definitions:
- run correlation: Pearson correlation across instances between two runs, averaged over run pairs
  (pairs where a run is constant have no correlation and are left out);
- always-correct / always-wrong / flip instances; ever-flip fraction = flip instances / N;
- marginal SD: SD (ddof=1) of the aggregate score across runs;
- rerun paired SD: root mean square over run pairs of the aggregate score difference (the
  differences are on matched instances, so instance mix cancels); for independent reruns it is
  sqrt(2) x the marginal SD, hence the reported ratio paired / (sqrt(2) x marginal) near 1;
- perturbation paired SD for variants L, R: SD (ddof=1) of y_L - y_R over matched
  (instance, run) units; the median over variant pairs, and its multiple of the rerun paired SD;
- bootstrap SD curve: the rerun paired SD recomputed on n instances drawn with replacement;
- fingerprint split: instance-level differences y_ir - y_is over run pairs, split by whether the
  two calls had the same system fingerprint, with their SDs.
Pure functions: arrays in, frozen dataclasses out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np


@dataclass(frozen=True)
class RerunFloor:
    instances: int
    runs: int
    accuracy: float
    mean_correlation: float | None
    always_correct: int
    always_wrong: int
    flip: int
    ever_flip_fraction: float
    marginal_sd: float
    paired_sd: float
    paired_to_marginal: float | None  # paired / (sqrt(2) * marginal)


@dataclass(frozen=True)
class PerturbationPair:
    left: str
    right: str
    left_accuracy: float
    right_accuracy: float
    matched: int
    paired_sd: float


@dataclass(frozen=True)
class PerturbationFloor:
    pairs: tuple[PerturbationPair, ...]
    median_paired_sd: float
    multiple_of_rerun: float | None


@dataclass(frozen=True)
class CurvePoint:
    n: int
    mean: float
    ci: tuple[float, float]


@dataclass(frozen=True)
class FingerprintSplit:
    fingerprints: int
    within_pairs: int
    within_sd: float | None
    across_pairs: int
    across_sd: float | None


def _matrix(y: np.ndarray) -> np.ndarray:
    m = np.asarray(y, dtype=float)
    if m.ndim != 2 or m.shape[1] < 2:
        raise ValueError(f"need an instances x runs matrix with at least 2 runs, got shape {m.shape}")
    return m


def rerun_paired_sd(y: np.ndarray) -> float:
    scores = _matrix(y).mean(axis=0)
    diffs = [a - b for a, b in combinations(scores, 2)]
    return float(math.sqrt(np.mean(np.square(diffs))))


def rerun_floor(y: np.ndarray) -> RerunFloor:
    m = _matrix(y)
    n, r = m.shape
    corrs = []
    for a, b in combinations(range(r), 2):
        x, z = m[:, a], m[:, b]
        if x.std() > 0 and z.std() > 0:
            corrs.append(float(np.corrcoef(x, z)[0, 1]))
    lo, hi = m.min(axis=1), m.max(axis=1)
    flip = int((lo != hi).sum())
    scores = m.mean(axis=0)
    marginal = float(scores.std(ddof=1))
    paired = rerun_paired_sd(m)
    return RerunFloor(
        instances=n,
        runs=r,
        accuracy=float(m.mean()),
        mean_correlation=float(np.mean(corrs)) if corrs else None,
        always_correct=int((lo == 1).sum()),
        always_wrong=int((hi == 0).sum()),
        flip=flip,
        ever_flip_fraction=flip / n,
        marginal_sd=marginal,
        paired_sd=paired,
        paired_to_marginal=paired / (math.sqrt(2) * marginal) if marginal > 0 else None,
    )


def perturbation_floor(variants: Mapping[str, np.ndarray], rerun_paired: float | None = None) -> PerturbationFloor:
    names = list(variants)
    pairs = []
    for a, b in combinations(names, 2):
        ya, yb = np.asarray(variants[a], float), np.asarray(variants[b], float)
        if ya.shape != yb.shape:
            raise ValueError(f"variants {a} and {b} are not matched: shapes {ya.shape} and {yb.shape}")
        d = (ya - yb).ravel()
        pairs.append(PerturbationPair(a, b, float(ya.mean()), float(yb.mean()), d.size,
                                      float(d.std(ddof=1)) if d.size > 1 else 0.0))
    med = float(np.median([p.paired_sd for p in pairs])) if pairs else 0.0
    multiple = med / rerun_paired if rerun_paired else None
    return PerturbationFloor(tuple(pairs), med, multiple)


def sd_curve(y: np.ndarray, sizes: Sequence[int], resamples: int = 200, seed: int = 0,
             alpha: float = 0.05) -> tuple[CurvePoint, ...]:
    m = _matrix(y)
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        vals = np.array([rerun_paired_sd(m[rng.integers(0, m.shape[0], n)]) for _ in range(resamples)])
        lo, hi = np.percentile(vals, [100 * alpha / 2, 100 * (1 - alpha / 2)])
        out.append(CurvePoint(int(n), float(vals.mean()), (float(lo), float(hi))))
    return tuple(out)


def curve_sizes(n: int, step: int = 25) -> list[int]:
    sizes = list(range(step, n, step))
    return [*sizes, n] if n not in sizes else sizes


def fingerprint_split(y: np.ndarray, fp: np.ndarray) -> FingerprintSplit:
    """`fp` holds one fingerprint label per (instance, run); '' or None where unknown."""
    m = _matrix(y)
    f = np.asarray(fp, dtype=object)
    within, across = [], []
    for a, b in combinations(range(m.shape[1]), 2):
        d = m[:, a] - m[:, b]
        same = f[:, a] == f[:, b]
        within.extend(d[same])
        across.extend(d[~same])

    def sd(xs: list[float]) -> float | None:
        return float(np.std(xs, ddof=1)) if len(xs) > 1 else None

    labels = {x for x in f.ravel() if x}
    return FingerprintSplit(len(labels), len(within), sd(within), len(across), sd(across))


@dataclass(frozen=True)
class Taxonomy:
    counts: Mapping[str, int]
    failures: int
    malformed_share: float | None


def taxonomy(failures: Sequence[str | None]) -> Taxonomy:
    """Counts of failure categories over deduplicated rows (one per instance and run)."""
    counts: dict[str, int] = {}
    for f in failures:
        if f and f not in ("pass", "correct"):
            counts[f] = counts.get(f, 0) + 1
    total = sum(counts.values())
    return Taxonomy(counts, total, counts.get("malformed_output", 0) / total if total else None)
