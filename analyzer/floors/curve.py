"""The bootstrap SD curve: the rerun paired SD recomputed on n instances drawn with replacement,
per n, to show how the floor shrinks with the number of matched instances."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from noisefloor.analyzer.bootstrap import index_blocks
from noisefloor.analyzer.floors import arrays
from noisefloor.analyzer.floors.registry import Arms, FloorSettings, Line, Statistic, register
from noisefloor.analyzer.intervals import Interval, percentile
from noisefloor.analyzer.matrices import runs_matrix

CURVE_RESAMPLES = 2_000  # per point: a curve has one point per 25 instances, each a full bootstrap


@dataclass(frozen=True)
class CurvePoint:
    n: int
    mean: float
    ci: Interval
    resamples: int


def sd_curve(y: np.ndarray, sizes: Sequence[int], resamples: int = CURVE_RESAMPLES, seed: int = 0,
             alpha: float = 0.05) -> tuple[CurvePoint, ...]:
    """The rerun paired SD on n instances drawn with replacement, per n. Each point has its own
    random stream (spawned from `seed`), so the points are independent estimates."""
    m = runs_matrix(y, 2)
    out = []
    for n, ss in zip(sizes, np.random.SeedSequence(seed).spawn(len(sizes))):
        vals = np.concatenate([arrays.paired_sd(m[idx]) for idx in
                               index_blocks(m.shape[0], resamples, ss, int(n) * m.shape[1], size=int(n))])
        out.append(CurvePoint(int(n), float(vals.mean()), percentile(vals, alpha), resamples))
    return tuple(out)


def curve_sizes(n: int, step: int = 25) -> list[int]:
    sizes = list(range(step, n, step))
    return [*sizes, n] if n not in sizes else sizes


def _compute(arms: Arms, s: FloorSettings) -> tuple[CurvePoint, ...]:
    if arms.main is None:
        return ()  # no curve without reruns: an empty one, as the report has always written it
    return sd_curve(arms.main, curve_sizes(len(arms.instances)), s.curve_resamples or CURVE_RESAMPLES, s.seed)


def _lines(curve: tuple[CurvePoint, ...]) -> list[Line]:
    if not curve:
        return []
    pts = ", ".join(f"n={c.n}: {c.mean:.4f} [{c.ci.low:.4f}, {c.ci.high:.4f}]" for c in curve)
    return [Line(f"rerun paired SD by instance count ({curve[0].resamples} resamples each): {pts}")]


register(Statistic("sd_curve", _compute, _lines, order=30))
