"""One module per provider API (see `base.Provider` for what each declares).

Detection order matters only where two modules could claim a request; it is fixed so that every
request is keyed by the same rules as before a module was added (Mistral claims only routes the
OpenAI module keyed identically; Bedrock only what the generic module keyed as it is).
"""

from __future__ import annotations

import json
from typing import Any

from noisefloor.errors import InputError
from noisefloor.proxy.providers import anthropic, bedrock, gemini, generic, mistral, openai_chat, openai_responses
from noisefloor.proxy.providers.base import Answered, Marks, Provider, sse_events

__all__ = ["PROVIDERS", "Answered", "Marks", "Provider", "answered", "carried", "detect", "pick", "sse_events"]

# Bump when any module's matching or ignored fields change in a way that moves existing keys.
KEYING_VERSION = 1

_ORDER = (gemini.PROVIDER, anthropic.PROVIDER, openai_responses.PROVIDER, mistral.PROVIDER, openai_chat.PROVIDER,
          bedrock.PROVIDER, generic.PROVIDER)
PROVIDERS: dict[str, Provider] = {p.name: p for p in _ORDER}


def detect(host: str, path: str) -> Provider:
    """The provider of a request, from its host and path (any OpenAI-compatible server included)."""
    route = path.split("?", 1)[0].rstrip("/")
    host = host.lower()
    return next(p for p in _ORDER if p.matches(host, route))


def pick(forced: str | None, host: str, path: str) -> Provider:
    if forced is not None:
        if forced not in PROVIDERS:
            raise InputError(f"unknown profile {forced!r}; choose one of {', '.join(PROVIDERS)}")
        return PROVIDERS[forced]
    return detect(host, path)


def carried(provider: Provider, doc: Any) -> Marks:
    """The marks of earlier answers a request body (parsed JSON) carries."""
    try:
        return provider.carried(doc)
    except (TypeError, AttributeError, ValueError):  # an odd body carries nothing we can read
        return set()


def answered(provider: Provider, body: bytes, content_type: str | None) -> Answered:
    """What a response (decoded body) can be recognized by in later requests."""
    events = None
    doc = None
    if content_type and content_type.lower().startswith("text/event-stream"):
        events = sse_events(body)
    else:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return Answered()
    try:
        return provider.answered(doc, events)
    except (TypeError, AttributeError, ValueError):
        return Answered()
