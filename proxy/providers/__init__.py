"""One module per provider API (see `base.Provider` for what each declares).

Detection order matters only where two modules could claim a request; it is fixed so that every
request is keyed by the same rules as before a module was added (Mistral claims only routes the
OpenAI module keyed identically; Bedrock only what the generic module keyed as it is).

Adding a provider: one module that builds a `Provider`, registered through the
`noisefloor.providers` entry point group (`name = "package.module:PROVIDER"` in its project's
metadata) or by calling `register`. Registered providers are asked after the built-in ones that
claim routes and before the generic one, so they take over only what was keyed as it is; one
that changes nothing about keys (no ignored fields, no version headers) leaves every store
replaying as before.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Any

from noisefloor.errors import InputError
from noisefloor.proxy.providers import anthropic, bedrock, gemini, generic, mistral, openai_chat, openai_responses
from noisefloor.proxy.providers.base import Answered, Marks, Provider, Rewrite, Served, folded, sse_events

__all__ = ["PROVIDERS", "Answered", "Marks", "Provider", "Rewrite", "Served", "answered", "carried", "detect", "pick",
           "register", "sdk_env", "served", "sse_events", "body_doc", "UNPARSED", "NOT_JSON"]
ENTRY_POINTS = "noisefloor.providers"

# Bump when any module's matching or ignored fields change in a way that moves existing keys.
KEYING_VERSION = 1

_ORDER = [gemini.PROVIDER, anthropic.PROVIDER, openai_responses.PROVIDER, mistral.PROVIDER, openai_chat.PROVIDER,
          bedrock.PROVIDER, generic.PROVIDER]
PROVIDERS: dict[str, Provider] = {p.name: p for p in _ORDER}


def register(provider: Provider) -> None:
    """Add a provider: asked after the built-in ones, before the generic one."""
    if not isinstance(provider, Provider):
        raise InputError(f"a provider must be a noisefloor Provider, not {type(provider).__name__}")
    if provider.name in PROVIDERS:
        raise InputError(f"a provider named {provider.name!r} is already registered; give it another name")
    _ORDER.insert(len(_ORDER) - 1, provider)
    PROVIDERS[provider.name] = provider
    credential_headers.cache_clear()
    terminal_events.cache_clear()


def generation() -> tuple[int, int]:
    """The registry as it stands: changes when a provider is registered, or the list is swapped
    (keying, which the provider decides, is remembered under it)."""
    return id(_ORDER), len(_ORDER)


def _load_entry_points() -> None:
    for ep in entry_points(group=ENTRY_POINTS):
        try:
            register(ep.load())
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the proxy; it says so
            logging.getLogger("nfproxy").error("nfproxy: provider %s (%s) not loaded: %s", ep.name, ep.value, exc)


_load_entry_points()


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


def sdk_env(url: str) -> dict[str, str]:
    """The environment variables that point each provider's SDKs at `url` (the proxy)."""
    return {var: url + tail for p in _ORDER for var, tail in p.base_url_env}


@lru_cache(maxsize=1)
def credential_headers() -> frozenset[str]:
    """Every provider's credential headers (erased from what is stored and shown)."""
    return frozenset(h for p in _ORDER for h in p.credential_headers)


@lru_cache(maxsize=1)
def terminal_events() -> tuple[bytes, ...]:
    """How the providers end a stream."""
    return tuple(dict.fromkeys(m for p in _ORDER for m in p.terminal_events))


UNPARSED: Any = object()  # `served` and `answered` parse the body themselves
NOT_JSON: Any = object()  # `body_doc` of a stream, or of a body that is not JSON


def _stream(content_type: str | None) -> bool:
    return bool(content_type) and content_type.lower().startswith("text/event-stream")  # type: ignore[union-attr]


def body_doc(body: bytes, content_type: str | None) -> Any:
    """A response body (decoded) parsed once, for both `served` and `answered` (the recorder
    asks both of every answer, on the path the client waits on)."""
    if _stream(content_type):
        return NOT_JSON
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return NOT_JSON


def served(provider: Provider, body: bytes, content_type: str | None, doc: Any = UNPARSED) -> Served:
    """Served model, fingerprint, usage and finish reason of a response (decoded body): a JSON
    document, or a server-sent event stream folded event by event (`doc`: `body_doc`'s)."""
    try:
        if _stream(content_type):
            per_event = provider.served_event or provider.served_doc
            return folded(per_event(ev) for ev in sse_events(body))
        doc = json.loads(body) if doc is UNPARSED else doc
        return provider.served_doc(doc) if isinstance(doc, dict) else Served()
    except (ValueError, UnicodeDecodeError, RecursionError, TypeError, AttributeError):
        return Served()


def rewrite_user(provider: Provider, doc: dict[str, Any], rewrite: Rewrite) -> dict[str, Any] | None:
    """A copy of the request with its last user text rewritten, or None if it has no user text."""
    doc = json.loads(json.dumps(doc))  # deep copy: the caller's parsed body stays untouched
    return doc if provider.rewrite_user(doc, rewrite) else None


def carried(provider: Provider, doc: Any) -> Marks:
    """The marks of earlier answers a request body (parsed JSON) carries."""
    try:
        return provider.carried(doc)
    except (TypeError, AttributeError, ValueError):  # an odd body carries nothing we can read
        return set()


def answered(provider: Provider, body: bytes, content_type: str | None, doc: Any = UNPARSED) -> Answered:
    """What a response (decoded body) can be recognized by in later requests (`doc`: `body_doc`'s)."""
    events = None
    if _stream(content_type):
        events, doc = sse_events(body), None
    elif doc is NOT_JSON:
        return Answered()
    elif doc is UNPARSED:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return Answered()
    try:
        return provider.answered(doc, events)
    except (TypeError, AttributeError, ValueError):
        return Answered()
