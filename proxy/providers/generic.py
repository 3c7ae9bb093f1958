"""Any other HTTP API: keyed as it is; a request depends on an earlier answer whose text it contains."""

from __future__ import annotations

from typing import Any

from noisefloor.proxy.providers import anthropic, gemini, openai_chat, openai_responses
from noisefloor.proxy.providers.base import Answered, Provider


def answered(doc: Any, events: list[dict[str, Any]] | None) -> Answered:
    """Whatever text one of the known shapes finds (OpenAI-compatible servers are common)."""
    marks: set[str] = set()
    texts: list[str] = []
    for p in (openai_chat, openai_responses, anthropic, gemini):
        got = p.answered(doc, events)
        marks |= got.marks
        texts += [t for t in got.texts if t not in texts]
    return Answered(frozenset(marks), tuple(texts))


PROVIDER = Provider(name="generic", matches=lambda host, route: True, answered=answered, substring_deps=True)
