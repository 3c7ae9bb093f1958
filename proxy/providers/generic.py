"""Any other HTTP API: keyed as it is; a request depends on an earlier answer whose text it contains."""

from __future__ import annotations

from typing import Any

from noisefloor.proxy.providers import anthropic, gemini, openai_chat, openai_responses
from noisefloor.proxy.providers.base import (
    Answered,
    Provider,
    Rewrite,
    Served,
    Thread,
    first_of,
    rewrite_messages,
    texts_by_path,
)

_SHAPES = (openai_chat, anthropic, gemini, openai_responses)  # the order fields are looked for


def answered(doc: Any, events: list[dict[str, Any]] | None) -> Answered:
    """Whatever text one of the known shapes finds (OpenAI-compatible servers are common)."""
    marks: set[str] = set()
    texts: list[str] = []
    for p in (openai_chat, openai_responses, anthropic, gemini):
        got = p.answered(doc, events)
        marks |= got.marks
        texts += [t for t in got.texts if t not in texts]
    return Answered(frozenset(marks), tuple(texts))


def served(doc: Any) -> Served:
    """Each field from the first known shape that has it."""
    return first_of(p.served(doc) for p in _SHAPES)


def served_event(ev: dict[str, Any]) -> Served:
    if ev.get("type") in ("message_start", "message_delta"):
        return anthropic.served_event(ev)
    if ev.get("type") in ("response.completed", "response.incomplete"):
        return openai_responses.served_event(ev)
    return served(ev)


def rewrite_user(doc: dict[str, Any], rewrite: Rewrite) -> bool:
    """The first known shape the request has: chat `messages`, Gemini `contents`, Responses `input`."""
    return rewrite_messages(doc, rewrite) or gemini.rewrite_user(doc, rewrite) or \
        openai_responses.rewrite_user(doc, rewrite)


def stream_texts(events: list[Any]) -> list[Thread]:
    """The texts every known shape assembles, and the strings at each one path across events."""
    return [t for p in _SHAPES for t in p.stream_texts(events)] + texts_by_path(events)


PROVIDER = Provider(name="generic", matches=lambda host, route: True, answered=answered, substring_deps=True,
                    served_doc=served, served_event=served_event, rewrite_user=rewrite_user,
                    stream_texts=stream_texts)
