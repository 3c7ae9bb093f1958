"""MBPP+ specifics: argument types JSON cannot carry, and tasks whose outputs are not compared
by plain equality. Both follow the EvalPlus evaluator's rules, written here as data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def _tuples(depth: int) -> Callable[[Any], Any]:
    """Turn the lists `depth` levels inside one argument into tuples."""

    def convert(value: Any, level: int = 0) -> Any:
        if level == depth:
            return tuple(value)
        return [convert(v, level + 1) for v in value]

    return lambda arg: convert(arg)


def _all_tuples(value: Any) -> Any:
    return tuple(_all_tuples(v) for v in value) if isinstance(value, list) else value


def _each_arg(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    return lambda args: [fn(a) for a in args]


def _first_arg(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    return lambda args: [fn(args[0]), *args[1:]]


_as_tuple = _tuples(0)
_members_as_tuples = _tuples(1)

# task number -> how to rebuild one input (a list of arguments)
_RULES: dict[int, Callable[[list[Any]], Any]] = {}
for _n in (2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630, 726, 740, 744, 809):
    _RULES[_n] = _each_arg(_as_tuple)  # every argument is a tuple
for _n in (63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780):
    _RULES[_n] = _each_arg(_members_as_tuples)  # every argument is a list of tuples
for _n in (75, 413, 444, 753):
    _RULES[_n] = lambda args: [[tuple(x) for x in args[0]], *args[1:]]  # first: a list of tuples
for _n in (106, 750):
    _RULES[_n] = lambda args: [args[0], tuple(args[1])]  # second argument is a tuple
for _n in (250, 405, 446, 617, 720, 763, 808):
    _RULES[_n] = _first_arg(_as_tuple)  # first argument is a tuple
for _n in (259, 401, 445):
    _RULES[_n] = _each_arg(lambda a: tuple(tuple(x) for x in a))  # tuples of tuples
for _n in (580, 615, 791):
    _RULES[_n] = _all_tuples  # every list at any depth is a tuple
_RULES[115] = lambda args: [[set(x) if isinstance(x, list) and x else {} for x in args[0]]]  # sets ({} when empty)
_RULES[124] = lambda args: (float(args[0]), complex(args[1]))
_RULES[252] = lambda args: [complex(args[0])]
_RULES[278] = lambda args: [tuple(tuple(x) if isinstance(x, list) else x for x in args[0])]
_RULES[307] = lambda args: [tuple(args[0]), args[1], args[2]]
_RULES[722] = lambda args: [{k: tuple(v) for k, v in args[0].items()}, *args[1:]]


def deserialize_inputs(task_id: str, inputs: list[Any]) -> list[Any]:
    rule = _RULES.get(int(task_id.rsplit("/", 1)[-1]))
    return [rule(inp) for inp in inputs] if rule else inputs


# Outputs compared as sets (order and duplicates free), or only as "not None".
SET_EQUAL = frozenset({"similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly", "larg_nnum",
                       "intersection_array", "find_dissimilar", "Diff"})
NOT_NONE = frozenset({"check_str", "text_match_three", "text_starta_endb"})


def surface_area(base_edge: float, height: float) -> int:
    """Mbpp/581's reference formula, used as an oracle next to the recorded expectation."""
    slant = math.sqrt((base_edge / 2) ** 2 + height**2)
    return round(base_edge**2 + 4 * (base_edge * slant) / 2)


def digit_distance(a: int, b: int) -> int:
    """Mbpp/558's reference: digits aligned by zero-padding the shorter number."""
    x, y = str(a), str(b)
    n = max(len(x), len(y))
    return sum(abs(int(p) - int(q)) for p, q in zip(x.zfill(n), y.zfill(n)))
