"""The OpenAI Responses API: state rides in `previous_response_id` or in output items sent back."""

from __future__ import annotations

from typing import Any

from noisefloor.proxy.providers import openai_chat
from noisefloor.proxy.providers.base import (
    Answered,
    Marks,
    Provider,
    Rewrite,
    Served,
    Thread,
    add,
    answered_from,
    dicts,
    id_mark,
    obj,
    opt_int,
    opt_str,
    rewrite_chat_turn,
    rewrite_last_user,
    text_mark,
    thread_add,
)


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


def served(doc: Any) -> Served:
    usage = obj(doc, "usage")
    finish = None
    if doc.get("status") == "incomplete":
        reason = obj(doc, "incomplete_details").get("reason")
        finish = "length" if reason == "max_output_tokens" else reason
    return Served(model=opt_str(doc.get("model")), input_tokens=opt_int(usage.get("input_tokens")),
                  output_tokens=opt_int(usage.get("output_tokens")), finish_reason=opt_str(finish))


def served_event(ev: dict[str, Any]) -> Served:
    """The closing event carries the whole response."""
    if ev.get("type") in ("response.completed", "response.incomplete"):
        return served(obj(ev, "response"))
    return Served()


def stream_texts(events: list[Any]) -> list[Thread]:
    """Every `*.delta` event's `delta` (output text, refusal, reasoning, a function call's
    arguments): one text per event type and item part, as the SDK accumulates them."""
    threads: dict[Any, Thread] = {}
    for i, ev in enumerate(events):
        kind = ev.get("type") if isinstance(ev, dict) else None
        if isinstance(kind, str) and kind.endswith(".delta"):
            name = (kind, *(str(ev.get(k)) for k in ("item_id", "output_index", "content_index", "summary_index")))
            thread_add(threads, name, i, ("delta",), ev.get("delta"))
    return list(threads.values())


def rewrite_user(doc: dict[str, Any], rewrite: Rewrite) -> bool:
    """`input` is a string, or a list of turns and items."""
    if isinstance(doc.get("input"), str):
        doc["input"] = rewrite(doc["input"])
        return True
    return rewrite_last_user(doc.get("input"), rewrite, rewrite_chat_turn)


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
    served_doc=served,
    served_event=served_event,
    rewrite_user=rewrite_user,
    stream_texts=stream_texts,
)
