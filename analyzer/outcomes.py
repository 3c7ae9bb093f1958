"""Outcome rows in, aligned task x replicate matrices out.

The statistics need one matrix per condition with the same tasks in the same row order (the
joint bootstrap draws one set of task indices for all of them). Anything that would make that
false is either refused with a one-line error or handled by a documented rule that the report
states: tasks missing from some condition are dropped from all (`intersect`), and a condition whose
tasks have unequal replicate counts keeps the lowest-numbered R_min replicates of each (`trim`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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
    by_cond: dict[str, dict[str, dict[int, Row]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        by_cond[r.condition][r.task_id][r.replicate] = r
    order = _condition_order([r.condition for r in rows])
    warnings: list[str] = []
    all_tasks = sorted({r.task_id for r in rows}, key=_natural)
    common = [t for t in all_tasks if all(t in by_cond[c] for c in order)]
    dropped = {c: tuple(t for t in all_tasks if t not in by_cond[c]) for c in order}
    dropped = {c: ts for c, ts in dropped.items() if ts}
    if dropped:
        detail = "; ".join(f"{c} lacks {len(ts)} ({', '.join(ts[:3])}{'...' if len(ts) > 3 else ''})" for c, ts in dropped.items())
        if missing_tasks == "error":
            raise OutcomeError(f"tasks do not match across conditions: {detail}; pass --missing-tasks intersect to drop them")
        warnings.append(f"dropped {len(all_tasks) - len(common)} tasks missing from some condition: {detail}")
    if not common:
        raise OutcomeError("no task appears in every condition; check the condition and task_id columns")
    conditions = {c: _matrix(c, by_cond[c], common, unbalanced, warnings) for c in order}
    return OutcomeSet(tuple(common), conditions, dropped, tuple(warnings), len(rows))


def _matrix(
    name: str, cells: Mapping[str, Mapping[int, Row]], tasks: Sequence[str], unbalanced: str, warnings: list[str]
) -> ConditionData:
    counts = [len(cells[t]) for t in tasks]
    r_min, r_max = min(counts), max(counts)
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
    picked = [[cells[t][k] for k in sorted(cells[t])[:r_min]] for t in tasks]
    outcomes = np.array([[r.outcome for r in row] for row in picked], dtype=np.int8)
    refs = [[r.reference for r in row if r.reference is not None] for row in picked]
    reference = None
    if all(refs):
        ref_means = np.array([np.mean(x) for x in refs])
        if np.any((ref_means > 0) & (ref_means < 1)):
            warnings.append(f"condition {name!r}: the reference varies within a task; its majority is used")
        reference = (ref_means >= 0.5).astype(np.int8)
    conf = np.array([[np.nan if r.confidence is None else r.confidence for r in row] for row in picked], dtype=float)
    failures: dict[str, int] = defaultdict(int)
    for row in picked:
        for r in row:
            if r.failure:
                failures[r.failure] += 1
    return ConditionData(
        name=name,
        outcomes=outcomes,
        reference=reference,
        confidence=None if np.isnan(conf).all() else conf,
        failures=dict(failures),
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
