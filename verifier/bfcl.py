"""BFCL-style AST grading of native tool calls, with the audit's failure taxonomy.

A call matches a ground-truth entry when the function names agree (dots and underscores are the
same: OpenAI tool names cannot contain dots), every argument given is a declared parameter,
every required parameter is present, and every value is among the allowed ones. Values are
compared as BFCL does: strings after removing spaces and `,./-_*^` and case folding, an int is
accepted where a float is expected, lists and dicts element by element, and `""` in an allowed
list marks the parameter optional. `parallel` tasks match calls to entries in any order.

Taxonomy: malformed_output (no calls, unparseable or truncated arguments), wrong_function (a
call names no expected function), wrong_arguments (right functions, wrong values), other (the
wrong number of calls).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import permutations
from typing import Any

from noisefloor.verifier.datasets import ToolTask

TAXONOMY = ("correct", "wrong_function", "wrong_arguments", "malformed_output", "other")
_STRIP = re.compile(r"[ ,./\-_*^]")


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolVerdict:
    task_id: str
    outcome: int
    failure: str  # one of TAXONOMY
    detail: str = ""


class Malformed(ValueError):
    """A tool-call payload that cannot be read as calls."""


def calls_from_response(body: dict[str, Any]) -> list[Call]:
    """Tool calls from an OpenAI chat completion, an Anthropic message or a Gemini response."""
    out: list[Call] = []
    if isinstance(body.get("choices"), list):  # OpenAI
        choice = body["choices"][0] if body["choices"] else {}
        if choice.get("finish_reason") == "length":
            raise Malformed("the response was truncated at the token limit")
        for tc in (choice.get("message") or {}).get("tool_calls") or []:
            fn = tc.get("function") or {}
            out.append(Call(str(fn.get("name", "")), _arguments(fn.get("arguments"))))
        return out
    if body.get("type") == "message" or isinstance(body.get("content"), list):  # Anthropic
        if body.get("stop_reason") == "max_tokens":
            raise Malformed("the response was truncated at the token limit")
        for block in body.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                out.append(Call(str(block.get("name", "")), _arguments(block.get("input"))))
        return out
    for cand in body.get("candidates") or []:  # Gemini
        for part in (cand.get("content") or {}).get("parts") or []:
            if isinstance(part, dict) and "functionCall" in part:
                fc = part["functionCall"]
                out.append(Call(str(fc.get("name", "")), _arguments(fc.get("args"))))
        break
    return out


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    try:
        parsed = json.loads(raw)
    except (TypeError, ValueError):
        raise Malformed(f"tool-call arguments are not JSON: {str(raw)[:80]!r}") from None
    if not isinstance(parsed, dict):
        raise Malformed("tool-call arguments are not a JSON object")
    return parsed


def _name(n: str) -> str:
    return n.replace(".", "_")


def _norm(v: Any) -> Any:
    return _STRIP.sub("", v).lower().replace("'", '"') if isinstance(v, str) else v


def _value_ok(value: Any, allowed: Sequence[Any], declared: str | None) -> bool:
    for option in allowed:
        if option == "" and value == "":
            return True
        if option == "":
            continue
        if _same(value, option, declared):
            return True
    return False


def _same(value: Any, option: Any, declared: str | None) -> bool:
    if isinstance(option, bool) or isinstance(value, bool):
        return type(value) is type(option) and value == option
    if isinstance(option, float) and isinstance(value, int):  # an int where a float is expected
        return float(value) == option
    if declared == "float" and isinstance(value, int) and isinstance(option, int):
        return value == option
    if isinstance(option, str):
        return isinstance(value, str) and _norm(value) == _norm(option)
    if isinstance(option, list):
        return isinstance(value, list) and len(value) == len(option) and all(
            _same(v, o, None) for v, o in zip(value, option))
    if isinstance(option, dict):
        return isinstance(value, dict) and set(value) <= set(option) and all(
            _value_ok(value[k], option[k] if isinstance(option[k], list) else [option[k]], None) for k in value) and all(
            k in value for k, opts in option.items() if not (isinstance(opts, list) and "" in opts))
    return type(value) is type(option) and value == option


def _schema(task: ToolTask, name: str) -> dict[str, Any] | None:
    return next((f for f in task.functions if _name(f["name"]) == _name(name)), None)


def match(call: Call, expected_name: str, expected_args: dict[str, list[Any]], task: ToolTask) -> str | None:
    """None when the call matches this ground-truth entry, else why not ("function" or "arguments")."""
    if _name(call.name) != _name(expected_name):
        return "function"
    schema = _schema(task, expected_name) or {}
    params = (schema.get("parameters") or {}).get("properties") or {}
    required = set((schema.get("parameters") or {}).get("required") or [])
    if any(arg not in params and arg not in expected_args for arg in call.arguments):
        return "arguments"
    for p in required | set(expected_args):
        allowed = expected_args.get(p)
        if p not in call.arguments:
            optional = "" in allowed if allowed is not None else p not in required
            if optional:
                continue
            return "arguments"
        if allowed is None:
            continue
        declared = (params.get(p) or {}).get("type")
        if not _value_ok(call.arguments[p], allowed, declared):
            return "arguments"
    return None


def grade(task: ToolTask, calls: Sequence[Call]) -> ToolVerdict:
    expected = [(name, args) for entry in task.ground_truth for name, args in entry.items()]
    if not calls:
        return ToolVerdict(task.task_id, 0, "malformed_output", "no tool call in the response")
    names = {_name(n) for n, _ in expected}
    if any(_name(c.name) not in names for c in calls):
        bad = next(c.name for c in calls if _name(c.name) not in names)
        return ToolVerdict(task.task_id, 0, "wrong_function", f"unexpected function {bad}")
    if len(calls) != len(expected):
        return ToolVerdict(task.task_id, 0, "other", f"{len(calls)} calls, expected {len(expected)}")
    orders = permutations(range(len(calls))) if task.category == "parallel" else [tuple(range(len(calls)))]
    reasons = set()
    for order in orders:  # BFCL's parallel sets are small (<= 4 calls): trying every pairing is fine
        why = [match(calls[i], *expected[k], task) for k, i in enumerate(order)]
        if not any(why):
            return ToolVerdict(task.task_id, 1, "correct")
        reasons.update(w for w in why if w)
    failure = "wrong_function" if reasons == {"function"} else "wrong_arguments"
    return ToolVerdict(task.task_id, 0, failure, "no pairing of calls to expected calls matches")


def grade_response(task: ToolTask, body: dict[str, Any] | None) -> ToolVerdict:
    if body is None:
        return ToolVerdict(task.task_id, 0, "malformed_output", "no response body")
    try:
        calls = calls_from_response(body)
    except Malformed as exc:
        return ToolVerdict(task.task_id, 0, "malformed_output", str(exc))
    return grade(task, calls)


def ground_truth_calls(task: ToolTask) -> list[Call]:
    """The first allowed value of every argument (skipping the optional marker) as calls."""
    calls = []
    for entry in task.ground_truth:
        for name, args in entry.items():
            chosen = {p: _first(allowed) for p, allowed in args.items() if any(a != "" for a in allowed)}
            calls.append(Call(name.replace(".", "_"), chosen))
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


def openai_body(calls: Sequence[Call], finish_reason: str = "tool_calls") -> dict[str, Any]:
    """An OpenAI chat completion carrying these calls (what a provider would return)."""
    return {
        "object": "chat.completion",
        "choices": [{
            "index": 0,
            "finish_reason": finish_reason,
            "message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for i, c in enumerate(calls)
            ]},
        }],
    }
