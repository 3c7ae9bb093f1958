"""inspect_ai eval logs as outcome rows, read without inspect installed.

An inspect user already has the logs: one per `inspect eval` run. Each scored sample becomes a
row: the sample id is the task, the epoch (from 1) is the replicate (from 0), and the first
scorer's value the outcome: `C`, `True` or a number at or above `pass_at` passes; `I`, `N`,
`False` or a smaller number fails; partial credit (`P`) is refused unless `pass_at` says how to
read it. `.eval` logs are zip archives whose entries may be zstd-compressed (method 93, which the
standard library cannot read); `.json` logs are one JSON document.

Logs are input from outside: every entry is expanded with a cap and parsed within the bounds of
`noisefloor.bounded`, every field used is type-checked, and only what a row needs of each sample
is kept; a failure is one line naming the file and entry.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

from noisefloor import bounded
from noisefloor.outcome_rows import OutcomeError

_ZSTD = 93
_PASS = {"C": 1, "I": 0, "N": 0}


def _entry(archive: zipfile.ZipFile, path: Path, name: str) -> Any:
    """One archive entry as JSON, expanded with a cap (a zip bomb stops at the cap, not at 1 GiB)."""
    where = f"{path} entry {name}"
    info = archive.getinfo(name)
    if info.compress_type in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        with archive.open(name) as fh:
            data = bounded.read_capped(fh, where, error=OutcomeError)
    elif info.compress_type == _ZSTD:
        with path.open("rb") as fh:  # the local header's name and extra lengths locate the data
            fh.seek(info.header_offset)
            head = fh.read(30)
            name_len, extra_len = struct.unpack("<HH", head[26:30])
            fh.seek(info.header_offset + 30 + name_len + extra_len)
            raw = fh.read(info.compress_size)
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)) as reader:
            data = bounded.read_capped(reader, where, error=OutcomeError)
    else:
        raise OutcomeError(f"{where} uses zip compression {info.compress_type}, which nfanalyze cannot read; "
                           "rewrite the log with inspect (inspect log convert)")
    return bounded.loads(data, where, error=OutcomeError)


@dataclass(frozen=True)
class _Sample:
    """What an outcome row needs of one sample (the rest of a sample, its transcript, is dropped)."""

    id: str
    epoch: int
    scores: dict[str, Any]


def _sample(doc: Any, where: str) -> _Sample:
    if not isinstance(doc, dict):
        raise OutcomeError(f"{where}: a sample is a {type(doc).__name__}, not an object; the log is damaged")
    sid, epoch, scores = doc.get("id"), doc.get("epoch", 1), doc.get("scores") or {}
    if isinstance(sid, bool) or not isinstance(sid, (str, int)):
        raise OutcomeError(f"{where}: sample id {sid!r:.60} is not a string or an integer; the log is damaged")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise OutcomeError(f"{where}: sample {sid!r:.60} has epoch {epoch!r:.60}, not a positive integer; "
                           "the log is damaged")
    if not isinstance(scores, dict) or not all(isinstance(v, dict) for v in scores.values()):
        raise OutcomeError(f"{where}: sample {sid!r:.60} has scores that are not objects with a value; "
                           "the log is damaged")
    return _Sample(str(sid), epoch, scores)


def _header(doc: Any, where: str) -> tuple[str | None, str | None, str | None]:
    """(model, first scorer's name, run id) from a log header."""
    if not isinstance(doc, dict):
        raise OutcomeError(f"{where}: the header is a {type(doc).__name__}, not an object; the log is damaged")
    ev = doc.get("eval") or {}
    scorers = ev.get("scorers") or [] if isinstance(ev, dict) else None
    if not isinstance(ev, dict) or not isinstance(scorers, list) or not all(isinstance(x, dict) for x in scorers):
        raise OutcomeError(f"{where}: the header's eval or eval.scorers has the wrong type; the log is damaged")
    scorer = next((x.get("name") for x in scorers), None)
    model, run = ev.get("model"), ev.get("run_id")
    if not all(v is None or isinstance(v, str) for v in (scorer, model, run)):
        raise OutcomeError(f"{where}: the header's model, run_id or scorer name is not a string; the log is damaged")
    return model, scorer, run


def _samples(doc: Any, where: str) -> list[_Sample]:
    if not isinstance(doc, list):
        raise OutcomeError(f"{where}: samples are a {type(doc).__name__}, not a list; the log is damaged")
    return [_sample(s, f"{where} item {i}") for i, s in enumerate(doc)]


def _read(path: Path) -> tuple[tuple[str | None, str | None, str | None], list[_Sample]]:
    """The log's header fields and its samples' ids, epochs and scores."""
    try:
        if path.suffix == ".json":
            with path.open("rb") as fh:
                doc = bounded.loads(bounded.read_capped(fh, str(path), error=OutcomeError), str(path),
                                    error=OutcomeError)
            if not isinstance(doc, dict):
                raise OutcomeError(f"{path}: a log is a JSON object, not a {type(doc).__name__}")
            return _header(doc, str(path)), _samples(doc.get("samples") or [], f"{path} samples")
        with zipfile.ZipFile(path) as z:
            header = _header(_entry(z, path, "header.json"), f"{path} entry header.json")
            names = set(z.namelist())
            if "summaries.json" in names:
                return header, _samples(_entry(z, path, "summaries.json"), f"{path} entry summaries.json")
            return header, [_sample(_entry(z, path, n), f"{path} entry {n}") for n in sorted(names)
                            if n.startswith("samples/")]
    except (OSError, KeyError, zipfile.BadZipFile, zstandard.ZstdError, zlib.error, EOFError, struct.error) as exc:
        raise OutcomeError(f"{path}: not a readable inspect eval log ({exc.__class__.__name__}: {exc})") from None


def _outcome(value: Any, where: str, pass_at: float | None) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str) and value in _PASS:
        return _PASS[value]
    if isinstance(value, (int, float)):
        if value in (0, 1) and pass_at is None:
            return int(value)
        if pass_at is not None:
            return int(value >= pass_at)
    raise OutcomeError(f"{where}: score {value!r} is not pass/fail; pass --inspect-pass-at X to count a score "
                       "at or above X as a pass")


def log_files(spec: Path) -> list[Path]:
    if spec.is_dir():
        found = sorted([*spec.glob("*.eval"), *spec.glob("*.json")])
        if not found:
            raise OutcomeError(f"{spec}: no inspect eval logs (.eval or .json) in this folder")
        return found
    if not spec.exists():
        raise OutcomeError(f"{spec}: no such inspect log file or folder")
    return [spec]


def rows(spec: str, pass_at: float | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Outcome rows (line-numbered like `outcome_rows.read_rows`) from `[CONDITION=]PATH`, a log file or a
    folder of them. Without CONDITION, a folder's name is the condition (`logs/live` -> live).
    Several logs in one condition are its replicates, in file-name order (inspect names them by time)."""
    condition, sep, where = spec.partition("=")
    if not sep or "/" in condition:
        condition, where = "", spec
    path = Path(where)
    condition = condition or (path.name if path.is_dir() else path.parent.name or "inspect")
    n = offset = 0
    for f in log_files(path):  # several runs of one condition: each run's epochs follow the last run's
        (model, scorer, run), samples = _read(f)
        epochs = max([s.epoch for s in samples] or [1])
        for s in samples:
            if not s.scores:
                continue  # an unscored sample (error, cancelled) is not an outcome
            name, score = (scorer, s.scores[scorer]) if scorer in s.scores else next(iter(s.scores.items()))
            n += 1
            where_row = f"{f} sample {s.id} epoch {s.epoch}"
            yield n, {"task_id": s.id, "condition": condition, "replicate": offset + s.epoch - 1,
                      "outcome": _outcome(score.get("value"), where_row, pass_at), "model": model,
                      "grader_version": f"inspect:{name}", "session": run}
        offset += epochs
