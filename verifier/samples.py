"""EvalPlus samples files: one JSON object per line with `task_id` and `solution` (a whole
program) or `completion` (the body after the task's prompt), read bounded and typed.

Replicate k of a task is its k-th sample in the file. Every failure is one line naming the file,
the line and what to do, before any candidate runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from noisefloor import bounded
from noisefloor.errors import InputError
from noisefloor.outcome_rows import OutcomeRow
from noisefloor.verifier.rows import Pending

WHAT = "one JSON object per line with task_id and solution (or completion)"


class SamplesError(InputError):
    """A samples file that cannot be graded as given."""


def read_samples(path: Path, tasks: Mapping[str, Any], condition: str) -> list[Pending]:
    """One pending row per sample (its program to run), in file order."""
    seen: dict[str, int] = defaultdict(int)
    out: list[Pending] = []
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise SamplesError(f"cannot read samples file {path}: {exc.strerror}") from None
    with fh:
        for n, doc in bounded.json_lines(fh, str(path), SamplesError, what=WHAT):
            tid = doc.get("task_id")
            if not isinstance(tid, str) or tid not in tasks:
                raise SamplesError(f"{path}:{n}: unknown task_id {str(tid)[:80]!r} for this dataset; check the "
                                   "suite and --dataset")
            out.append(Pending(OutcomeRow(tid, condition, seen[tid], 0), _program(path, n, doc, tasks[tid].prompt)))
            seen[tid] += 1
    return out


def _program(path: Path, n: int, doc: Mapping[str, Any], prompt: str) -> str:
    for name, prefix in (("solution", ""), ("completion", prompt)):
        if name in doc:
            if not isinstance(doc[name], str):
                raise SamplesError(f"{path}:{n}: {name!r} is a {type(doc[name]).__name__}, not a string of code")
            return prefix + doc[name]
    raise SamplesError(f"{path}:{n}: a sample needs 'solution' or 'completion'")
