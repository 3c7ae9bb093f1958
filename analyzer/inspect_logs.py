"""inspect_ai eval logs as outcome rows, read without inspect installed.

An inspect user already has the logs: one per `inspect eval` run. Each scored sample becomes a
row: the sample id is the task, the epoch (from 1) is the replicate (from 0), and the first
scorer's value the outcome: `C`, `True` or a number at or above `pass_at` passes; `I`, `N`,
`False` or a smaller number fails; partial credit (`P`) is refused unless `pass_at` says how to
read it. `.eval` logs are zip archives whose entries may be zstd-compressed (method 93, which the
standard library cannot read); `.json` logs are one JSON document.
"""

from __future__ import annotations

import json
import struct
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import zstandard

from noisefloor.analyzer.outcomes import OutcomeError

_ZSTD = 93
_PASS = {"C": 1, "I": 0, "N": 0}


def _entry(archive: zipfile.ZipFile, path: Path, name: str) -> bytes:
    info = archive.getinfo(name)
    if info.compress_type in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        return archive.read(name)
    if info.compress_type != _ZSTD:
        raise OutcomeError(f"{path}: entry {name} uses zip compression {info.compress_type}, which nfanalyze cannot read")
    with path.open("rb") as fh:  # the local header's name and extra lengths locate the data
        fh.seek(info.header_offset)
        head = fh.read(30)
        name_len, extra_len = struct.unpack("<HH", head[26:30])
        fh.seek(info.header_offset + 30 + name_len + extra_len)
        raw = fh.read(info.compress_size)
    return zstandard.ZstdDecompressor().decompressobj().decompress(raw)


def _read(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The log's header and its sample summaries."""
    try:
        if path.suffix == ".json":
            doc = json.loads(path.read_text())
            return doc, doc.get("samples") or []
        with zipfile.ZipFile(path) as z:
            header = json.loads(_entry(z, path, "header.json"))
            names = set(z.namelist())
            if "summaries.json" in names:
                return header, json.loads(_entry(z, path, "summaries.json"))
            return header, [json.loads(_entry(z, path, n)) for n in sorted(names) if n.startswith("samples/")]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, zstandard.ZstdError, zlib.error) as exc:
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
    """Outcome rows (line-numbered like `outcomes.read_rows`) from `[CONDITION=]PATH`, a log file or a
    folder of them. Without CONDITION, a folder's name is the condition (`logs/live` -> live).
    Several logs in one condition are its replicates, in file-name order (inspect names them by time)."""
    condition, sep, where = spec.partition("=")
    if not sep or "/" in condition:
        condition, where = "", spec
    path = Path(where)
    condition = condition or (path.name if path.is_dir() else path.parent.name or "inspect")
    n = offset = 0
    for f in log_files(path):  # several runs of one condition: each run's epochs follow the last run's
        header, samples = _read(f)
        ev = header.get("eval", {})
        epochs = max([int(s.get("epoch", 1)) for s in samples] or [1])
        scorer = next((s.get("name") for s in ev.get("scorers") or []), None)
        for s in samples:
            scores = s.get("scores") or {}
            if not scores:
                continue  # an unscored sample (error, cancelled) is not an outcome
            name, score = (scorer, scores[scorer]) if scorer in scores else next(iter(scores.items()))
            n += 1
            where_row = f"{f} sample {s.get('id')} epoch {s.get('epoch')}"
            yield n, {"task_id": str(s.get("id")), "condition": condition,
                      "replicate": offset + int(s.get("epoch", 1)) - 1,
                      "outcome": _outcome(score.get("value"), where_row, pass_at), "model": ev.get("model"),
                      "grader_version": f"inspect:{name}", "session": ev.get("run_id")}
        offset += epochs
