"""The OpenAI Responses API: state rides in `previous_response_id` or in output items sent back."""

from __future__ import annotations

from typing import Any

from noisefloor.proxy.providers import openai_chat
from noisefloor.proxy.providers.base import Answered, Marks, Provider, add, answered_from, dicts, id_mark, text_mark


def matches(host: str, route: str) -> bool:
    return route.endswith("/responses")


def _item_marks(item: dict[str, Any], marks: Marks) -> str | None:
    """An output item's identifiers; returns its text when it is an assistant message."""
    add(marks, id_mark("i", item.get("id")), id_mark("c", item.get("call_id")))
    if item.get("type", "message") == "message" and item.get("role") == "assistant":
        return openai_chat.message_text(item.get("content"))
    return None


def carried(doc: Any) -> Marks:
    marks: Marks = set()
    if not isinstance(doc, dict):
        return marks
    add(marks, id_mark("r", doc.get("previous_response_id")))
    for item in dicts(doc.get("input")):
        add(marks, text_mark(_item_marks(item, marks)))
    return marks


def answered(doc: Any, events: list[dict[str, Any]] | None) -> Answered:
    if events is not None:  # the closing event carries the whole response
        doc = next((ev.get("response") for ev in reversed(events)
                    if ev.get("type") in ("response.completed", "response.incomplete")), None)
    marks: Marks = set()
    texts: list[str] = []
    if isinstance(doc, dict):
        add(marks, id_mark("r", doc.get("id")))
        for item in dicts(doc.get("output")):
            text = _item_marks(item, marks)
            if text:
                texts.append(text)
    return answered_from(texts, marks)


PROVIDER = Provider(
    name="openai-responses",
    matches=matches,
    ignore_fields=openai_chat.IGNORE,
    credential_headers=openai_chat.PROVIDER.credential_headers,
    version_headers=("openai-beta",),
    base_url_env=(("OPENAI_BASE_URL", "/v1"),),
    terminal_events=(b"event: response.completed", b'"type":"response.completed"', b'"type": "response.completed"',
                     b"event: response.incomplete", b"event: response.failed"),
    carried=carried,
    answered=answered,
)
