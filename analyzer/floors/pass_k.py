"""pass^k: the probability that all k reruns of a task pass, averaged over tasks.

Per task, from n runs with c passes, C(c, k) / C(n, k) is the unbiased estimate of p^k (it is the
share of the task's k-subsets of runs that all passed, and E[C(C, k)] = C(n, k) p^k for C ~
Bin(n, p)); plugging in (c/n)^k instead would be biased upwards for 0 < p < 1. The report's
value is the mean over tasks, with a task-bootstrap interval (tasks resampled, the runs of each
task kept), for k = 1, 2, 4, ... up to the number of runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from noisefloor.analyzer.bootstrap import DEFAULT_RESAMPLES, task_bootstrap
from noisefloor.analyzer.floors.registry import Arms, FloorSettings, Line, Statistic, number, register
from noisefloor.analyzer.intervals import Interval
from noisefloor.analyzer.matrices import runs_matrix
from noisefloor.errors import InputError


@dataclass(frozen=True)
class PassK:
    k: int
    estimate: float  # mean over tasks of C(c, k) / C(n, k)
    ci: Interval | None  # task bootstrap; None from one task
    tasks: int
    runs: int


def per_task(passes: np.ndarray, runs: int, k: int) -> np.ndarray:
    """C(c, k) / C(n, k) for each task's pass count c out of n = `runs`, as the product
    prod_{j<k} (c - j) / (n - j) (0 when c < k), so large n cannot overflow."""
    if not 1 <= k <= runs:
        raise InputError(f"pass^k needs 1 <= k <= runs, got k={k} with {runs} runs")
    c = np.asarray(passes, dtype=float)
    j = np.arange(k, dtype=float)
    return np.prod(np.clip(c[:, None] - j, 0, None) / (runs - j), axis=1)


def ks_for(runs: int) -> tuple[int, ...]:
    """1, 2, 4, ... below `runs`, then `runs` itself."""
    powers = [k for k in (2**i for i in range(runs.bit_length())) if k < runs]
    return (*powers, runs)


def pass_k(y: np.ndarray, ks: tuple[int, ...] | None = None, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
           alpha: float = 0.05) -> tuple[PassK, ...]:
    """pass^k for every k in `ks` (default `ks_for(R)`) of an instances x runs 0/1 matrix; one
    joint task bootstrap for every k."""
    m = runs_matrix(y)
    n, r = m.shape
    ks = ks or ks_for(r)
    passes = m.sum(axis=1)
    cols = {str(k): per_task(passes, r, k) for k in ks}
    draws = task_bootstrap(cols, resamples, seed) if n > 1 else None
    return tuple(PassK(k, float(cols[str(k)].mean()), draws.ci(str(k), alpha) if draws else None, n, r) for k in ks)


def _compute(arms: Arms, s: FloorSettings) -> tuple[PassK, ...] | None:
    return None if arms.main is None else pass_k(arms.main, resamples=s.resamples, seed=s.seed)


def _lines(points: tuple[PassK, ...]) -> list[Line]:
    text = ", ".join(f"k={p.k}: {number(p.estimate, p.ci, '.4f')}" for p in points)
    if points and points[0].ci is None:
        text += " (one task: no interval)"
    return [Line(f"pass^k (all k reruns of a task pass; unbiased C(c,k)/C(n,k), task bootstrap): {text}")]


register(Statistic("pass_k", _compute, _lines, order=60))
