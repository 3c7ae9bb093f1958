"""Anthropic messages: earlier assistant turns are text and `tool_use` blocks."""

from __future__ import annotations

from typing import Any

from noisefloor.proxy.providers.base import (
    Answered,
    Marks,
    Provider,
    Served,
    Thread,
    add,
    answered_from,
    dicts,
    id_mark,
    obj,
    opt_int,
    opt_str,
    text_mark,
    thread_add,
)


def matches(host: str, route: str) -> bool:
    return route.endswith("/messages") or "anthropic" in host


def _blocks(content: Any, marks: Marks) -> list[str]:
    if isinstance(content, str):
        return [content]
    texts = []
    for b in dicts(content):
        if b.get("type") == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        add(marks, id_mark("c", b.get("id") if b.get("type") == "tool_use" else None))
    return texts


def carried(doc: Any) -> Marks:
    marks: Marks = set()
    for m in dicts(doc.get("messages") if isinstance(doc, dict) else None):
        if m.get("role") == "assistant":
            texts = _blocks(m.get("content"), marks)
            add(marks, *(text_mark(t) for t in texts), text_mark("".join(texts)))
        elif m.get("role") == "user":
            for b in dicts(m.get("content")):
                if b.get("type") == "tool_result":
                    add(marks, id_mark("c", b.get("tool_use_id")))
    return marks


def answered(doc: Any, events: list[dict[str, Any]] | None) -> Answered:
    marks: Marks = set()
    if events is not None:
        pieces: dict[int, list[str]] = {}
        for ev in events:
            kind = ev.get("type")
            if kind == "content_block_start" and isinstance(ev.get("content_block"), dict):
                block = ev["content_block"]
                add(marks, id_mark("c", block.get("id") if block.get("type") == "tool_use" else None))
                if isinstance(block.get("text"), str):
                    pieces.setdefault(ev.get("index", 0), []).append(block["text"])
            elif kind == "content_block_delta" and isinstance(ev.get("delta"), dict):
                if isinstance(ev["delta"].get("text"), str):
                    pieces.setdefault(ev.get("index", 0), []).append(ev["delta"]["text"])
        texts = ["".join(p) for _, p in sorted(pieces.items())]
    else:
        texts = _blocks(doc.get("content") if isinstance(doc, dict) else None, marks)
    if len(texts) > 1:
        texts.append("".join(texts))
    return answered_from(texts, marks)


_BLOCK_TEXTS = ("text", "thinking", "partial_json")  # a content block's text, reasoning, a tool call's input


def stream_texts(events: list[Any]) -> list[Thread]:
    """Each content block's text, thinking and tool input (`partial_json`): its start's and its
    deltas' strings in order, as the SDKs assemble them."""
    threads: dict[Any, Thread] = {}
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            continue
        kind, index = ev.get("type"), ev.get("index", 0)
        part = "content_block" if kind == "content_block_start" else "delta" if kind == "content_block_delta" else None
        if part is not None and isinstance(ev.get(part), dict):
            for name in _BLOCK_TEXTS:
                thread_add(threads, (index, name), i, (part, name), ev[part].get(name))
    return list(threads.values())


def error_body(status: int, kind: str, message: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message, **extra}}


def served(doc: Any) -> Served:
    usage = obj(doc, "usage")
    return Served(model=opt_str(doc.get("model")), input_tokens=opt_int(usage.get("input_tokens")),
                  output_tokens=opt_int(usage.get("output_tokens")), finish_reason=opt_str(doc.get("stop_reason")))


def served_event(ev: dict[str, Any]) -> Served:
    """The message comes in `message_start`; the stop reason and output tokens in `message_delta`."""
    if ev.get("type") == "message_start":
        return served(obj(ev, "message"))
    if ev.get("type") == "message_delta":
        return Served(finish_reason=opt_str(obj(ev, "delta").get("stop_reason")),
                      output_tokens=opt_int(obj(ev, "usage").get("output_tokens")))
    return Served()


PROVIDER = Provider(
    name="anthropic",
    matches=matches,
    ignore_fields=("/metadata/user_id",),
    credential_headers=("x-api-key", "authorization"),
    version_headers=("anthropic-version", "anthropic-beta"),
    base_url_env=(("ANTHROPIC_BASE_URL", ""),),
    terminal_events=(b'"type":"message_stop"', b'"type": "message_stop"', b"event: message_stop"),
    carried=carried,
    answered=answered,
    error_body=error_body,
    served_doc=served,
    served_event=served_event,
    stream_texts=stream_texts,
)
