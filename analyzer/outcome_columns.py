"""Outcome rows as columns: what the ladder's matrices are built from, a few bytes a row.

A study kept in a store can hold hundreds of thousands of graded rows; as row objects they cost
about 2 kB each. The matrices need only five values of a row (condition, task, replicate, outcome,
reference), its confidence and its failure category, so those are kept here as numpy arrays, the
texts numbered (`conditions`, `tasks`, `failures` in the order first seen). `outcomes.build` makes
its matrices from these columns whatever the rows came from: typed rows (`of_rows`) or a store's
rows decoded straight into columns (`stored_rows`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

NONE = -1  # a reference or a failure the row does not give


@dataclass(frozen=True)
class RowColumns:
    """One entry per row, in row order; texts as indices into the name tuples."""

    conditions: tuple[str, ...]  # in the order the rows first name them
    tasks: tuple[str, ...]
    failures: tuple[str, ...]
    condition: np.ndarray  # int32 index into `conditions`
    task: np.ndarray  # int32 index into `tasks`
    replicate: np.ndarray  # int64
    outcome: np.ndarray  # int8, 0/1
    reference: np.ndarray  # int8, 0/1 or NONE
    confidence: np.ndarray  # float64, NaN where absent
    failure: np.ndarray  # int32 index into `failures`, or NONE

    def __len__(self) -> int:
        return int(self.condition.size)


class Numbering:
    """Texts numbered in the order first seen (one dict lookup a row)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def of(self, texts: Iterable[str]) -> list[int]:
        ids = self.ids
        return [ids[t] if t in ids else ids.setdefault(t, len(ids)) for t in texts]

    def names(self) -> tuple[str, ...]:
        return tuple(self.ids)


def of_rows(rows: Sequence[Any]) -> RowColumns:
    """The columns of typed rows (`OutcomeRow`s); a falsy failure counts as none, as it always has."""
    conds, tasks, fails = Numbering(), Numbering(), Numbering()
    c = conds.of(r.condition for r in rows)
    t = tasks.of(r.task_id for r in rows)
    f = [fails.of((r.failure,))[0] if r.failure else NONE for r in rows]
    return RowColumns(
        conditions=conds.names(), tasks=tasks.names(), failures=fails.names(),
        condition=np.array(c, dtype=np.int32),
        task=np.array(t, dtype=np.int32),
        replicate=replicates([r.replicate for r in rows]),
        outcome=np.array([r.outcome for r in rows], dtype=np.int8),
        reference=np.array([NONE if r.reference is None else r.reference for r in rows], dtype=np.int8),
        confidence=np.array([np.nan if r.confidence is None else r.confidence for r in rows], dtype=float),
        failure=np.array(f, dtype=np.int32),
    )


def replicates(values: list[Any]) -> np.ndarray:
    """Replicates as int64 in the same order: as they are when they fit, else their ranks (a file's
    replicate may be any whole number; only their order and equality matter to the matrices)."""
    if all(type(v) is int for v in values):
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            pass
    rank = {v: i for i, v in enumerate(sorted(set(values)))}
    return np.array([rank[v] for v in values], dtype=np.int64)


@dataclass(frozen=True)
class Cells:
    """One condition's rows picked for its matrix: `picked` (N, R) row indices, tasks in the given
    order and each task's lowest-numbered R replicates, with the replicate counts before picking."""

    picked: np.ndarray
    r_min: int
    r_max: int


def by_condition(cols: RowColumns) -> list[np.ndarray]:
    """Each condition's row indices (ascending), one array per entry of `cols.conditions`: one
    stable sort of the rows, so that grouping costs the same for 3 conditions or 3,000."""
    order = np.argsort(cols.condition, kind="stable")
    ends = np.cumsum(np.bincount(cols.condition, minlength=len(cols.conditions)))
    return np.split(order, ends[:-1])


def cells(cols: RowColumns, mine: np.ndarray, task_pos: np.ndarray, n_tasks: int) -> Cells:
    """The rows `mine` (one condition's, `by_condition`) whose task has a place in `task_pos` (task
    index -> row of the matrix, -1: left out), grouped by that place, each group's replicates
    ascending; every place is assumed to hold at least one row."""
    pos = task_pos[cols.task[mine]]
    mine, pos = mine[pos >= 0], pos[pos >= 0]
    order = np.lexsort((cols.replicate[mine], pos))
    mine, pos = mine[order], pos[order]
    counts = np.bincount(pos, minlength=n_tasks)
    r_min, r_max = int(counts.min()), int(counts.max())
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.arange(mine.size) - starts[pos]
    picked = mine[rank < r_min].reshape(n_tasks, r_min)
    return Cells(picked, r_min, r_max)


def failure_counts(cols: RowColumns, picked: np.ndarray) -> dict[str, int]:
    """Failure categories of the picked rows, counted, in the order the matrix meets them."""
    f = cols.failure[picked.ravel()]
    f = f[f != NONE]
    if not f.size:
        return {}
    names, first, counts = np.unique(f, return_index=True, return_counts=True)
    return {cols.failures[int(names[i])]: int(counts[i]) for i in np.argsort(first, kind="stable")}
