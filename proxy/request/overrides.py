"""Sampling overrides: `--set /temperature=0` rewrites a request body before it is keyed and sent.

This is how a ladder condition such as "temperature 0" is imposed on an agent that cannot be
edited. The value is JSON when it parses as JSON (0, 0.7, true, null, "text", [..]), else a string.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from noisefloor.proxy.request.keys import RuleError, parse_pointer


@dataclass(frozen=True)
class Override:
    pointer: str
    value: Any

    @classmethod
    def parse(cls, text: str) -> Override:
        pointer, sep, raw = text.partition("=")
        if not sep:
            raise RuleError(f"--set {text!r} needs POINTER=VALUE, e.g. /temperature=0")
        parse_pointer(pointer)
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        return cls(pointer, value)


def apply(doc: Any, overrides: Sequence[Override]) -> Any:
    """A copy of `doc` with each pointer set (missing objects on the way are created)."""
    for o in overrides:
        doc = _set(doc, parse_pointer(o.pointer), o.value)
    return doc


def _set(doc: Any, tokens: list[str], value: Any) -> Any:
    head, rest = tokens[0], tokens[1:]
    if isinstance(doc, list) and (head.isdigit() or head == "-"):
        out = list(doc)
        i = len(out) if head == "-" else int(head)
        if i >= len(out):
            out.append(_set({}, rest, value) if rest else value)
        else:
            out[i] = _set(out[i], rest, value) if rest else value
        return out
    out_d = dict(doc) if isinstance(doc, dict) else {}
    out_d[head] = _set(out_d.get(head, {}), rest, value) if rest else value
    return out_d


def describe(overrides: Sequence[Override]) -> dict[str, Any]:
    return {o.pointer: o.value for o in overrides}
