"""Joint task bootstrap (ladder paper, App. A.2).

Every statistic here is a mean over tasks of a per-task quantity (a task's variance, its mean
outcome, whether it varied, whether the judge disagreed). So one resample is a vector of task
multiplicities c (summing to N), and every statistic of that resample is c @ column / N. Drawing
c once per resample and applying it to all columns at once is what makes the bootstrap joint:
conditions and contrasts see the same tasks, and it is a matrix product instead of a loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from noisefloor.analyzer.intervals import Interval, percentile
from noisefloor.errors import InputError

DEFAULT_RESAMPLES = 20_000  # joint task-bootstrap draws, everywhere a default is needed
CHUNK = 2000  # resamples per block: bounds memory at CHUNK x N counts; fixed so results depend only on the seed


@dataclass(frozen=True)
class Draws:
    """Resampled means, one array of length `resamples` per named column."""

    resamples: int
    seed: int
    values: Mapping[str, np.ndarray]

    def ci(self, name: str, alpha: float = 0.05) -> Interval:
        return percentile(self.values[name], alpha)


def task_bootstrap(
    columns: Mapping[str, np.ndarray],
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Draws:
    """Resample tasks with replacement; return the mean of every column under each resample."""
    if resamples < 1:
        raise InputError(f"resamples must be at least 1, got {resamples}")
    names = list(columns)
    matrix = np.column_stack([np.asarray(columns[k], dtype=float) for k in names])  # (N, C)
    n = matrix.shape[0]
    if n == 0:
        raise InputError("cannot bootstrap zero tasks")
    rng = np.random.default_rng(seed)
    out = np.empty((resamples, len(names)))
    done = 0
    while done < resamples:
        b = min(CHUNK, resamples - done)
        idx = rng.integers(0, n, size=(b, n))
        offsets = (np.arange(b) * n)[:, None]
        counts = np.bincount((idx + offsets).ravel(), minlength=b * n).reshape(b, n)
        out[done : done + b] = counts @ matrix / n
        done += b
        if progress is not None:
            progress(done, resamples)
    return Draws(resamples, seed, {k: out[:, i] for i, k in enumerate(names)})
