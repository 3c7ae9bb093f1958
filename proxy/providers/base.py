"""What every provider module declares, and the small helpers they share.

A provider module answers, for one HTTP API, every question nfproxy asks about it: does a request
belong to it, which body fields never change the answer (keying), which headers carry credentials
or select an API version, how its answers are framed and end, what text an answer holds, which
earlier answers a request carries (replay pairs by them), what an error body looks like so the
SDK prints it, which environment variables point its SDKs at a base URL, what the log keeps of
an answer (served model, usage, finish reason), and where the last user message is (perturbations
rewrite it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

Marks = set[str]
Rewrite = Callable[[str], str]
# finish reasons that mean "the model was cut off by the token limit"
TRUNCATION = frozenset({"length", "max_tokens", "MAX_TOKENS"})


@dataclass(frozen=True)
class Served:
    """What the log keeps of an answer, pulled out once at record time: the analyzer groups by
    served model and fingerprint and counts truncations without re-reading bodies."""

    model: str | None = None
    fingerprint: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason in TRUNCATION


def first_of(parts: Iterable[Served]) -> Served:
    """Each field from the first part that has it (shapes tried in order)."""
    found: dict[str, Any] = {}
    for part in parts:
        for f in fields(Served):
            if found.get(f.name) is None:
                found[f.name] = getattr(part, f.name)
    return Served(**found)


def folded(parts: Iterable[Served]) -> Served:
    """A stream's events folded: later events fill what earlier ones left empty, or update it."""
    return first_of(reversed(list(parts)))


def opt_str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def opt_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def obj(doc: Any, name: str) -> dict[str, Any]:
    v = doc.get(name) if isinstance(doc, dict) else None
    return v if isinstance(v, dict) else {}


def first(doc: Any, name: str) -> dict[str, Any]:
    v = doc.get(name) if isinstance(doc, dict) else None
    return v[0] if isinstance(v, list) and v and isinstance(v[0], dict) else {}


def rewrite_chat_turn(turn: dict[str, Any], rewrite: Rewrite) -> bool:
    """A chat turn's text rewritten in place: string content, or its last text part."""
    content = turn.get("content")
    if isinstance(content, str):
        turn["content"] = rewrite(content)
        return True
    for part in reversed(content if isinstance(content, list) else []):
        if isinstance(part, dict) and part.get("type") in ("text", "input_text") and isinstance(part.get("text"), str):
            part["text"] = rewrite(part["text"])
            return True
    return False


def rewrite_last_user(turns: Any, rewrite: Rewrite, turn_text: Callable[[dict[str, Any], Rewrite], bool]) -> bool:
    """The last user turn of a list that has text, rewritten in place."""
    for turn in reversed(turns if isinstance(turns, list) else []):
        if isinstance(turn, dict) and turn.get("role", "user") == "user" and turn_text(turn, rewrite):
            return True
    return False


def rewrite_messages(doc: dict[str, Any], rewrite: Rewrite) -> bool:
    """Chat-shaped requests (`messages`): OpenAI chat, Anthropic, Mistral."""
    return rewrite_last_user(doc.get("messages"), rewrite, rewrite_chat_turn)


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


Path = tuple[Any, ...]  # keys and list indices from a stream event's root to one string in it
Thread = list[tuple[int, Path]]  # the strings that make one text of a stream, in order: (event number, path)


def strings(doc: Any, path: Path = ()) -> Iterable[tuple[Path, str]]:
    """Every string in `doc`, with its path."""
    if isinstance(doc, str):
        yield path, doc
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield from strings(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from strings(v, (*path, i))


def texts_by_path(events: list[Any]) -> list[Thread]:
    """A stream of unknown shape: the strings at one path of every event, in order, make one text
    (a delta's `content` across events is a text; an `id` repeated in each is a harmless one)."""
    threads: dict[Path, Thread] = {}
    for i, ev in enumerate(events):
        for path, _ in strings(ev):
            threads.setdefault(path, []).append((i, path))
    return list(threads.values())


def thread_add(threads: dict[Any, Thread], name: Any, i: int, path: Path, value: Any) -> None:
    """Add `path` of event `i` to text `name` when it holds a string."""
    if isinstance(value, str):
        threads.setdefault(name, []).append((i, path))


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
    # (response JSON document) -> served model, usage, finish reason
    served_doc: Callable[[Any], Served] = field(default=lambda doc: Served())
    # (one stream event) -> its part of the same; a stream's events are folded (default: as documents)
    served_event: Callable[[dict[str, Any]], Served] | None = None
    # (request JSON object, rewrite) -> whether its last user text was rewritten (in place)
    rewrite_user: Callable[[dict[str, Any], Rewrite], bool] = rewrite_messages
    # (a stream's events, parsed; None where one is not JSON) -> the texts the stream assembles: each
    # the strings, in order, whose joined text is one answer's (a choice's content, a tool call's
    # arguments). A secret is searched for in each such text (`secrets.erase_events`)
    stream_texts: Callable[[list[Any]], list[Thread]] = texts_by_path


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
