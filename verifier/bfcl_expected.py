"""BFCL's value rules, and one expected call compiled so that checking a candidate call is cheap.

The rules (string cleaning, the "variable" typing, the one-level list and dict comparisons) are
stated once here, as the official checker applies them; `verifier/bfcl.py` says what they are.
An `Expected` holds one answer entry with everything that depends only on the task worked out
once (the spelled name, the declared types, each answer's cleaned strings, lists and dict keys), so
that a candidate pays only for its own values. `compile_expected` returns None for a declaration
or answer of a shape it does not hold (a type BFCL does not name, answers that are not lists, a
nested answer that is neither a dict nor ""): such an entry is checked by `bfcl.check`, which
applies the same rules to the raw task and names the shape problem when a call reaches it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

STRIP = re.compile(r"[ ,./\-_*^]")
TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list,
                          "tuple": list, "dict": dict, "any": str}
SHAPE = "arguments of a shape the answer cannot be compared with"
# what comparing a candidate's values with an answer can raise: the call is then of a shape the answer
# cannot be compared with (a verdict, not a crash)
COMPARE_ERRORS = (KeyError, TypeError, AttributeError, IndexError, OverflowError, RecursionError, StopIteration)


def clean(s: str) -> str:
    return STRIP.sub("", s).lower().replace("'", '"')


def cleaned(v: Any) -> Any:
    return clean(v) if type(v) is str else v


def items(a: Any) -> list[Any]:
    """The elements of an answer by index (a string gives its characters, as the checker's indexing does)."""
    return [a[j] for j in range(len(a))]


def answer_type(allowed: Sequence[Any]) -> type | None:
    return next((type(a) for a in allowed if a != ""), None)


@dataclass(frozen=True, slots=True)
class _DictOption:
    """One allowed dict: each key's cleaned values, and the keys a candidate may not leave out."""
    values: dict[Any, list[Any]]
    must: tuple[Any, ...]

    def accepts(self, value: Any) -> bool:
        """`value.items()` raises for a non-dict, as the checker's comparison does (a shape error)."""
        values = self.values
        for k, v in value.items():
            if k not in values or cleaned(v) not in values[k]:
                return False
        return all(k in value for k in self.must)


def _dict_option(option: Any) -> _DictOption:
    if type(option) is not dict:
        raise TypeError("a nested answer that is not a dict")
    return _DictOption({k: [cleaned(x) for x in items(opts)] for k, opts in option.items()},
                       tuple(k for k, opts in option.items() if "" not in opts))


@dataclass(frozen=True, slots=True)
class _Param:
    """One declared parameter with its allowed values, compiled."""
    expected: type
    to_float: bool  # an int given for a float parameter is compared as a float
    nested: tuple[tuple[type, ...] | None, ...] | None  # per allowed value: the element types it accepts (None: any)
    atype: type | None  # the answer's own type (a value of it is a "variable")
    variable: bool  # the answer's type is not the declared one: every accepted value is compared by equality
    kind: str  # how a non-variable value is compared: dict, dicts, str, list or eq
    allowed: list[Any]
    strings: frozenset[str]
    lists: list[list[Any]]
    dicts: tuple[_DictOption, ...]
    dict_lists: tuple[tuple[_DictOption, ...], ...]

    def accepts(self, value: Any) -> bool:
        if self.to_float and type(value) is int:
            value = float(value)
        t = type(value)
        if t is self.expected:
            if self.nested is not None:
                for accepted in self.nested:
                    if accepted is None or all(type(v) in accepted for v in value):
                        break
                else:
                    return False
            variable = self.variable
        elif self.atype is not None and t is self.atype:
            variable = True
        else:
            return False
        if not variable:
            kind = self.kind
            if kind == "str":
                return clean(value) in self.strings
            if kind == "list":
                return [cleaned(v) for v in value] in self.lists
            if kind == "dict":
                return any(o.accepts(value) for o in self.dicts)
            if kind == "dicts":
                n = len(value)
                return any(len(opts) == n and all(o.accepts(value[i]) for i, o in enumerate(opts))
                           for opts in self.dict_lists)
        return value in self.allowed


def _element_types(inner: type, allowed: list[Any]) -> tuple[type, ...]:
    """The element types an allowed list value accepts: the declared one, and its own answer type."""
    own = answer_type(allowed)
    return (inner,) if own is None else (inner, own)


def _param(schema: Any, allowed: Any) -> _Param:
    if type(schema) is not dict or type(allowed) is not list:
        raise TypeError("a declaration or answer of another shape")
    declared = schema["type"]
    expected = TYPES[declared]
    inner = TYPES[schema["items"]["type"]] if declared in ("array", "tuple") else None
    atype = answer_type(allowed)
    nested: tuple[tuple[type, ...] | None, ...] | None = None
    if inner is not None:
        nested = tuple(_element_types(inner, o) if type(o) is list else None for o in allowed)
    kind = "eq"
    strings: frozenset[str] = frozenset()
    lists: list[list[Any]] = []
    dicts: tuple[_DictOption, ...] = ()
    dict_lists: tuple[tuple[_DictOption, ...], ...] = ()
    if expected is dict:
        kind, dicts = "dict", tuple(_dict_option(o) for o in allowed if o != "")
    elif expected is list and inner is dict:
        kind = "dicts"
        # an allowed value of length n is compared with a candidate list of length n element by element
        # ("" compares with [] and nothing else)
        dict_lists = tuple(() if o == "" else tuple(_dict_option(x) for x in _list(o)) for o in allowed)
    elif expected is str:
        kind, strings = "str", frozenset(clean(a) for a in allowed if type(a) is str)
    elif expected is list:
        kind, lists = "list", [[cleaned(x) for x in items(o)] for o in allowed]
    return _Param(expected, declared == "float", nested, atype, atype is not None and atype is not expected, kind,
                  allowed, strings, lists, dicts, dict_lists)


def _list(o: Any) -> list[Any]:
    if type(o) is not list:
        raise TypeError("an allowed list of dicts that is not a list")
    return o


@dataclass(frozen=True, slots=True)
class Expected:
    """One expected call: `why(name, arguments)` is None when the call matches, else why not."""
    name: str
    required: tuple[str, ...]
    params: dict[str, _Param]  # the parameters both declared and in the answer
    must: tuple[str, ...]  # answer parameters a call may not leave out (no "" among their values)

    def why(self, name: str, arguments: dict[str, Any]) -> str | None:
        if name != self.name:
            return f"function: {name} is not {self.name}"
        try:
            for p in self.required:
                if p not in arguments:
                    return f"missing required argument {p!r}"
            params = self.params
            for p, value in arguments.items():
                spec = params.get(p)
                if spec is None:
                    return f"unexpected argument {p!r}"
                if not spec.accepts(value):
                    return f"value of {p!r} not allowed"
            for p in self.must:
                if p not in arguments:
                    return f"argument {p!r} missing"
        except COMPARE_ERRORS:
            return SHAPE
        return None


def compile_expected(schema: Any, answer: Any, spelled_name: str) -> Expected | None:
    """`answer` ({name: {param: allowed values}}) against its declaration `schema`, compiled; None for
    a shape this does not hold (the caller checks such an entry the general way)."""
    try:
        allowed = next(iter(answer.values()))
        parameters = schema["parameters"]
        props, required = parameters["properties"], parameters["required"]
        if not (type(allowed) is dict and type(props) is dict and type(required) is list
                and all(type(p) is str for p in required) and all(type(p) is str for p in allowed)):
            return None
        params = {p: _param(props[p], allowed[p]) for p in allowed if p in props}
        must = tuple(p for p, opts in allowed.items() if "" not in opts)
    except (*COMPARE_ERRORS, ValueError):
        return None
    return Expected(spelled_name, tuple(required), params, must)
