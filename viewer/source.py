"""What `nfview PATH` shows: PATH is a store, or a folder nfladder / nfanalyze wrote (report.json,
gate verdicts, outcome rows, plots, log.lmdb). Found once at start; the files are read on request.

Only what is inside PATH is shown: an entry that is a symbolic link pointing out of it (a
`ladder.png` linked to a private file) is never listed, and a file is checked again when it is
read (`Source.inside`), so one swapped for such a link after the start is refused too."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noisefloor.errors import InputError

REPORT_NAMES = ("report.json",)
OUTCOME_NAMES = ("outcomes.jsonl",)
MAX_JSON_BYTES = 64 << 20  # a report bigger than this is not one nfanalyze wrote


class SourceError(InputError):
    """PATH holds nothing nfview can show; the message says what it looked for."""


@dataclass(frozen=True)
class Source:
    root: Path
    store: Path | None
    report: Path | None
    gate: Path | None
    outcomes: Path | None
    plots: tuple[Path, ...]

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.root), "store": _name(self.store, self.root), "report": _name(self.report, self.root),
                "gate": _name(self.gate, self.root), "outcomes": _name(self.outcomes, self.root),
                "plots": [p.name for p in self.plots]}

    def plot(self, name: str) -> Path | None:
        """A plot by its listed name only, still inside PATH: nothing else is ever served."""
        return next((p for p in self.plots if p.name == name and inside(p, self.root)), None)

    def inside(self, path: Path) -> Path:
        """`path`, checked again as it is read: refused when it now points out of PATH."""
        if not inside(path, self.root):
            raise SourceError(f"{path} now points out of {self.root}; nfview shows only what is inside the folder")
        return path


def inside(path: Path, root: Path) -> bool:
    """Whether `path`, its links followed, is inside `root` (itself, its links followed)."""
    try:
        return path.resolve(strict=True).is_relative_to(root.resolve(strict=True))
    except (OSError, RuntimeError):  # gone, or a loop of links
        return False


def _name(p: Path | None, root: Path) -> str | None:
    return None if p is None else (p.name if p.parent == root else str(p))


def is_store(p: Path, root: Path | None = None) -> bool:
    """A folder with data.mdb (both inside `root`, when given)."""
    return p.is_dir() and (p / "data.mdb").is_file() and (root is None or inside(p / "data.mdb", root))


def locate(path: str | os.PathLike[str]) -> Source:
    p = Path(path)
    if not p.exists():
        raise SourceError(f"{p} does not exist; give an nfproxy store or an nfladder / nfanalyze output folder")
    if is_store(p, p):
        return Source(p, p, None, None, None, ())
    if not p.is_dir():
        raise SourceError(f"{p} is a file; give an nfproxy store (a folder with data.mdb) or an output folder")
    stores = sorted(c for c in p.iterdir() if is_store(c, p))
    store = next((c for c in stores if c.name == "log.lmdb"), stores[0] if stores else None)
    documents = sorted(c for c in p.glob("*.json") if _file(c, p))
    report = next((p / n for n in REPORT_NAMES if _file(p / n, p)), None) or next(
        (c for c in documents if _has_list_or_dict(c, "conditions", dict)), None)  # nfanalyze --json NAME
    gate = next((c for c in documents if c != report and _has_list_or_dict(c, "verdicts", list)), None)
    outcomes = next((p / n for n in OUTCOME_NAMES if _file(p / n, p)), None)
    plots = tuple(sorted(c for c in p.glob("*.png") if _file(c, p)))
    if not any((store, report, gate, outcomes)):
        raise SourceError(f"{p} holds no nfproxy store, report.json, gate verdicts or outcomes.jsonl; "
                          "point nfview at a store or at the --out folder of nfladder")
    return Source(p, store, report, gate, outcomes, plots)


def _file(c: Path, root: Path) -> bool:
    return c.is_file() and inside(c, root)


def _has_list_or_dict(path: Path, key: str, kind: type) -> bool:
    """A JSON document with `key` of `kind`: how a report (conditions) and gate verdicts are told apart."""
    try:
        doc = read_json(path)
    except (SourceError, OSError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get(key), kind)


def read_json(path: Path) -> Any:
    if path.stat().st_size > MAX_JSON_BYTES:
        raise SourceError(f"{path} is over {MAX_JSON_BYTES >> 20} MB; not a report nfanalyze wrote")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise SourceError(f"{path} is not JSON ({why}); write it again with nfanalyze --json") from None


def read_outcomes(path: Path, offset: int, limit: int, condition: str | None, task: str | None
                  ) -> tuple[list[dict[str, Any]], int | None]:
    """One page of outcome rows from a JSON Lines file, read line by line (never the whole file)."""
    rows: list[dict[str, Any]] = []
    seen = 0
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(row, dict) or not _row_wanted(row, condition, task):
                continue
            seen += 1
            if seen <= offset:
                continue
            if len(rows) == limit:
                return rows, offset + limit
            rows.append(row)
    return rows, None


def _row_wanted(row: dict[str, Any], condition: str | None, task: str | None) -> bool:
    return (condition is None or str(row.get("condition")) == condition) and (
        task is None or str(row.get("task_id")) == task)


def page_rows(rows: list[dict[str, Any]], offset: int, limit: int, condition: str | None, task: str | None
              ) -> tuple[list[dict[str, Any]], int | None]:
    kept = [r for r in rows if _row_wanted(r, condition, task)]
    page = kept[offset:offset + limit]
    return page, (offset + limit if offset + limit < len(kept) else None)
