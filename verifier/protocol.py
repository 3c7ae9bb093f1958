"""The candidate's lines, checked against their schema, and what one run amounts to.

The candidate's process can write anything on the pipe its results travel on (it must, to report
them), so its lines are read as untrusted: one load report, then one result per input in order,
nothing else. The first line that departs (malformed, forged, early, late or one too many) ends
the candidate with a violation that fails it alone; nothing it writes is kept beyond the inputs'
count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from noisefloor.proxy import secrets as secrets_mod
from noisefloor.verifier.values import decode

_LOAD_KINDS = ("syntax_error", "exception", "no_code")


@dataclass(frozen=True)
class RunResult:
    load: dict[str, Any] | None  # the load line: ok, or why not
    results: list[dict[str, Any]]  # one per input that finished
    timed_out: bool
    signal_name: str | None  # how the candidate process ended, if by a signal
    worker_killed: bool  # the fork server itself died (the candidate killed it)
    cpu_s: float | None  # CPU time the candidate process used
    violation: str | None = None  # the candidate broke the line protocol (it alone fails: sandbox_violation)


def parse_line(payload: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(payload)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


class CandidateLines:
    """A candidate's lines, taken one by one as they arrive, against the schema above."""

    def __init__(self, inputs: int) -> None:
        self.inputs = inputs
        self.load: dict[str, Any] | None = None
        self.results: list[dict[str, Any]] = []
        self.violation: str | None = None

    def take(self, payload: bytes) -> None:
        if self.violation is not None:
            return
        doc = parse_line(payload)
        if doc is None:
            self.violation = f"a line that is not a JSON object: {_preview(payload)}"
        elif self.load is None:
            if _is_load(doc):
                self.load = doc
            else:
                self.violation = f"the first line is not the load report: {_preview(payload)}"
        elif not self.load["ok"]:
            self.violation = "a line after a failed load"
        elif len(self.results) >= self.inputs:
            self.violation = f"more lines than the {self.inputs} inputs"
        elif not _is_result(doc, len(self.results)):
            self.violation = f"not the result of input {len(self.results)}: {_preview(payload)}"
        else:
            self.results.append(doc)


def _preview(payload: bytes) -> str:
    return repr(payload[:60])[2:-1] + ("..." if len(payload) > 60 else "")


def _is_load(doc: dict[str, Any]) -> bool:
    if doc.get("phase") != "load" or type(doc.get("ok")) is not bool or not set(doc) <= {"phase", "ok", "kind", "exc"}:
        return False
    if doc["ok"]:
        return set(doc) == {"phase", "ok"}
    return doc.get("kind") in _LOAD_KINDS and isinstance(doc.get("exc"), str)


def _is_result(doc: dict[str, Any], index: int) -> bool:
    if type(doc.get("i")) is not int or doc["i"] != index or type(doc.get("ok")) is not bool:
        return False
    if doc["ok"]:
        if set(doc) != {"i", "ok", "out"}:
            return False
        try:
            decode(doc["out"])
        except Exception:  # noqa: BLE001 - any value the decoder refuses is not an output
            return False
        return True
    return set(doc) == {"i", "ok", "exc"} and isinstance(doc["exc"], str)


def run_result(lines: CandidateLines, end: dict[str, Any] | None, timed_out: bool, cpu_limit: float,
               secrets: tuple[str, ...]) -> RunResult:
    """One run from its lines and how its process ended (`end` None: the fork server died with it);
    any credential text in what the candidate printed is erased (defence in depth: its
    environment holds none)."""
    sig = end.get("signal_name") if end else None
    cpu = end.get("cpu_s") if end else None
    if sig == "SIGXCPU" or (sig == "SIGKILL" and cpu is not None and cpu >= cpu_limit - 0.05):
        timed_out = True
    load, results = lines.load, lines.results
    if secrets:
        if load is not None and "exc" in load:
            load = load | {"exc": secrets_mod.erase_text(str(load["exc"]), secrets)}
        results = [r | {"exc": secrets_mod.erase_text(str(r["exc"]), secrets)} if "exc" in r else r for r in results]
    if lines.violation is not None:
        violation = secrets_mod.erase_text(lines.violation, secrets) if secrets else lines.violation
        return RunResult(load, results, False, sig, False, cpu, violation)
    return RunResult(load, results, timed_out, sig, end is None and not timed_out, cpu)
