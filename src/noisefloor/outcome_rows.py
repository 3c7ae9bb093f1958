"""The outcome row: what the graders (nfverify, nfladder) write and the analyzer reads.

One type, with its writer and its reader beside it, so that the contract in DESIGN.md lives in
one place: `task_id`, `condition`, `replicate`, `outcome` (0/1) are required; the rest is
optional: the failure category and its detail, a judge's `reference` and `confidence`, the
tool-calling audit's `endpoint` / `variant` / `fingerprint`, the `session` it came from, and the
stamp the regression gate compares (`model` requested, `served_model`, `temperature`, `top_p`, `seed`,
`grader_version`).
"""

from __future__ import annotations

import codecs
import csv
import itertools
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from noisefloor.errors import InputError
from noisefloor.outputs import atomic_path

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
    """Write atomically: a reader never sees half a file (`outputs.atomic_path`)."""
    with atomic_path(path) as tmp, tmp.open("w") as fh:
        for r in rows:
            fh.write(json.dumps(r.to_json()) + "\n")


MAX_LINE = 16 << 20  # one JSON line or CSV record at most (a detail column may be long, not endless)


def _lines(fh: IO[bytes], path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file read in bounded lines, a leading BOM dropped."""
    for i in itertools.count(1):
        raw = fh.readline(MAX_LINE + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE:
            raise OutcomeError(f"{path}:{i}: line longer than {MAX_LINE >> 20} MiB; outcome rows are short, this "
                               "file is damaged or not an outcomes file")
        if i == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8):]
        try:
            yield i, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise OutcomeError(f"{path}:{i}: byte {raw[exc.start]:#04x} at column {exc.start + 1} is not UTF-8; "
                               "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def read_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, raw mapping) from a .jsonl/.json-lines or .csv/.tsv file; validation of the
    values is the analyzer's (`analyzer.outcomes.parse_rows`). Bounded: lines of at most
    `MAX_LINE`, UTF-8 (a BOM is allowed), each failure one line naming the file and line."""
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".tsv", ".jsonl", ".ndjson", ".json"):
        raise OutcomeError(f"{path}: unknown outcomes format {suffix!r}; use .jsonl or .csv")
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise OutcomeError(f"cannot read outcomes file {path}: {exc.strerror}") from None
    with fh:
        if suffix in (".csv", ".tsv"):
            yield from _csv_rows(_lines(fh, path), path, "\t" if suffix == ".tsv" else ",")
            return
        for i, line in _lines(fh, path):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except RecursionError:
                raise OutcomeError(f"{path}:{i}: JSON nested too deep; one flat object per line expected") from None
            except ValueError:
                raise OutcomeError(f"{path}:{i}: not a JSON object per line (JSON Lines expected)") from None
            if not isinstance(rec, dict):
                raise OutcomeError(f"{path}:{i}: expected a JSON object, got {type(rec).__name__}")
            yield i, rec


def _csv_rows(lines: Iterator[tuple[int, str]], path: Path, delimiter: str) -> Iterator[tuple[int, dict[str, Any]]]:
    csv.field_size_limit(max(csv.field_size_limit(), MAX_LINE))
    where = {"line": 1}

    def text() -> Iterator[str]:
        for i, line in lines:
            where["line"] = i
            yield line

    reader = csv.DictReader(text(), delimiter=delimiter)
    try:
        if reader.fieldnames is None:
            raise OutcomeError(f"{path} is empty; it needs a header with {', '.join(REQUIRED)} and one row per attempt")
        missing = [c for c in REQUIRED if c not in reader.fieldnames]
        if missing:
            raise OutcomeError(f"{path}: missing column {', '.join(missing)} (header has "
                               f"{', '.join(map(repr, reader.fieldnames))})")
        for rec in reader:
            yield where["line"], rec
    except csv.Error as exc:
        raise OutcomeError(f"{path}:{where['line']}: not readable as CSV ({exc}); check its quoting") from None
