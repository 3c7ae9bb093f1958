"""Mistral: OpenAI-shaped chat (and FIM) on its own host, with its own error shape.

Keyed exactly as the OpenAI module keys the same routes (stores recorded before this module
existed keyed Mistral traffic that way), so adding it changes no key.
"""

from __future__ import annotations

from typing import Any

from noisefloor.proxy.providers import openai_chat
from noisefloor.proxy.providers.base import Provider


def matches(host: str, route: str) -> bool:
    return "mistral.ai" in host and openai_chat.matches(host, route)


def error_body(status: int, kind: str, message: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status, **extra}


PROVIDER = Provider(
    name="mistral",
    matches=matches,
    ignore_fields=openai_chat.IGNORE,
    credential_headers=("authorization",),
    base_url_env=(("MISTRAL_SERVER_URL", ""),),
    terminal_events=openai_chat.PROVIDER.terminal_events,
    carried=openai_chat.carried,
    answered=openai_chat.answered,
    error_body=error_body,
    served_doc=openai_chat.served,
    stream_texts=openai_chat.stream_texts,
)
