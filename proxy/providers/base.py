"""What every provider module declares, and the small helpers they share.

A provider module answers, for one HTTP API, every question nfproxy asks about it: does a request
belong to it, which body fields never change the answer (keying), which headers carry credentials
or select an API version, how its answers are framed and end, what text an answer holds, which
earlier answers a request carries (replay pairs by them), what an error body looks like so the
SDK prints it, and which environment variables point its SDKs at a base URL.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

Marks = set[str]


def text_mark(text: Any) -> str | None:
    """An answer's text as a mark: whitespace at the ends does not count (SDKs and agents strip it)."""
    if not isinstance(text, str):
        return None
    t = text.strip()
    return "t:" + hashlib.sha256(t.encode("utf-8", "surrogatepass")).hexdigest()[:24] if t else None


def id_mark(kind: str, value: Any) -> str | None:
    """An identifier the provider gave an answer (a tool call, a response, an output item)."""
    return f"{kind}:{value}" if isinstance(value, str) and value else None


def add(marks: Marks, *values: str | None) -> None:
    marks.update(v for v in values if v)


def dicts(value: Any) -> Iterable[dict[str, Any]]:
    return (v for v in value if isinstance(v, dict)) if isinstance(value, list) else ()


@dataclass(frozen=True)
class Answered:
    """What one recorded answer can be recognized by later: marks, and its texts (the generic
    provider looks for those inside later request bodies)."""

    marks: frozenset[str] = frozenset()
    texts: tuple[str, ...] = ()


def _openai_error(status: int, kind: str, message: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": kind, **extra}}


@dataclass(frozen=True)
class Provider:
    """One provider API. `keying` is the version of what this module does to keys (ignored fields,
    matching): bump it when either changes, and the stores it keyed are refused rather than
    silently missed. Everything else here may change freely without touching any store."""

    name: str
    matches: Callable[[str, str], bool]  # (lowercased host, route without query) -> bool
    ignore_fields: tuple[str, ...] = ()
    keying: int = 1
    credential_headers: tuple[str, ...] = ("authorization",)
    version_headers: tuple[str, ...] = ()  # they change what the provider does: kept in the key
    base_url_env: tuple[tuple[str, str], ...] = ()  # (variable, path after the proxy URL)
    terminal_events: tuple[bytes, ...] = ()  # how a stream of this API ends
    # (request JSON) -> marks of earlier answers the request carries
    carried: Callable[[Any], Marks] = field(default=lambda doc: set())
    # (response JSON document or None, stream events or None) -> the answer's marks and texts
    answered: Callable[[Any, list[dict[str, Any]] | None], Answered] = field(default=lambda doc, events: Answered())
    # (status, nfproxy error kind, message, extra fields) -> the error body this API's SDKs print
    error_body: Callable[[int, str, str, dict[str, Any]], dict[str, Any]] = _openai_error
    substring_deps: bool = False  # no structure to read: a request carries an answer whose text it contains


def sse_events(body: bytes) -> list[dict[str, Any]]:
    """The JSON `data:` payloads of an event stream, in order (`[DONE]` and non-JSON skipped)."""
    out = []
    text = body.decode("utf-8", errors="replace").replace("\r\n", "\n")
    for block in text.split("\n\n"):
        data = "\n".join(line[5:].lstrip() for line in block.split("\n") if line.startswith("data:"))
        if not data or data == "[DONE]":
            continue
        try:
            doc = json.loads(data)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def answered_from(texts: list[str], marks: Marks) -> Answered:
    kept = [t for t in texts if isinstance(t, str) and t.strip()]
    add(marks, *(text_mark(t) for t in kept))
    return Answered(frozenset(marks), tuple(kept))
