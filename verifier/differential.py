"""Differential check: a candidate's outputs against the canonical solution's, input by input.

Expected outputs are computed per task on first use (by running its canonical solution in the
same sandbox) and cached by the dataset file's sha256 and the input cap. Comparison follows the
EvalPlus evaluator: exact equality, except the MBPP+ special oracles (set equality, not-None,
two formula oracles, two always-true/zero cases), HumanEval/32's root check, and a float
tolerance (the task's atol, or 1e-6 when the expectation is float-valued and atol is 0).
"""

from __future__ import annotations

import json
import math
import os
import threading
import warnings
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from noisefloor.errors import StateError
from noisefloor.verifier import mbpp
from noisefloor.verifier.datasets import CodeTask, cache_dir
from noisefloor.verifier.extract import assemble, extract_code
from noisefloor.verifier.protocol import Decides, RunResult
from noisefloor.verifier.sandbox import Sandbox
from noisefloor.verifier.values import Opaque, decode, encode

_CACHE_VERSION = 2  # bump: outputs now computed with PYTHONHASHSEED=0
REFERENCE_CPU_S = 600  # CPU allowed to a canonical solution over all its inputs


@dataclass(frozen=True)
class Verdict:
    task_id: str
    outcome: int
    failure: str  # pass, wrong_output, exception, timeout, syntax_error, no_code, sandbox_violation
    detail: str = ""


class ExpectedError(StateError):
    """A canonical solution that did not run cleanly: the dataset or the sandbox is broken."""


def is_floats(x: Any) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    return False


def _allclose(out: Any, exp: Any, atol: float, rtol: float = 1e-7) -> bool:
    """numpy.allclose semantics on numbers and (nested) sequences of numbers."""
    if isinstance(exp, (list, tuple)):
        if not isinstance(out, (list, tuple)) or len(out) != len(exp):
            return False
        return all(_allclose(o, e, atol, rtol) for o, e in zip(out, exp))
    if not isinstance(out, (int, float)) or not isinstance(exp, (int, float)):
        return False
    if math.isinf(out) or math.isinf(exp):
        return out == exp
    return abs(out - exp) <= atol + rtol * abs(exp)


def _poly(xs: Sequence[float], x: float) -> float:
    return sum(c * math.pow(x, i) for i, c in enumerate(xs))


def matches(task: CodeTask, args: Sequence[Any], out: Any, exp: Any) -> bool:
    """Does one output pass, under the evaluator's rules for this task?"""
    ep = task.entry_point
    if task.kind == "mbpp" and ep in mbpp.NOT_NONE:  # expected holds "was not None"; a match object counts
        return out == exp if isinstance(out, bool) else exp == (out is not None)
    if isinstance(out, Opaque) or isinstance(exp, Opaque):  # digests and reprs: equal or not, nothing finer
        return out == exp
    try:
        exact = bool(out == exp)
    except Exception:  # noqa: BLE001 - a comparison that raises is a mismatch
        exact = False
    if task.kind == "mbpp":
        if ep == "are_equivalent":
            exact = True
        elif ep == "sum_div":
            exact = exact or out == 0
        elif ep == "surface_Area":
            exact = exact or _safe(lambda: abs(out - mbpp.surface_area(*args)) <= task.atol)
        elif ep == "digit_distance_nums":
            exact = exact or _safe(lambda: out == mbpp.digit_distance(*args))
        elif ep in mbpp.SET_EQUAL:
            exact = _safe(lambda: set(out) == set(exp))
    if task.kind == "humaneval" and ep == "find_zero":
        return _safe(lambda: len(args) == 1 and abs(_poly(args[0], out)) <= task.atol)
    atol = task.atol if task.atol or not is_floats(exp) else 1e-6
    if not exact and atol != 0:
        if type(out) is not type(exp):
            return False
        return _allclose(out, exp, atol)
    return exact


def _safe(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except Exception:  # noqa: BLE001
        return False


def verdict(task: CodeTask, run: RunResult, expected: Sequence[Any]) -> Verdict:
    """Turn one sandbox run into pass / a failure category (the first failing input decides)."""
    if run.violation is not None:
        return Verdict(task.task_id, 0, "sandbox_violation", run.violation)
    if run.load is not None and not run.load.get("ok"):
        kind = run.load.get("kind", "exception")
        return Verdict(task.task_id, 0, kind, run.load.get("exc", ""))
    for i, args in enumerate(task.inputs):
        r = run.results[i] if i < len(run.results) else None  # results arrive in input order, checked
        if r is None:
            if run.timed_out:
                return Verdict(task.task_id, 0, "timeout", f"limit reached at input {i}")
            why = "the sandbox worker was killed" if run.worker_killed else f"ended by {run.signal_name or 'exit'}"
            return Verdict(task.task_id, 0, "exception", f"no result for input {i}: {why}")
        if not r["ok"]:
            return Verdict(task.task_id, 0, "exception", f"input {i}: {r.get('exc', '')}")
        if not matches(task, args, run.values[i], expected[i]):
            return Verdict(task.task_id, 0, "wrong_output", f"input {i}")
    return Verdict(task.task_id, 1, "pass")


def _expected_for(task: CodeTask, run: RunResult) -> list[Any]:
    if run.violation or (run.load is not None and not run.load.get("ok")) or len(run.results) < len(task.inputs):
        why = run.violation or (run.load or {}).get("exc") or ("timed out" if run.timed_out else "incomplete")
        raise ExpectedError(f"canonical solution of {task.task_id} did not run cleanly: {why}")
    out = []
    for i, (r, value) in enumerate(zip(run.results, run.values)):
        if not r["ok"]:
            raise ExpectedError(f"canonical solution of {task.task_id} raised on input {i}: {r.get('exc')}")
        if task.kind == "mbpp" and task.entry_point in mbpp.NOT_NONE:
            value = value is not None
        out.append(value)
    return out


class Differential:
    """Grades code candidates for one dataset; expected outputs are computed on first use."""

    def __init__(self, tasks: Iterable[CodeTask], sandbox: Sandbox, dataset_hash: str, max_inputs: int,
                 gt_factor: float = 4.0) -> None:
        """`gt_factor`: a candidate gets at least this many times the canonical solution's CPU time
        (never less than the sandbox's own limit), as EvalPlus scales limits to the reference."""
        self.tasks = {t.task_id: t for t in tasks}
        self.sandbox = sandbox
        self.gt_factor = gt_factor
        self._reference_cpu: dict[str, float] = {}
        self._encoded = {tid: encode(list(t.inputs)) for tid, t in self.tasks.items()}
        self._cache = cache_dir() / f"expected-{dataset_hash[:16]}-{max_inputs}-v{_CACHE_VERSION}.json"
        self._expected: dict[str, list[Any]] | None = None  # read from the cache on first use

    def expected(self, progress: Callable[[int, int], None] | None = None,
                 task_ids: Collection[str] | None = None) -> dict[str, list[Any]]:
        """Expected outputs of `task_ids` (default: every task), computed only for those the cache
        lacks: a log of six candidates needs the references of its three tasks, not of all 164."""
        if self._expected is None:
            self._expected = self._load_cache()
        ids = self.tasks if task_ids is None else dict.fromkeys(task_ids)  # per candidate: only its own task
        missing = [self.tasks[tid] for tid in ids if tid in self.tasks and tid not in self._expected]
        if missing:
            self._compute(missing, progress)
        return self._expected

    def _read_cache(self) -> dict[str, Any]:
        """The cache file's document ({"expected": {id: encoded outputs}, "cpu": {id: s}}), or an
        empty one when it is missing or unreadable (then it is computed again)."""
        try:
            doc = json.loads(self._cache.read_text())
        except (OSError, ValueError):
            doc = None
        if not (isinstance(doc, dict) and isinstance(doc.get("expected"), dict) and isinstance(doc.get("cpu"), dict)):
            return {"expected": {}, "cpu": {}}
        return doc

    def _load_cache(self) -> dict[str, list[Any]]:
        doc = self._read_cache()
        have = [tid for tid in self.tasks if tid in doc["expected"] and tid in doc["cpu"]]
        self._reference_cpu.update({tid: doc["cpu"][tid] for tid in have})
        return {tid: [decode(v) for v in doc["expected"][tid]] for tid in have}

    def _compute(self, tasks: list[CodeTask], progress: Callable[[int, int], None] | None) -> None:
        """Run these canonical solutions, keep their outputs and add them to the cache file (which
        keeps every task any grader of this dataset computed: a grader of a subset of the tasks
        adds its few to the dataset's file rather than replacing it)."""
        assert self._expected is not None
        runs = self._map(lambda t: self._run(t, t.canonical, REFERENCE_CPU_S), tasks, progress)
        expected = {t.task_id: _expected_for(t, r) for t, r in zip(tasks, runs)}
        cpu = {t.task_id: r.cpu_s or 0.0 for t, r in zip(tasks, runs)}
        self._expected.update(expected)
        self._reference_cpu.update(cpu)
        self._cache.parent.mkdir(parents=True, exist_ok=True)
        doc = self._read_cache()  # what another process added meanwhile is kept
        doc["expected"].update({k: [encode(v) for v in vs] for k, vs in expected.items()})
        doc["cpu"].update(cpu)
        tmp = self._cache.with_name(f"{self._cache.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self._cache)

    def grade(self, task_id: str, response_text: str) -> Verdict:
        """Grade a model's answer text: extract its code, complete it, run it."""
        task = self.tasks[task_id]
        program = assemble(extract_code(response_text, task.entry_point), task.entry_point, task.prompt,
                           task.preamble())
        return self.grade_program(task_id, program)

    def grade_program(self, task_id: str, program: str | None) -> Verdict:
        """Grade a complete program (an EvalPlus sample's `solution`)."""
        task = self.tasks[task_id]
        if program is None or not program.strip():
            return Verdict(task_id, 0, "no_code", "no code defining " + task.entry_point)
        try:
            with warnings.catch_warnings():  # the candidate's own warnings are not the verifier's
                warnings.simplefilter("ignore")
                compile(program, "candidate.py", "exec")
        except (SyntaxError, ValueError) as exc:
            return Verdict(task_id, 0, "syntax_error", f"{type(exc).__name__}: {exc}")
        expected = self.expected(task_ids=(task_id,))[task_id]

        def decides(i: int, line: dict[str, Any], value: Any) -> bool:
            """The first exception or wrong output settles the verdict: stop the candidate there."""
            return not line["ok"] or not matches(task, task.inputs[i], value, expected[i])

        return verdict(task, self._run(task, program, self.cpu_limit(task_id), decides), expected)

    def cpu_limit(self, task_id: str) -> float:
        """CPU seconds a candidate of this task may use: the sandbox's limit, raised to `gt_factor`
        times what the canonical solution needed (known once its outputs were computed)."""
        return max(float(self.sandbox.limits.cpu_s), math.ceil(self.gt_factor * self._reference_cpu.get(task_id, 0.0)))

    def _run(self, task: CodeTask, program: str, cpu_s: float, decides: Decides | None = None) -> RunResult:
        unordered = task.kind == "mbpp" and task.entry_point in mbpp.SET_EQUAL
        return self.sandbox.run(program, task.entry_point, self._encoded[task.task_id], unordered, cpu_s,
                                decides=decides)

    def grade_many(self, items: Sequence[tuple[str, str]], progress: Callable[[int, int], None] | None = None,
                   programs: bool = False, on_verdict: Callable[[int, Verdict], None] | None = None) -> list[Verdict]:
        """(task_id, response text) pairs -- or (task_id, program) with `programs` -- graded in
        parallel across the sandbox's slots; `on_verdict(index, verdict)` as each one is done."""
        self.expected(task_ids={tid for tid, _ in items})
        grade = self.grade_program if programs else self.grade
        # the costliest tasks first (by their canonical solution's CPU), so that no slot is left
        # with one long candidate at the end while the others are idle
        order = sorted(range(len(items)), key=lambda i: -self._reference_cpu.get(items[i][0], 0.0))
        return self._map(lambda it: grade(*it), items, progress, on_verdict, order)

    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any], progress: Callable[[int, int], None] | None,
             on_result: Callable[[int, Any], None] | None = None, order: Sequence[int] | None = None) -> list[Any]:
        """fn over items on the sandbox's slots, started in `order` (default: as given). An interrupt
        (or any error) cancels what has not started; what is running finishes (each bounded by its
        limits) and the error goes on."""
        out: list[Any] = [None] * len(items)
        with ThreadPoolExecutor(max_workers=self.sandbox.workers) as pool:
            futures = {pool.submit(fn, items[i]): i for i in (range(len(items)) if order is None else order)}
            try:
                for n, fut in enumerate(as_completed(futures), 1):
                    i = futures[fut]
                    out[i] = fut.result()
                    if on_result:
                        on_result(i, out[i])
                    if progress:
                        progress(n, len(items))
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise
        return out
