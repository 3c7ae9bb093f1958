"""An outcomes file's rows read straight into columns (`outcome_columns.RowColumns`), for
`nfanalyze --outcomes FILE`: a million rows are too many to build one typed row
(`OutcomeRow.from_json`) each.

Exact or not at all, as `stored_rows` is for a store: a row is taken here only when the full
parse (`outcome_rows.read` + `OutcomeRow.from_json`) would keep its values as they are read here,
and nothing about it would be refused there. Anything else (a column this version does not
read here, an outcome not written as the full parse's 0/1 spellings, a replicate that is not a
plain whole number, a missing or empty value where one is required, a ragged CSV record, another
row version, a (condition, task, replicate) given twice, the floors' or the gate's rows) makes
`read` answer None, and the caller reads the file the full way, which names the first bad row
exactly as before. JSON Lines go through `stored_rows.decoded` (the stored rows' own strict type).
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Iterator
from pathlib import Path

from noisefloor.analyzer import stored_rows
from noisefloor.analyzer.outcome_columns import NONE, RowColumns
from noisefloor.outcome_rows import MAX_LINE, OutcomeError, _lines

CHUNK = 8192  # rows read at once: their texts are what the read holds beside the columns
# the full parse's spellings of 0/1 (outcome_rows._TRUE / _FALSE as CSV text gives them)
_BINARY = {"1": 1, "1.0": 1, "true": 1, "True": 1, "TRUE": 1, "0": 0, "0.0": 0, "false": 0, "False": 0, "FALSE": 0}
_MAX_DIGITS = 15  # a replicate the full parse (through float) keeps exactly
# CSV columns read here: the ones the matrices use, and labels the full parse takes as any text
_USED = ("task_id", "condition", "replicate", "outcome", "reference", "confidence", "failure", "row_version")
_TEXT = ("detail", "fingerprint", "session", "model", "served_model", "grader_version")


def read(path: Path) -> RowColumns | None:
    """The rows of a .jsonl or .csv outcomes file as columns, or None where the full parse is needed
    (also for a file that cannot be read: the full parse says why)."""
    suffix = path.suffix.lower()
    try:
        with path.open("rb") as fh:
            if suffix in (".jsonl", ".ndjson", ".json"):
                cols = _jsonl(_lines(fh, path))
            elif suffix in (".csv", ".tsv"):
                cols = _csv(_lines(fh, path), "\t" if suffix == ".tsv" else ",")
            else:
                return None
    except (OSError, OutcomeError):
        return None
    return cols if cols is not None and len(cols) else None


def _jsonl(lines: Iterator[tuple[int, str]]) -> RowColumns | None:
    """Through the stored rows' strict decoder, CHUNK lines at a time; blank lines are skipped, as
    the full parse skips them."""
    reader = stored_rows.RowsReader()
    texts = (line.encode() for _, line in lines if line.strip())
    while chunk := list(itertools.islice(texts, CHUNK)):
        rows = stored_rows.decoded([t.rstrip(b"\r\n") for t in chunk])
        if rows is None or not reader.add(rows):
            return None
    if not reader.parts:
        return None
    return reader.columns()  # None for an empty task or condition, or a repeated key


def _csv(lines: Iterator[tuple[int, str]], delimiter: str) -> RowColumns | None:
    csv.field_size_limit(max(csv.field_size_limit(), MAX_LINE))
    records = csv.reader((line for _, line in lines), delimiter=delimiter)
    try:
        header = next(records, None)
        if header is None or len(set(header)) != len(header) or not set(_USED[:4]) <= set(header) \
                or not set(header) <= {*_USED, *_TEXT}:
            return None
        width, at = len(header), {name: header.index(name) for name in header}
        out = stored_rows.RowsReader()
        while chunk := list(itertools.islice(records, CHUNK)):
            if any(len(r) != width for r in chunk):
                return None  # ragged, or a blank line: the full parse's to judge
            if not _csv_chunk(chunk, at, out):
                return None
    except csv.Error:
        return None
    return out.columns() if out.parts else None  # None for a repeated key


def _csv_chunk(chunk: list[list[str]], at: dict[str, int], out: stored_rows.RowsReader) -> bool:
    """Add one chunk's columns; False when a value is not one the full parse keeps as read here."""
    def col(name: str) -> list[str] | None:
        return [r[at[name]] for r in chunk] if name in at else None

    cond, task, rep, outc = col("condition"), col("task_id"), col("replicate"), col("outcome")
    assert cond is not None and task is not None and rep is not None and outc is not None
    if "" in cond or "" in task:
        return False
    version = col("row_version")
    if version is not None and set(version) != {"1"}:
        return False
    if not all(len(v) <= _MAX_DIGITS and (v.isdigit() or (v[:1] == "-" and v[1:].isdigit())) and v.isascii()
               for v in rep):
        return False
    try:
        outcome = [_BINARY[v] for v in outc]
        refs = col("reference")
        reference = [NONE] * len(chunk) if refs is None else [NONE if v == "" else _BINARY[v] for v in refs]
    except KeyError:
        return False
    conf = col("confidence")
    try:
        confidence = [math.nan] * len(chunk) if conf is None else [math.nan if v == "" else float(v) for v in conf]
    except ValueError:
        return False
    failure = col("failure") or [""] * len(chunk)
    out.add_columns(cond, task, [int(v) for v in rep], outcome, reference, confidence, failure)
    return True
