"""Reading one gate run from an outcomes file: the edge where the gate's pure statistics
(`gate.py`) meet files."""

from __future__ import annotations

from pathlib import Path

from noisefloor.analyzer.gate import GateRun, run_of
from noisefloor.outcome_rows import OutcomeError, read_rows, unique_rows
from noisefloor.outcome_rows import parse_rows as parse

NO_CONDITION = "(none)"  # the condition column is optional in gate input


def load_run(path: Path, condition: str | None = None) -> GateRun:
    """Per-case counts and the stamp of one run file; duplicated (case, replicate) rows and rows of
    several conditions are refused, as `analyze` refuses them."""
    raw = [(i, rec if rec.get("condition") not in (None, "") else {**rec, "condition": NO_CONDITION})
           for i, rec in read_rows(path)]
    rows = parse(raw, str(path))
    lines = [i for i, _ in raw]
    conds = sorted({r.condition for r in rows})
    if condition is not None:
        picked = [(line, r) for line, r in zip(lines, rows) if r.condition == condition]
        if not picked:
            raise OutcomeError(f"{path}: no rows of condition {condition!r} (it has {', '.join(conds)})")
        lines, rows = [line for line, _ in picked], [r for _, r in picked]
    elif len(conds) > 1:
        raise OutcomeError(f"{path}: rows of several conditions ({', '.join(conds)}) would be pooled; "
                           "pass --condition NAME")
    unique_rows(rows, where=str(path), lines=lines)
    return run_of(rows)
