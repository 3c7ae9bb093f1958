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

from noisefloor.outcome_rows import REQUIRED as REQUIRED
from noisefloor.outcome_rows import OutcomeError as OutcomeError
from noisefloor.outcome_rows import OutcomeRow
from noisefloor.outcome_rows import read_rows as read_rows

Row = OutcomeRow  # the analyzer reads the one row type the graders write
_TEXT = ("failure", "detail", "endpoint", "variant", "fingerprint", "session", "model", "served_model",
         "grader_version")

_TRUE = {"1", "1.0", "true", "True", "TRUE", 1}  # 1 == 1.0 == True as set members
_FALSE = {"0", "0.0", "false", "False", "FALSE", 0}
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


def parse_rows(raw: Iterable[tuple[int, Mapping[str, Any]]], source: str) -> list[Row]:
    rows = []
    for line, rec in raw:
        where = f"{source}:{line}"
        missing = [c for c in REQUIRED if rec.get(c) in (None, "")]
        if missing:
            raise OutcomeError(f"{where}: missing {', '.join(missing)}; every row needs {', '.join(REQUIRED)}")
        given = {k: v for k, v in rec.items() if v not in (None, "")}
        rows.append(
            OutcomeRow(
                task_id=_label(rec["task_id"], where, "task_id"),
                condition=_label(rec["condition"], where, "condition"),
                replicate=_int(rec["replicate"], where, "replicate"),
                outcome=_binary(rec["outcome"], where, "outcome"),
                reference=_binary(given["reference"], where, "reference") if "reference" in given else None,
                confidence=_float(given["confidence"], where, "confidence") if "confidence" in given else None,
                temperature=_float(given["temperature"], where, "temperature") if "temperature" in given else None,
                top_p=_float(given["top_p"], where, "top_p") if "top_p" in given else None,
                seed=_int(given["seed"], where, "seed") if "seed" in given else None,
                **{k: _label(given[k], where, k) for k in _TEXT if k in given},
            )
        )
    if not rows:
        raise OutcomeError(f"{source} has no outcome rows; it needs one row per graded attempt")
    return rows


def load(path: Path, *, missing_tasks: str = "intersect", unbalanced: str = "trim") -> OutcomeSet:
    return build(parse_rows(read_rows(path), str(path)), missing_tasks=missing_tasks, unbalanced=unbalanced)


def build(rows: Sequence[Row], *, missing_tasks: str = "intersect", unbalanced: str = "trim") -> OutcomeSet:
    """Group rows into aligned matrices, applying (and reporting) the documented rules."""
    by_cond: dict[str, dict[str, dict[int, Row]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        cell = by_cond[r.condition][r.task_id]
        if r.replicate in cell:
            raise OutcomeError(
                f"condition {r.condition!r}, task {r.task_id!r}: replicate {r.replicate} appears twice; "
                "each (task_id, condition, replicate) must be one row"
            )
        cell[r.replicate] = r
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


def _label(v: Any, where: str, col: str) -> str:
    """A text column: a string or a number, nothing else (a list or an object is a wrong file)."""
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise OutcomeError(f"{where}: {col} is a {type(v).__name__}, not text; write it as a string")
    return str(v)


def _binary(v: Any, where: str, col: str) -> int:
    if isinstance(v, (str, int, float, bool)):
        if v in _TRUE:
            return 1
        if v in _FALSE:
            return 0
    raise OutcomeError(f"{where}: {col} {v!r} is not binary; use 0/1, true/false or 0.0/1.0")


def _int(v: Any, where: str, col: str) -> int:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise OutcomeError(f"{where}: {col} {v!r} is not an integer") from None
    if not f.is_integer():
        raise OutcomeError(f"{where}: {col} {v!r} is not an integer")
    return int(f)


def _float(v: Any, where: str, col: str) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        raise OutcomeError(f"{where}: {col} {v!r} is not a number") from None
