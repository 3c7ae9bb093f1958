"""The candidate's lines, checked against their schema, and what one run amounts to.

The candidate's process can write anything on the pipe its results travel on (it must, to report
them), so its lines are read as untrusted: one load report, then one result per input in order,
nothing else. The first line that departs (malformed, forged, early, late or one too many) ends
the candidate with a violation that fails it alone; nothing it writes is kept beyond the inputs'
count.

A grader that knows the expected outputs may pass a `decides` check: the first result it calls
decisive (an exception or a wrong output) settles the verdict, so the candidate is stopped there
and its later lines are not read. A candidate is judged by its first failing input either way;
what it would have done after that input is never run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from noisefloor.proxy.request import secrets as secrets_mod
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
    values: list[Any] = field(default_factory=list)  # each result's output, decoded once (None where it raised)
    stopped: bool = False  # ended by the grader at a decisive result (see `decides`)


def parse_line(payload: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(payload)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


Decides = Callable[[int, dict[str, Any], Any], bool]  # (input index, result line, decoded output)
_UNDECODABLE = object()


class CandidateLines:
    """A candidate's lines, taken one by one as they arrive, against the schema above; `decides`
    is asked about each valid result, and once it says yes no further line is taken."""

    def __init__(self, inputs: int, decides: Decides | None = None) -> None:
        self.inputs = inputs
        self.decides = decides
        self.load: dict[str, Any] | None = None
        self.results: list[dict[str, Any]] = []
        self.values: list[Any] = []
        self.violation: str | None = None
        self.decided = False

    def take(self, payload: bytes) -> None:
        if self.violation is not None or self.decided:
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
        else:
            value = _result_value(doc, len(self.results))
            if value is _UNDECODABLE:
                self.violation = f"not the result of input {len(self.results)}: {_preview(payload)}"
                return
            self.results.append(doc)
            self.values.append(value)
            self.decided = self.decides is not None and self._decisive(len(self.results) - 1, doc, value)

    def _decisive(self, index: int, doc: dict[str, Any], value: Any) -> bool:
        try:
            return bool(self.decides(index, doc, value))  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - a comparison that fails here fails the same way in the verdict
            return True


def _preview(payload: bytes) -> str:
    return repr(payload[:60])[2:-1] + ("..." if len(payload) > 60 else "")


def _is_load(doc: dict[str, Any]) -> bool:
    if doc.get("phase") != "load" or type(doc.get("ok")) is not bool or not set(doc) <= {"phase", "ok", "kind", "exc"}:
        return False
    if doc["ok"]:
        return set(doc) == {"phase", "ok"}
    return doc.get("kind") in _LOAD_KINDS and isinstance(doc.get("exc"), str)


def _result_value(doc: dict[str, Any], index: int) -> Any:
    """The decoded output of a valid result line (None for an exception), else _UNDECODABLE."""
    if type(doc.get("i")) is not int or doc["i"] != index or type(doc.get("ok")) is not bool:
        return _UNDECODABLE
    if doc["ok"]:
        if set(doc) != {"i", "ok", "out"}:
            return _UNDECODABLE
        try:
            return decode(doc["out"])
        except Exception:  # noqa: BLE001 - any value the decoder refuses is not an output
            return _UNDECODABLE
    return None if set(doc) == {"i", "ok", "exc"} and isinstance(doc["exc"], str) else _UNDECODABLE


def run_result(lines: CandidateLines, end: dict[str, Any] | None, timed_out: bool, cpu_limit: float,
               secrets: tuple[str, ...]) -> RunResult:
    """One run from its lines and how its process ended (`end` None: the fork server died with it);
    any credential text in what the candidate printed is erased (defence in depth: its
    environment holds none)."""
    sig = end.get("signal_name") if end else None
    cpu = end.get("cpu_s") if end else None
    if not lines.decided and (sig == "SIGXCPU" or (sig == "SIGKILL" and cpu is not None and cpu >= cpu_limit - 0.05)):
        timed_out = True
    load, results = lines.load, lines.results
    if secrets:
        if load is not None and "exc" in load:
            load = load | {"exc": secrets_mod.erase_text(str(load["exc"]), secrets)}
        results = [r | {"exc": secrets_mod.erase_text(str(r["exc"]), secrets)} if "exc" in r else r for r in results]
    if lines.violation is not None:
        violation = secrets_mod.erase_text(lines.violation, secrets) if secrets else lines.violation
        return RunResult(load, results, False, sig, False, cpu, violation, lines.values)
    return RunResult(load, results, timed_out and not lines.decided, sig, end is None and not timed_out, cpu, None,
                     lines.values, lines.decided)
