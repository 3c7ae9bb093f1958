"""The one bootstrap engine: joint task (instance) resampling (ladder paper, App. A.2).

`index_blocks` is the random stream every bootstrap in the package draws from: blocks of
resampled task indices, whose values depend only on the seed (numpy's bounded-integer stream does
not depend on how it is cut into blocks), so the block size is a memory bound and nothing else.
The floors statistics apply their own functions to resampled matrices; the ladder's statistics
are all task means and take the faster route below.

Every statistic here is a mean over tasks of a per-task quantity (a task's variance, its mean
outcome, whether it varied, whether the judge disagreed). So one resample is a vector of task
multiplicities c (summing to N), and every statistic of that resample is c @ column / N. Drawing
c once per resample and applying it to all columns at once is what makes the bootstrap joint:
conditions and contrasts see the same tasks, and it is a matrix product instead of a loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from noisefloor.analyzer.intervals import Interval, percentile
from noisefloor.errors import InputError

DEFAULT_RESAMPLES = 20_000  # ladder intervals: as seed 000 App. A.2 (20,000 task resamples)
FLOORS_RESAMPLES = 2_000  # floors intervals: each resample recomputes SDs over N x R cells, so fewer; 2.5% ends on 50
MAX_CELLS = 4_000_000  # resampled values held at once (block x N, or block x N x R for the floors)
MAX_BLOCK = 2000  # resamples per block at most: the progress bar's step


def index_blocks(n: int, resamples: int, seed: int | np.random.SeedSequence, cells_per_resample: int | None = None,
                 size: int | None = None) -> Iterator[np.ndarray]:
    """Blocks (b, size) of indices into n tasks drawn with replacement (size defaults to n),
    `resamples` rows in all. The block size only bounds memory (b x cells_per_resample <=
    MAX_CELLS) and the progress steps; the draws are the same for any block size."""
    if resamples < 1:
        raise InputError(f"resamples must be at least 1, got {resamples}")
    if n < 1:
        raise InputError("cannot bootstrap zero tasks")
    size = n if size is None else size
    rng = np.random.default_rng(seed)
    block = max(1, min(MAX_BLOCK, MAX_CELLS // max(1, cells_per_resample or size)))
    done = 0
    while done < resamples:
        b = min(block, resamples - done)
        yield rng.integers(0, n, size=(b, size))
        done += b


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
    out = np.empty((resamples, len(names)))
    done = 0
    for idx in index_blocks(n, resamples, seed):
        b = idx.shape[0]
        offsets = (np.arange(b) * n)[:, None]
        counts = np.bincount((idx + offsets).ravel(), minlength=b * n).reshape(b, n)
        out[done : done + b] = counts @ matrix / n
        done += b
        if progress is not None:
            progress(done, resamples)
    return Draws(resamples, seed, {k: out[:, i] for i, k in enumerate(names)})
