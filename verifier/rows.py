"""Candidates to outcome rows: the one place a candidate becomes a row and a verdict fills it,
for nfverify and nfladder alike, so a row never depends on which command graded it.

A row says which session it grades, the exchange's fingerprint, the model asked for and the one
that answered, and the sampling the request carried. Grading is a function from (task id,
candidate text) pairs to verdicts (anything with `outcome`, `failure` and `detail`): the code
grader, the BFCL checker, or an executor that fans grading out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from noisefloor.outcome_rows import OutcomeRow
from noisefloor.verifier.candidates import Candidate

Grade = Callable[[Sequence[tuple[str, str]]], Sequence[Any]]  # (task id, text) pairs -> verdicts, in order


def candidate_row(c: Candidate, **fields: Any) -> OutcomeRow:
    """The row of a candidate before its verdict; `fields` set the rest (or override the log's labels)."""
    ex, req = c.exchange, c.requested
    base: dict[str, Any] = {
        "task_id": c.task_id, "condition": c.condition, "replicate": c.replicate, "outcome": 0,
        "session": c.session, "fingerprint": ex.fingerprint if ex else None, "model": req.model,
        "served_model": ex.model if ex else None, "temperature": req.temperature, "top_p": req.top_p,
        "seed": req.seed,
    }
    return OutcomeRow(**(base | fields))


def with_verdict(row: OutcomeRow, v: Any) -> OutcomeRow:
    return replace(row, outcome=v.outcome, failure=v.failure, detail=v.detail)


@dataclass(frozen=True)
class Pending:
    """A row waiting for its verdict, with the candidate text to grade (answer text, or a program)."""
    row: OutcomeRow
    text: str

    @property
    def item(self) -> tuple[str, str]:
        return self.row.task_id, self.text


def grade_pending(pending: Sequence[Pending], grade: Grade) -> list[OutcomeRow]:
    """Every pending row with its verdict, in order."""
    verdicts = grade([p.item for p in pending]) if pending else []
    return [with_verdict(p.row, v) for p, v in zip(pending, verdicts)]


def chunks(items: Iterable[Pending], size: int) -> Iterator[list[Pending]]:
    """Pending rows in lists of `size`: grading holds one list's texts at a time, not a whole study's."""
    batch: list[Pending] = []
    for it in items:
        batch.append(it)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
