"""Outcome rows in, aligned task x replicate matrices out.

The statistics need one matrix per condition with the same tasks in the same row order (the
joint bootstrap draws one set of task indices for all of them). Anything that would make that
false is either refused with a one-line error or handled by a documented rule that the report
states: tasks missing from some condition are dropped from all (`intersect`), and a condition whose
tasks have unequal replicate counts keeps the lowest-numbered R_min replicates of each (`trim`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from noisefloor.analyzer.outcome_columns import NONE, Cells, RowColumns, by_condition, cells, failure_counts, of_rows
from noisefloor.outcome_rows import OutcomeError, OutcomeRow, read, unique_rows

Row = OutcomeRow  # the analyzer reads the one row type the graders write
# The ladder's rungs, in the order a reader expects them; other names keep file order after these.
LADDER_ORDER = ("live", "L0", "t0", "L1", "replay", "L2")


@dataclass(frozen=True)
class ConditionData:
    name: str
    outcomes: np.ndarray  # (N, R) of 0/1, rows in `OutcomeSet.tasks` order
    reference: np.ndarray | None  # (N,) executed reference per task, for judge conditions
    confidence: np.ndarray | None  # (N, R) stated confidence, NaN where absent
    failures: Mapping[str, int]
    trimmed_from: tuple[int, int] | None  # (min, max) replicate counts before trimming


@dataclass(frozen=True)
class OutcomeSet:
    tasks: tuple[str, ...]
    conditions: Mapping[str, ConditionData]
    dropped_tasks: Mapping[str, tuple[str, ...]]  # condition -> tasks it lacked (dropped everywhere)
    warnings: tuple[str, ...]
    rows: int


def load(path: Path, *, missing_tasks: str = "intersect", unbalanced: str = "trim") -> OutcomeSet:
    return build(read(path), missing_tasks=missing_tasks, unbalanced=unbalanced)


def build(rows: Sequence[Row], *, missing_tasks: str = "intersect", unbalanced: str = "trim") -> OutcomeSet:
    """Group rows into aligned matrices, applying (and reporting) the documented rules."""
    unique_rows(rows, where="outcome rows")
    return build_columns(of_rows(rows), missing_tasks=missing_tasks, unbalanced=unbalanced)


def build_columns(cols: RowColumns, *, missing_tasks: str = "intersect", unbalanced: str = "trim") -> OutcomeSet:
    """`build` from rows as columns, one per (condition, task, replicate) (`build` checks that of
    typed rows; `stored_rows` of a store's)."""
    order = _condition_order(cols.conditions)
    code = {name: i for i, name in enumerate(cols.conditions)}
    present = np.zeros((len(cols.conditions), len(cols.tasks)), dtype=bool)
    present[cols.condition, cols.task] = True
    names = cols.tasks
    warnings: list[str] = []
    all_tasks = np.array(sorted(range(len(names)), key=lambda i: _natural(names[i])), dtype=np.intp)
    # a 2-D array's all(axis=0) is 1-D; numpy's stubs type it as maybe a scalar (a 1-D array's)
    in_all = cast("np.ndarray", present[np.array([code[c] for c in order], dtype=np.intp)].all(axis=0))
    common = all_tasks[in_all[all_tasks]].tolist()
    dropped = {} if len(common) == len(names) else {
        c: tuple(names[i] for i in all_tasks[~present[code[c], all_tasks]]) for c in order}
    dropped = {c: ts for c, ts in dropped.items() if ts}
    if dropped:
        detail = "; ".join(f"{c} lacks {len(ts)} ({', '.join(ts[:3])}{'...' if len(ts) > 3 else ''})" for c, ts in dropped.items())
        if missing_tasks == "error":
            raise OutcomeError(f"tasks do not match across conditions: {detail}; pass --missing-tasks intersect to drop them")
        warnings.append(f"dropped {len(all_tasks) - len(common)} tasks missing from some condition: {detail}")
    if not common:
        raise OutcomeError("no task appears in every condition; check the condition and task_id columns")
    place = np.full(len(names), -1, dtype=np.int64)
    place[common] = np.arange(len(common))
    rows_of = by_condition(cols)
    conditions = {c: _matrix(c, cols, cells(cols, rows_of[code[c]], place, len(common)), unbalanced, warnings)
                  for c in order}
    return OutcomeSet(tuple(names[i] for i in common), conditions, dropped, tuple(warnings), len(cols))


def _matrix(name: str, cols: RowColumns, cell: Cells, unbalanced: str, warnings: list[str]) -> ConditionData:
    r_min, r_max = cell.r_min, cell.r_max
    trimmed = None
    if r_min != r_max:
        if unbalanced == "error":
            raise OutcomeError(
                f"condition {name!r}: tasks have {r_min} to {r_max} replicates; pass --unbalanced trim to keep "
                f"the first {r_min} of each"
            )
        trimmed = (r_min, r_max)
        warnings.append(f"condition {name!r}: replicate counts range {r_min}..{r_max}; kept the first {r_min} of each task")
    if r_min < 2:
        raise OutcomeError(
            f"condition {name!r} has a task with {r_min} replicate; within-task variance needs at least 2 per task"
        )
    picked = cell.picked
    ref = cols.reference[picked]
    given = ref != NONE
    reference = None
    if given.any(axis=1).all():  # every task has a reference in some replicate
        ref_means = np.where(given, ref, 0).sum(axis=1) / given.sum(axis=1)
        if np.any((ref_means > 0) & (ref_means < 1)):
            warnings.append(f"condition {name!r}: the reference varies within a task; its majority is used")
        reference = (ref_means >= 0.5).astype(np.int8)
    conf = cols.confidence[picked]
    return ConditionData(
        name=name,
        outcomes=cols.outcome[picked],
        reference=reference,
        confidence=None if np.isnan(conf).all() else conf,
        failures=failure_counts(cols, picked),
        trimmed_from=trimmed,
    )


def _condition_order(names: Iterable[str]) -> list[str]:
    seen = list(dict.fromkeys(names))
    ranked = [n for n in LADDER_ORDER if n in seen]
    return ranked + [n for n in seen if n not in ranked]


def _natural(task: str) -> tuple[Any, ...]:
    """HumanEval/2 before HumanEval/10."""
    head, _, tail = task.rpartition("/")
    return (head, int(tail), "") if tail.isdigit() else (head, -1, tail)
