"""BFCL AST grading of native tool calls, equal to the official checker, with the audit's taxonomy.

By default a candidate gets the verdict gorilla's `bfcl_eval` AST checker gives a function-calling
(FC) model's tool calls (tests/data/bfcl_official_verdicts.jsonl.gz holds the official verdicts this
module must reproduce, and how they were made). The rules, in the checker's order:

- **Names**: the spelling the model config implies. API models (OpenAI, Anthropic, Gemini, Mistral
  and others whose tool names cannot hold dots) must call `math_factorial` for a declared
  `math.factorial`; `names="declared"` is the rule for configs that keep dots.
- **Per call**: every required parameter present first; then each argument given must be declared
  and in the answer; its type must be the declared one (an int passes for a float parameter; a value
  of the answer's own type passes as a "variable" and is then compared by plain equality); strings
  compare after removing spaces and `,./-_*^`, case folded (so "..." equals the optional marker "");
  lists compare with top-level strings cleaned; dicts key by key, one level of cleaning; deeper
  values by Python equality (1 == 1.0, case kept). An answer parameter not given must allow "".
- **Parallel**: each expected call, in order, takes the first unmatched candidate call that
  matches (first-fit, order-dependent, as BFCL does); `parallel="bipartite"` finds a matching
  whenever one exists (departs from BFCL). Both are at most n^2 call checks.

Grading many candidates of one task, a `TaskGrader` works out the answer's side of every check
once (`bfcl_expected`); `grade` and `grade_response` grade one candidate the same way.

Bounds: tool-call arguments over MAX_ARGUMENT_CHARS, or nested past what the JSON parser takes,
are malformed (no BFCL answer is near either).

Taxonomy: malformed_output (no calls, unparseable or truncated arguments), wrong_function (a
call names no expected function), wrong_arguments (right functions, wrong values), other (the
wrong number of calls).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from noisefloor.errors import InputError
from noisefloor.verifier.bfcl_expected import (
    COMPARE_ERRORS,
    SHAPE,
    TYPES,
    answer_type,
    clean,
    cleaned,
    compile_expected,
    items,
)
from noisefloor.verifier.datasets import ToolTask

MAX_ARGUMENT_CHARS = 1 << 16


@dataclass(frozen=True)
class Rules:
    """How calls are matched. The defaults are the official checker's for FC API models."""
    names: Literal["underscore", "declared"] = "underscore"
    parallel: Literal["first-fit", "bipartite"] = "first-fit"

    def departs(self) -> str | None:
        """A line saying how these rules differ from BFCL's, or None."""
        if self.parallel == "bipartite":
            return "parallel calls matched order-free (bipartite): departs from BFCL's first-fit matching"
        return None


BFCL = Rules()


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolVerdict:
    task_id: str
    outcome: int
    failure: str  # correct, or a class of the taxonomy above (the analyzer counts them: floors.TAXONOMY_CLASSES)
    detail: str = ""


class Malformed(InputError):
    """A tool-call payload that cannot be read as calls (the candidate's: graded malformed_output)."""


def calls_from_response(body: dict[str, Any]) -> list[Call]:
    """Tool calls from an OpenAI chat completion, an Anthropic message or a Gemini response."""
    out: list[Call] = []
    if isinstance(body.get("choices"), list):  # OpenAI
        choice = body["choices"][0] if body["choices"] else {}
        if not isinstance(choice, dict):
            raise Malformed("choices[0] is not an object")
        if choice.get("finish_reason") == "length":
            raise Malformed("the response was truncated at the token limit")
        for tc in _objects((choice.get("message") or {}).get("tool_calls")):
            fn = tc.get("function") or {}
            out.append(Call(str(fn.get("name", "")), _arguments(fn.get("arguments"))))
        return out
    if body.get("type") == "message" or isinstance(body.get("content"), list):  # Anthropic
        if body.get("stop_reason") == "max_tokens":
            raise Malformed("the response was truncated at the token limit")
        for block in _objects(body.get("content")):
            if block.get("type") == "tool_use":
                out.append(Call(str(block.get("name", "")), _arguments(block.get("input"))))
        return out
    for cand in _objects(body.get("candidates")):  # Gemini
        for part in _objects((cand.get("content") or {}).get("parts")):
            if "functionCall" in part and isinstance(part["functionCall"], dict):
                fc = part["functionCall"]
                out.append(Call(str(fc.get("name", "")), _arguments(fc.get("args"))))
        break
    return out


def _objects(raw: Any) -> list[dict[str, Any]]:
    return [x for x in raw if isinstance(x, dict)] if isinstance(raw, list) else []


def _arguments(raw: Any) -> dict[str, Any]:
    """A call's arguments as the checker decodes them: a JSON object (a string is parsed), else malformed."""
    if raw is None:  # Anthropic and Gemini omit the arguments of a parameterless call
        return {}
    if isinstance(raw, dict):
        text = None
        parsed: Any = raw
    else:
        text = raw if isinstance(raw, str) else None
        if text is None:
            raise Malformed("tool-call arguments are not a JSON object")
        if len(text) > MAX_ARGUMENT_CHARS:
            raise Malformed(f"tool-call arguments longer than {MAX_ARGUMENT_CHARS} characters")
        try:
            parsed = json.loads(text)
        except RecursionError:
            raise Malformed("tool-call arguments nested too deep") from None
        except ValueError:
            raise Malformed(f"tool-call arguments are not JSON: {text[:80]!r}") from None
    if not isinstance(parsed, dict):
        raise Malformed("tool-call arguments are not a JSON object")
    if text is None:
        try:
            size = len(json.dumps(parsed))
        except (TypeError, ValueError, RecursionError):
            raise Malformed("tool-call arguments are not JSON") from None
        if size > MAX_ARGUMENT_CHARS:
            raise Malformed(f"tool-call arguments longer than {MAX_ARGUMENT_CHARS} characters")
    return parsed


def spelled(declared: str, rules: Rules = BFCL) -> str:
    """The name a model under these rules must call a declared function by."""
    return declared.replace(".", "_") if rules.names == "underscore" else declared


def _typed(value: Any, allowed: Sequence[Any], expected: type[Any], inner: type | None) -> tuple[bool, bool]:
    """(type accepted, value is a "variable": compared by equality) for one argument."""
    atype = answer_type(allowed)
    variable = atype is not None and atype is not expected
    if type(value) is expected:
        if inner is None:
            return True, variable
        for option in allowed:  # one level deep: each element the inner type (or the answer's)
            if type(option) is not list or all(_typed(v, option, inner, None)[0] for v in value):
                return True, variable
        return False, variable
    if atype is not None and type(value) is atype:
        return True, True
    return False, False


def _dict_ok(value: dict[str, Any], allowed: Sequence[Any]) -> bool:
    for option in allowed:
        if option == "":
            continue
        if all(k in option and cleaned(v) in [cleaned(x) for x in items(option[k])] for k, v in value.items()) \
                and all(k in value or "" in opts for k, opts in option.items()):
            return True
    return False


def _dict_list_ok(value: list[Any], allowed: Sequence[Any]) -> bool:
    return any(len(value) == len(option) and all(_dict_ok(value[i], [option[i]]) for i in range(len(value)))
               for option in allowed)


def _list_ok(value: list[Any], allowed: Sequence[Any]) -> bool:
    return [cleaned(v) for v in value] in [[cleaned(x) for x in items(option)] for option in allowed]


def _argument_ok(value: Any, allowed: Sequence[Any], schema: dict[str, Any]) -> bool:
    declared = schema["type"]
    expected = TYPES[declared]
    inner = TYPES[schema["items"]["type"]] if declared in ("array", "tuple") else None
    if declared == "float" and type(value) is int:
        value = float(value)
    ok, variable = _typed(value, allowed, expected, inner)
    if not ok:
        return False
    if not variable:
        if expected is dict:
            return _dict_ok(value, allowed)
        if expected is list and inner is dict:
            return _dict_list_ok(value, allowed)
        if expected is str:
            return clean(value) in [clean(a) for a in allowed if type(a) is str]
        if expected is list:
            return _list_ok(value, allowed)
    return value in allowed


def check(call: Call, schema: dict[str, Any] | None, answer: dict[str, Any], rules: Rules = BFCL) -> str | None:
    """None when the call matches this expected call, else why not (starting "function" when the name
    is wrong). `answer` is {name: {param: allowed values}}, `schema` the declared function."""
    if schema is None:
        return "function: no declared function for the expected call"
    try:
        if call.name != spelled(schema["name"], rules):
            return f"function: {call.name} is not {spelled(schema['name'], rules)}"
        allowed = next(iter(answer.values()))
        params = schema["parameters"]["properties"]
        for p in schema["parameters"]["required"]:
            if p not in call.arguments:
                return f"missing required argument {p!r}"
        for p, value in call.arguments.items():
            if p not in params or p not in allowed:
                return f"unexpected argument {p!r}"
            if not _argument_ok(value, allowed[p], params[p]):
                return f"value of {p!r} not allowed"
        for p, options in allowed.items():
            if p not in call.arguments and "" not in options:
                return f"argument {p!r} missing"
    except COMPARE_ERRORS:
        return SHAPE
    return None


def _schema(task: ToolTask, declared: str) -> dict[str, Any] | None:
    return next((f for f in task.functions if isinstance(f, dict) and f.get("name") == declared), None)


class TaskGrader:
    """One task's expected calls compiled once (`bfcl_expected`), to grade many candidates under `rules`.

    The task is read when the grader is made: a grader stands for the task as it was then."""

    def __init__(self, task: ToolTask, rules: Rules = BFCL) -> None:
        self.task, self.rules = task, rules
        self._names = frozenset(spelled(n, rules) for entry in task.ground_truth for n in entry)
        self._checks = [self._compiled(answer) for answer in task.ground_truth]
        self._parallel = "parallel" in task.category

    def _compiled(self, answer: dict[str, Any]) -> Callable[[Call], str | None]:
        """The check of one expected call: compiled, or `check` on the raw task for a shape it does not hold."""
        task, rules = self.task, self.rules
        try:
            schema = _schema(task, next(iter(answer)))
            expected = None if schema is None else compile_expected(schema, answer, spelled(schema["name"], rules))
        except (*COMPARE_ERRORS, ValueError):
            expected = None
        if expected is None:
            return lambda call: check(call, _schema(task, next(iter(answer))), answer, rules)
        why = expected.why
        return lambda call: why(call.name, call.arguments)

    def grade_response(self, body: dict[str, Any] | None) -> ToolVerdict:
        if not isinstance(body, dict):
            return ToolVerdict(self.task.task_id, 0, "malformed_output", "no response body")
        try:
            calls = calls_from_response(body)
        except Malformed as exc:
            return ToolVerdict(self.task.task_id, 0, "malformed_output", str(exc))
        return self.grade(calls)

    def grade(self, calls: Sequence[Call]) -> ToolVerdict:
        task_id, checks = self.task.task_id, self._checks
        if not calls:
            return ToolVerdict(task_id, 0, "malformed_output", "no tool call in the response")
        bad = next((c.name for c in calls if c.name not in self._names), None)
        if bad is not None:
            return ToolVerdict(task_id, 0, "wrong_function", f"unexpected function {bad[:80]}")
        if len(calls) != len(checks):
            return ToolVerdict(task_id, 0, "other", f"{len(calls)} calls, expected {len(checks)}")
        if self._parallel:
            ok, reasons = (_bipartite if self.rules.parallel == "bipartite" else _first_fit)(checks, calls)
        else:  # multiple (and simple): the one call against the one expected call
            why = checks[0](calls[0])
            ok, reasons = why is None, [why] if why else []
        if ok:
            return ToolVerdict(task_id, 1, "correct")
        if reasons and all(r.startswith("function") for r in reasons):
            return ToolVerdict(task_id, 0, "wrong_function", reasons[0])
        detail = next((r for r in reasons if not r.startswith("function")), "no call matches")
        if self._parallel:
            detail = f"an expected call matches no remaining call ({detail})"
        return ToolVerdict(task_id, 0, "wrong_arguments", detail)


_Check = Callable[[Call], str | None]


def _first_fit(checks: Sequence[_Check], calls: Sequence[Call]) -> tuple[bool, list[str]]:
    """BFCL's parallel rule: each expected call takes the first unmatched call that matches it."""
    free = list(range(len(calls)))
    for check_one in checks:
        reasons = []
        for i in free:
            why = check_one(calls[i])
            if why is None:
                free.remove(i)
                break
            reasons.append(why)
        else:
            return False, reasons
    return True, []


def _bipartite(checks: Sequence[_Check], calls: Sequence[Call]) -> tuple[bool, list[str]]:
    """A perfect matching of calls to expected calls if any exists (augmenting paths: n^2 checks, n^3 steps)."""
    why = [[check_one(c) for c in calls] for check_one in checks]
    owner: dict[int, int] = {}  # call index -> expected index

    def augment(k: int, seen: set[int]) -> bool:
        for i in range(len(calls)):
            if why[k][i] is None and i not in seen:
                seen.add(i)
                if i not in owner or augment(owner[i], seen):
                    owner[i] = k
                    return True
        return False

    for k in range(len(why)):
        if not augment(k, set()):
            return False, [w for w in why[k] if w]
    return True, []


def grade(task: ToolTask, calls: Sequence[Call], rules: Rules = BFCL) -> ToolVerdict:
    """One candidate's calls (a TaskGrader grades many of one task without compiling it each time)."""
    return TaskGrader(task, rules).grade(calls)


def grade_response(task: ToolTask, body: dict[str, Any] | None, rules: Rules = BFCL) -> ToolVerdict:
    """One candidate's response body (a TaskGrader grades many of one task without compiling it each time)."""
    return TaskGrader(task, rules).grade_response(body)


def ground_truth_calls(task: ToolTask, rules: Rules = BFCL) -> list[Call]:
    """The first allowed value of every argument (skipping the optional marker) as calls."""
    calls = []
    for entry in task.ground_truth:
        for name, args in entry.items():
            chosen = {p: _first(allowed) for p, allowed in args.items() if any(a != "" for a in allowed)}
            calls.append(Call(spelled(name, rules), chosen))
    return calls


def _first(allowed: list[Any]) -> Any:
    return _render(next(a for a in allowed if a != ""))


def _render(value: Any) -> Any:
    """Nested dicts in answers hold allowed lists of their own: pick the first of each."""
    if isinstance(value, dict):
        return {k: _first(v) if isinstance(v, list) else v for k, v in value.items()
                if not isinstance(v, list) or any(a != "" for a in v)}
    if isinstance(value, list):
        return [_render(v) for v in value]
    return value
