"""The one bootstrap engine: instances (tasks) resampled with replacement (ladder paper, App. A.2).

`index_blocks` is the random stream every bootstrap in the package draws from: blocks of
resampled task indices, whose values depend only on the seed (numpy's bounded-integer stream does
not depend on how it is cut into blocks), so the block size is a memory bound and nothing else.
Two ways to use it:

- `task_bootstrap`, for statistics that are means over tasks of a per-task quantity (a task's
  variance, its mean outcome, whether the judge disagreed): one resample is a vector of task
  multiplicities c, and every statistic of it is c @ column / N, all columns at once. Drawing c
  once per resample for every column is what makes the bootstrap joint: conditions and contrasts
  see the same tasks.
- `instance_bootstrap`, for any statistic of resampled matrices (SDs over runs, correlations,
  ratios): the function gets every array's rows drawn with the same indices, so a main arm and its
  variants stay matched.

One default number of resamples, `DEFAULT_RESAMPLES`, serves both. Both put the tasks in an
order of their own values first (`canonical_order`), so the draws, and every interval, are the
same whatever the tasks are called and in whatever order they come.

A statistic whose resamples are undefined (0/0) in more than `MAX_UNDEFINED` of the draws gets no
interval: the defined ones alone would describe a different population of resamples (those that
happened to draw the one flip), and a point interval from them would look like certainty.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from noisefloor.analyzer.intervals import Interval, centred, percentile, percentiles
from noisefloor.errors import InputError

MAX_UNDEFINED = 0.10  # share of undefined resamples above which an interval is undefined too
DEFAULT_RESAMPLES = 20_000  # every interval: the ladder paper's 20,000 task resamples (2.5% ends on 500 draws)
MAX_CELLS = 4_000_000  # resampled values held at once (block x N, or block x N x R for matrices)
MAX_BLOCK = 2000  # resamples per block at most: the progress bar's step

K = TypeVar("K", bound=Hashable)


def block_sizes(total: int, cells_per_item: int) -> Iterator[int]:
    """Split `total` draws into blocks that hold at most MAX_CELLS values (and MAX_BLOCK draws)."""
    block = max(1, min(MAX_BLOCK, MAX_CELLS // max(1, cells_per_item)))
    done = 0
    while done < total:
        b = min(block, total - done)
        yield b
        done += b


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
    for b in block_sizes(resamples, cells_per_resample or size):
        yield rng.integers(0, n, size=(b, size))


def canonical_order(rows: np.ndarray) -> np.ndarray:
    """Indices that sort the rows of a (N, ...) array by their values: the same rows in any order
    come out in one order (rows that are equal are interchangeable)."""
    arr = np.asarray(rows, dtype=float)
    flat = arr.reshape(len(arr), int(np.prod(arr.shape[1:])))
    if flat.shape[0] < 2 or flat.shape[1] == 0:
        return np.arange(len(rows))
    return np.lexsort(flat.T[::-1])


_CI_COLUMNS = 64  # columns whose intervals `Draws.cis` takes in one call


@dataclass(frozen=True)
class Draws:
    """Resampled means, one array of length `resamples` per named column."""

    resamples: int
    seed: int
    values: Mapping[str, np.ndarray]

    def ci(self, name: str, alpha: float = 0.05) -> Interval:
        return percentile(self.values[name], alpha)

    def cis(self, names: Sequence[str], alpha: float = 0.05) -> dict[str, Interval]:
        """`ci` of each of `names`, `_CI_COLUMNS` at a time (one numpy call for their finite
        columns; the chunk bounds the copy they are stacked into)."""
        out: dict[str, Interval] = {}
        for i in range(0, len(names), _CI_COLUMNS):
            chunk = names[i:i + _CI_COLUMNS]
            out.update(zip(chunk, percentiles(np.stack([self.values[k] for k in chunk]), alpha), strict=True))
        return out


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
    matrix = matrix[canonical_order(matrix)]
    n = matrix.shape[0]
    if n == 0:
        raise InputError("cannot bootstrap zero tasks")
    out = np.empty((resamples, len(names)))
    done = 0
    for counts in multiplicity_blocks(n, resamples, seed):
        b = counts.shape[0]
        out[done : done + b] = counts @ matrix / n
        done += b
        if progress is not None:
            progress(done, resamples)
    return Draws(resamples, seed, {k: out[:, i] for i, k in enumerate(names)})


COUNT_CELLS = 1 << 18  # draws held at once while a block's multiplicities are counted (2 MB)


def multiplicity_blocks(n: int, resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Blocks (b, n) of task multiplicities (float64: how often each task is drawn in each of b
    resamples) of `index_blocks`' draws, block for block the same b (BLAS sums a product's rows
    differently with their number: the same blocks, the same bits). The draws are taken and
    counted COUNT_CELLS at a time into one buffer that every block reuses, so the bootstrap holds
    one block of counts, not four block-sized arrays (draws, offset draws, counts, their floats)."""
    rng = np.random.default_rng(seed)
    rows = max(1, COUNT_CELLS // n)
    buf = np.empty((0, n))
    for b in block_sizes(resamples, n):
        if buf.shape[0] != b:
            buf = np.empty((b, n))
        for r0 in range(0, b, rows):
            r1 = min(b, r0 + rows)
            idx = rng.integers(0, n, size=(r1 - r0, n))  # the stream does not depend on how it is cut
            idx += (np.arange(r1 - r0) * n)[:, None]
            buf[r0:r1] = np.bincount(idx.ravel(), minlength=(r1 - r0) * n).reshape(r1 - r0, n)
        yield buf


@dataclass(frozen=True)
class Resampled:
    """What the resamples of one statistic were: the share left out as undefined (0/0) and the
    share that was +inf (kept in the interval, which is then open above)."""

    undefined: float
    infinite: float


def instance_bootstrap(arrays: Mapping[str, np.ndarray], stat: Callable[[Mapping[str, np.ndarray]], Mapping[K, np.ndarray]],
                       resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                       alpha: float = 0.05) -> tuple[dict[K, Interval], dict[K, Resampled]]:
    """Intervals of every statistic `stat` returns, with the instances (axis 0 of every array)
    drawn jointly: the same draw for the main arm and every variant. `stat` takes stacks
    (..., N, R) and returns one value per resample under each key; `stat` of the arrays
    themselves is the estimate. Each interval is the percentile interval centred on its estimate
    (`intervals.centred`: SDs, their medians and ratios are biased under resampling, and a
    plain percentile interval can miss its own estimate). Undefined (NaN) resamples are left out
    and counted, and above MAX_UNDEFINED of them there is no interval, nor for an undefined
    estimate; infinite ones stay in."""
    n = next(iter(arrays.values())).shape[0]
    point = {k: float(v) for k, v in stat(dict(arrays)).items()}
    order = canonical_order(np.concatenate([np.asarray(a, dtype=float).reshape(n, -1) for a in arrays.values()], axis=1))
    arrays = {name: arr[order] for name, arr in arrays.items()}
    draws: dict[K, list[np.ndarray]] = {}
    cells = sum(int(np.prod(a.shape)) for a in arrays.values())
    for idx in index_blocks(n, resamples, seed, cells):
        for k, v in stat({name: arr[idx] for name, arr in arrays.items()}).items():
            draws.setdefault(k, []).append(np.asarray(v, dtype=float))
    out: dict[K, Interval] = {}
    notes: dict[K, Resampled] = {}
    for k, parts in draws.items():
        v = np.concatenate(parts)
        nan = np.isnan(v)
        v = v[~nan]
        notes[k] = Resampled(float(nan.mean()), float(np.isinf(v).sum() / nan.size))
        if v.size and nan.mean() <= MAX_UNDEFINED and not np.isnan(point[k]):  # an undefined estimate has none
            out[k] = centred(v, point[k], alpha)
    return out, notes
