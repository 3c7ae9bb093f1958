"""Judge repeatability versus reference agreement (ladder paper, Sec. 5.3, App. D).

A judge condition holds one frozen candidate per task and repeats the verdict R times. Its
verdict variance is the ordinary w of that condition; agreement is a separate question, asked of
the majority verdict against the executed reference.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from noisefloor.analyzer.intervals import Interval, clopper_pearson


@dataclass(frozen=True)
class JudgeColumns:
    """Per-task indicators, ready for the joint bootstrap."""

    disagree: np.ndarray
    false_accept: np.ndarray
    false_reject: np.ndarray
    tie: np.ndarray


@dataclass(frozen=True)
class JudgeStats:
    tasks: int
    disagreements: int
    disagreement: float
    disagreement_ci: Interval
    false_accepts: int
    false_rejects: int
    ties: int
    mean_confidence: float | None
    disagreement_ci_method: str = "task_bootstrap"  # clopper_pearson when no task (or every task) disagreed

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"disagreement_ci": self.disagreement_ci.to_json()}


def judge_columns(verdicts: np.ndarray, reference: np.ndarray) -> JudgeColumns:
    """Majority verdict per task against the reference; an exact tie counts as a disagreement."""
    share = np.asarray(verdicts, dtype=float).mean(axis=1)
    ref = np.asarray(reference).astype(bool)
    tie = share == 0.5
    majority = share > 0.5
    fa = ~tie & majority & ~ref
    fr = ~tie & ~majority & ref
    return JudgeColumns(disagree=(fa | fr | tie).astype(float), false_accept=fa.astype(float),
                        false_reject=fr.astype(float), tie=tie.astype(float))


def judge_stats(cols: JudgeColumns, ci: Interval, confidence: np.ndarray | None) -> JudgeStats:
    """`ci`: the task-bootstrap interval of the disagreement share. When no task (or every task)
    disagreed it is [0, 0] (or [1, 1]), which no finite sample supports: the exact binomial
    interval for the share replaces it."""
    n = len(cols.disagree)
    k = int(cols.disagree.sum())
    method = "task_bootstrap"
    if k in (0, n):
        ci, method = clopper_pearson(k, n), "clopper_pearson"
    conf = None
    if confidence is not None and not np.isnan(confidence).all():
        conf = float(np.nanmean(confidence))
    return JudgeStats(
        tasks=n,
        disagreements=k,
        disagreement=float(cols.disagree.mean()),
        disagreement_ci=ci,
        false_accepts=int(cols.false_accept.sum()),
        false_rejects=int(cols.false_reject.sum()),
        ties=int(cols.tie.sum()),
        mean_confidence=conf,
        disagreement_ci_method=method,
    )
