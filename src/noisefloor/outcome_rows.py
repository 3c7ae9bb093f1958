"""The outcome row: what the graders (nfverify, nfladder) write and the analyzer reads.

One type owning its reading and writing. `task_id`, `condition`, `replicate` (an int: exchanges
carry it as a text label, converted at that boundary by `replicate_of` / `replicate_label`) and
`outcome` (0/1) are required; the rest is optional: the failure category and its detail, a
judge's `reference` and `confidence`, the tool-calling audit's `endpoint` / `variant` /
`fingerprint`, the `session` it came from, and the stamp the regression gate compares (`model`
requested, `served_model`, `temperature`, `top_p`, `seed`, `grader_version`). A column this
version does not know is kept, as given, in `extra` and written back: never dropped.

Every row written carries `row_version`. A row without one is version 1 (rows written before the
field). `migrate` brings an older row to this version (one step per version in `MIGRATIONS`, the
seam for a future change of meaning) and refuses a row from a newer noisefloor.
"""

from __future__ import annotations

import codecs
import csv
import itertools
import json
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Any

from noisefloor.errors import InputError
from noisefloor.outputs import atomic_path

REQUIRED = ("task_id", "condition", "replicate", "outcome")
ROW_VERSION = 1
VERSION_KEY = "row_version"
# MIGRATIONS[v] turns a version-v row (a mapping) into a version v+1 row; empty while there is one version
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


class OutcomeError(InputError):
    """Input that cannot be analyzed; the message names the row or condition and the fix."""


_TRUE = {"1", "1.0", "true", "True", "TRUE", 1}  # 1 == 1.0 == True as set members
_FALSE = {"0", "0.0", "false", "False", "FALSE", 0}


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
    extra: tuple[tuple[str, Any], ...] = ()  # columns this version does not know, kept as given

    def to_json(self) -> dict[str, Any]:
        """The row as written: its version, the fields (absent optional ones left out), then `extra`."""
        out: dict[str, Any] = {VERSION_KEY: ROW_VERSION}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "extra" and (v is not None or f.name in REQUIRED):
                out[f.name] = v
        return out | dict(self.extra)

    @classmethod
    def from_json(cls, rec: Mapping[str, Any], where: str) -> OutcomeRow:
        """A row from a raw mapping (a JSON line, a CSV record, a stored row), checked value by value;
        each failure is one line naming `where` and the fix."""
        rec = migrate(rec, where)
        missing = [c for c in REQUIRED if rec.get(c) in (None, "")]
        if missing:
            raise OutcomeError(f"{where}: missing {', '.join(missing)}; every row needs {', '.join(REQUIRED)}")
        given = {k: v for k, v in rec.items() if v not in (None, "") and k != VERSION_KEY}
        typed: dict[str, Any] = {}
        for k, v in given.items():
            parse = _PARSERS.get(k)
            if parse is not None:
                typed[k] = parse(v, where, k)
        extra = tuple((k, v) for k, v in given.items() if k not in _PARSERS)
        return cls(**typed, extra=extra)


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
    if isinstance(v, bool):
        raise OutcomeError(f"{where}: {col} {v!r} is not a number")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise OutcomeError(f"{where}: {col} {v!r} is not a number") from None


_PARSERS: dict[str, Callable[[Any, str, str], Any]] = {
    "task_id": _label, "condition": _label, "replicate": _int, "outcome": _binary, "reference": _binary,
    "confidence": _float, "temperature": _float, "top_p": _float, "seed": _int,
    **{k: _label for k in ("failure", "detail", "endpoint", "variant", "fingerprint", "session", "model",
                           "served_model", "grader_version")},
}


def migrate(rec: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`rec` brought to `ROW_VERSION`; a row from a newer noisefloor is refused."""
    raw = rec.get(VERSION_KEY, 1)
    try:
        version = _int(raw, where, VERSION_KEY)
    except OutcomeError:
        raise OutcomeError(f"{where}: {VERSION_KEY} {raw!r} is not a version number") from None
    if version > ROW_VERSION:
        raise OutcomeError(f"{where}: outcome row version {version} is newer than this noisefloor reads "
                           f"({ROW_VERSION}); upgrade noisefloor to read it")
    out = dict(rec)
    for v in range(version, ROW_VERSION):
        out = MIGRATIONS[v](out)
    return out


def parse_rows(raw: Iterable[tuple[int, Mapping[str, Any]]], source: str) -> list[OutcomeRow]:
    """Typed rows from (line, raw mapping) pairs; an empty source is refused."""
    rows = [OutcomeRow.from_json(rec, f"{source}:{line}") for line, rec in raw]
    if not rows:
        raise OutcomeError(f"{source} has no outcome rows; it needs one row per graded attempt")
    return rows


def read(path: Path) -> list[OutcomeRow]:
    """The typed rows of an outcomes file (.jsonl or .csv)."""
    return parse_rows(read_rows(path), str(path))


def replicate_label(replicate: int) -> str:
    """The replicate as an exchange label (labels travel as text in a URL or a header)."""
    return str(int(replicate))


def replicate_of(label: str | int | None) -> int | None:
    """An exchange's replicate label as the row's int; None when it is absent or not a whole number."""
    if label is None:
        return None
    text = str(label).strip()
    return int(text) if text.lstrip("-").isdigit() else None


def row_key(r: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """One graded attempt: a store keeps one row per (condition, task, replicate)."""
    return (r.get("condition"), r.get("task_id"), r.get("replicate"))


def key_of(r: OutcomeRow) -> tuple[str, str, int]:
    """`row_key` of a typed row."""
    return (r.condition, r.task_id, r.replicate)


def unique_rows(rows: Sequence[OutcomeRow], key: Callable[[OutcomeRow], Hashable] = key_of, where: str = "",
                lines: Sequence[int] | None = None) -> None:
    """The one duplicate-row rule: an attempt is one row. A key seen twice is refused with one line
    naming it and both places (`lines`: the rows' line numbers in `where`, else their positions)."""
    seen: dict[Hashable, int] = {}
    for i, r in enumerate(rows):
        k = key(r)
        at = lines[i] if lines is not None else i + 1
        if k in seen:
            place = f"{where}:{at}" if lines is not None else where
            raise OutcomeError(f"{place}: condition {r.condition!r}, task {r.task_id!r}: replicate {r.replicate} "
                               f"appears twice (first at {'line' if lines is not None else 'row'} {seen[k]}); "
                               "each (task_id, condition, replicate) must be one row")
        seen[k] = at


def _comparable(r: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in migrate(r, "outcome row").items() if k != VERSION_KEY}


def new_rows(seen: dict[tuple[Any, Any, Any], tuple[Mapping[str, Any], str]], rows: Iterable[Mapping[str, Any]],
             where: str) -> list[Mapping[str, Any]]:
    """Combining graded rows from several places: the rows not `seen` yet (now recorded there, with
    `where`); a key graded differently in two places is a clash, refused rather than averaged (the
    same grade written by two versions is the same grade)."""
    fresh = []
    for r in rows:
        key = row_key(r)
        if key not in seen:
            seen[key] = (r, where)
            fresh.append(r)
        elif _comparable(seen[key][0]) != _comparable(r):
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
    values is `OutcomeRow.from_json`'s (`parse_rows`). Bounded: lines of at most
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
