"""OpenAI chat completions (and the legacy completions and embeddings routes of the same API)."""

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
    first,
    id_mark,
    obj,
    opt_int,
    opt_str,
    text_mark,
    thread_add,
)

IGNORE = ("/user", "/prompt_cache_key", "/safety_identifier")  # end-user ids and cache hints


def matches(host: str, route: str) -> bool:
    return route.endswith(("/chat/completions", "/completions", "/embeddings")) or "openai" in host


def message_text(content: Any) -> str | None:
    """A chat message's text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    parts = [p.get("text") for p in dicts(content) if p.get("type") in ("text", "output_text")]
    return "".join(p for p in parts if isinstance(p, str)) if parts else None


def carried(doc: Any) -> Marks:
    """Assistant turns (text and tool calls) and tool results sent back in `messages`."""
    marks: Marks = set()
    for m in dicts(doc.get("messages") if isinstance(doc, dict) else None):
        if m.get("role") == "assistant":
            add(marks, text_mark(message_text(m.get("content"))))
            for call in dicts(m.get("tool_calls")):
                add(marks, id_mark("c", call.get("id")))
        elif m.get("role") == "tool":
            add(marks, id_mark("c", m.get("tool_call_id")))
    return marks


def answered(doc: Any, events: list[dict[str, Any]] | None) -> Answered:
    marks: Marks = set()
    texts: list[str] = []
    if events is not None:  # deltas per choice index
        pieces: dict[int, list[str]] = {}
        for ev in events:
            for ch in dicts(ev.get("choices")):
                delta = ch.get("delta") if isinstance(ch.get("delta"), dict) else {}
                if isinstance(delta.get("content"), str):
                    pieces.setdefault(ch.get("index", 0), []).append(delta["content"])
                for call in dicts(delta.get("tool_calls")):
                    add(marks, id_mark("c", call.get("id")))
        texts = ["".join(p) for _, p in sorted(pieces.items())]
    elif isinstance(doc, dict):
        for ch in dicts(doc.get("choices")):
            msg = ch.get("message") if isinstance(ch.get("message"), dict) else {}
            texts.append(message_text(msg.get("content")) or ch.get("text") or "")
            for call in dicts(msg.get("tool_calls")):
                add(marks, id_mark("c", call.get("id")))
    return answered_from(texts, marks)


def stream_texts(events: list[Any]) -> list[Thread]:
    """Each choice's content (and refusal, reasoning) deltas, each tool call's argument deltas, a
    legacy completion's text: one text each, as the SDKs assemble them."""
    threads: dict[Any, Thread] = {}
    for i, ev in enumerate(events):
        for k, ch in enumerate(ev.get("choices") or () if isinstance(ev, dict) else ()):
            if not isinstance(ch, dict):
                continue
            choice = ch.get("index", k)
            thread_add(threads, ("text", choice), i, ("choices", k, "text"), ch.get("text"))
            delta = ch.get("delta")
            if not isinstance(delta, dict):
                continue
            for name in ("content", "refusal", "reasoning_content", "reasoning"):
                thread_add(threads, (name, choice), i, ("choices", k, "delta", name), delta.get(name))
            for m, call in enumerate(delta.get("tool_calls") or () if isinstance(delta.get("tool_calls"), list) else ()):
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    thread_add(threads, ("call", choice, call.get("index", m)), i,
                               ("choices", k, "delta", "tool_calls", m, "function", "arguments"), fn.get("arguments"))
    return list(threads.values())


def served(doc: Any) -> Served:
    """A completion, or one chunk of a stream (usage comes in the last)."""
    usage = obj(doc, "usage")
    return Served(opt_str(doc.get("model")), opt_str(doc.get("system_fingerprint")), opt_int(usage.get("prompt_tokens")),
                  opt_int(usage.get("completion_tokens")), opt_str(first(doc, "choices").get("finish_reason")))


PROVIDER = Provider(
    name="openai",
    matches=matches,
    ignore_fields=IGNORE,
    credential_headers=("authorization", "openai-organization", "openai-project"),
    version_headers=("openai-beta",),
    base_url_env=(("OPENAI_BASE_URL", "/v1"),),
    terminal_events=(b"data: [DONE]", b"data:[DONE]"),
    carried=carried,
    answered=answered,
    served_doc=served,
    stream_texts=stream_texts,
)
