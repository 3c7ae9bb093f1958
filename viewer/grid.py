"""The outcome grid: per condition, every task's replicates as pass / fail cells, so the noise
floor shows at a glance. Tasks whose outcome flips between replicates come first.

A pure function of outcome rows (dicts as stored or read from outcomes.jsonl): one compact
string of cell codes per task, so a study of thousands of runs is one small JSON document.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

PASS, FAIL, RUN_FAILED, MISSING = "P", "F", "E", "."  # a cell: graded pass / fail, a run that failed, no row
# the failures that mean the run left no answer to grade (nfladder's rows for them); every other
# `failure` is a grader's category (`pass`, `wrong_output`, ...) beside a graded outcome
RUN_FAILURES = frozenset({"agent_error", "agent_timeout"})
MAX_REPLICATES = 1000  # replicate numbers past this are not a study's (a hostile row): such rows are skipped


def _natural(task: str) -> list[Any]:
    """`task/2` before `task/10`."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", task) if p]


def _cell(row: dict[str, Any]) -> str:
    if row.get("failure") in RUN_FAILURES:
        return RUN_FAILED
    outcome = row.get("outcome")
    if isinstance(outcome, bool) or not isinstance(outcome, (int, float)):
        return MISSING
    return PASS if outcome > 0 else FAIL


def grid(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """{"conditions": [{"name", "replicates", "tasks": [{"task", "flips", "cells", "sessions"}],
    "flipping", "runs"}]} in the rows' first-seen condition order; each condition's tasks with a
    flipping outcome (both a pass and a fail) first, each group in natural task order."""
    cells: dict[str, dict[str, dict[int, tuple[str, str | None]]]] = {}
    for row in rows:
        if not isinstance(row, dict):
            continue
        rep = row.get("replicate")
        if isinstance(rep, bool) or not isinstance(rep, int) or not 0 <= rep < MAX_REPLICATES:
            continue
        cond, task = str(row.get("condition")), str(row.get("task_id"))
        session = row.get("session")
        cells.setdefault(cond, {}).setdefault(task, {})[rep] = (_cell(row), str(session) if session else None)
    return {"conditions": [_condition(name, tasks) for name, tasks in cells.items()]}


def _condition(name: str, tasks: dict[str, dict[int, tuple[str, str | None]]]) -> dict[str, Any]:
    width = 1 + max(max(reps) for reps in tasks.values())
    out = []
    for task, reps in tasks.items():
        codes = "".join(reps.get(r, (MISSING, None))[0] for r in range(width))
        sessions = [reps.get(r, (MISSING, None))[1] for r in range(width)]
        out.append({"task": task, "flips": PASS in codes and FAIL in codes, "cells": codes,
                    "sessions": sessions if any(sessions) else None})
    out.sort(key=lambda t: (not t["flips"], _natural(t["task"])))
    return {"name": name, "replicates": width, "tasks": out, "flipping": sum(t["flips"] for t in out),
            "runs": sum(len(reps) for reps in tasks.values())}
