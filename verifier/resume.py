"""Graded rows kept as grading goes, so that an interrupted nfverify resumes where it stopped.

Beside the outcomes file, `OUT.partial` gets one JSON line per graded row the moment it is
graded (its first line says which command made it). A run that ends normally writes OUT
atomically and removes the partial file; an interrupted one leaves it, and the same command
afterwards reuses its rows and grades only the rest. A partial file from a different command
(other suite, logs, dataset or options) is not reused: it is started afresh.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from noisefloor.outcome_rows import OutcomeRow, row_key


def attempt_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """One graded attempt: perturbation variants and sessions of one (condition, task, replicate) apart."""
    return (*row_key(row), row.get("variant"), row.get("session"))


class Progress:
    def __init__(self, out: Path, identity: Mapping[str, Any]) -> None:
        self.path = out.with_name(out.name + ".partial")
        self.identity = {"nfverify_partial": dict(identity)}
        self.done: dict[tuple[Any, ...], OutcomeRow] = {}
        self.stale = False
        self.where: dict[str, Path] = {}  # graded from LOGs: which store each session is in
        self._fh: IO[str] | None = None
        if self.path.is_file():
            self._load()

    def _load(self) -> None:
        with self.path.open(encoding="utf-8", errors="replace") as fh:
            head = fh.readline()
            try:
                same = json.loads(head) == self.identity
            except ValueError:
                same = False
            if not same:
                self.stale = True
                return
            for n, line in enumerate(fh, start=2):
                try:
                    row = OutcomeRow.from_json(json.loads(line), f"{self.path}:{n}")
                except (ValueError, TypeError, AttributeError):
                    continue  # a line cut by a kill: that row is graded again
                self.done[attempt_key(row.to_json())] = row

    def add(self, row: OutcomeRow) -> None:
        if self._fh is None:
            fresh = not self.done
            self._fh = self.path.open("w" if fresh else "a", encoding="utf-8")
            if fresh:
                self._fh.write(json.dumps(self.identity) + "\n")
        self._fh.write(json.dumps(row.to_json()) + "\n")
        self._fh.flush()
        self.done[attempt_key(row.to_json())] = row

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def finish(self) -> None:
        """The outcomes file is written: the partial file has done its work."""
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
