"""The outcome row: what the graders (nfverify, nfladder) write and the analyzer reads.

One type, with its writer and its reader beside it, so that the contract in DESIGN.md lives in
one place: `task_id`, `condition`, `replicate`, `outcome` (0/1) are required; the rest is
optional: the failure category and its detail, a judge's `reference` and `confidence`, the
tool-calling audit's `endpoint` / `variant` / `fingerprint`, the `session` it came from, and the
stamp the regression gate compares (`model` requested, `served_model`, `temperature`, `top_p`, `seed`,
`grader_version`).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from noisefloor.errors import InputError

REQUIRED = ("task_id", "condition", "replicate", "outcome")


class OutcomeError(InputError):
    """Input that cannot be analyzed; the message names the row or condition and the fix."""


@dataclass(frozen=True)
class OutcomeRow:
    task_id: str
    condition: str
    replicate: int
    outcome: int
    failure: str | None = None
    detail: str | None = None
    reference: int | None = None
    confidence: float | None = None
    endpoint: str | None = None
    variant: str | None = None
    fingerprint: str | None = None
    session: str | None = None
    model: str | None = None  # as the request asked for it
    served_model: str | None = None  # as the answer named it
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    grader_version: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The row as written: absent optional fields are left out."""
        return {k: v for k, v in asdict(self).items() if v is not None or k in REQUIRED}


def row_key(r: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """One graded attempt: a store keeps one row per (condition, task, replicate)."""
    return (r.get("condition"), r.get("task_id"), r.get("replicate"))


def new_rows(seen: dict[tuple[Any, Any, Any], tuple[Mapping[str, Any], str]], rows: Iterable[Mapping[str, Any]],
             where: str) -> list[Mapping[str, Any]]:
    """Combining graded rows from several places: the rows not `seen` yet (now recorded there, with
    `where`); a key graded differently in two places is a clash, refused rather than averaged."""
    fresh = []
    for r in rows:
        key = row_key(r)
        if key not in seen:
            seen[key] = (r, where)
            fresh.append(r)
        elif seen[key][0] != r:
            raise OutcomeError(f"outcome row {key} is in {seen[key][1]} and in {where} with different grades; grade "
                               "the stores again together (nfverify SUITE LOG...) or keep them apart")
    return fresh


def write_jsonl(rows: Iterable[OutcomeRow], path: Path) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as fh:
        for r in rows:
            fh.write(json.dumps(r.to_json()) + "\n")
    os.replace(tmp, path)


def read_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, raw mapping) from a .jsonl/.json-lines or .csv/.tsv file; validation of the
    values is the analyzer's (`analyzer.outcomes.parse_rows`)."""
    suffix = path.suffix.lower()
    try:
        fh = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise OutcomeError(f"cannot read outcomes file {path}: {exc.strerror}") from None
    with fh:
        if suffix in (".csv", ".tsv"):
            reader = csv.DictReader(fh, delimiter="\t" if suffix == ".tsv" else ",")
            if reader.fieldnames is None:
                raise OutcomeError(f"{path} is empty; it needs a header with {', '.join(REQUIRED)} and one row per attempt")
            missing = [c for c in REQUIRED if c not in reader.fieldnames]
            if missing:
                raise OutcomeError(f"{path}: missing column {', '.join(missing)} (header has {', '.join(reader.fieldnames)})")
            for i, rec in enumerate(reader, start=2):
                yield i, rec
        elif suffix in (".jsonl", ".ndjson", ".json"):
            for i, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    raise OutcomeError(f"{path}:{i}: not a JSON object per line (JSON Lines expected)") from None
                if not isinstance(rec, dict):
                    raise OutcomeError(f"{path}:{i}: expected a JSON object, got {type(rec).__name__}")
                yield i, rec
        else:
            raise OutcomeError(f"{path}: unknown outcomes format {suffix!r}; use .jsonl or .csv")
