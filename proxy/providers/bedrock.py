"""Amazon Bedrock runtime: the Converse API and InvokeModel (an Anthropic body inside).

Requests are signed (SigV4), so the signature and the session token are credentials and never
part of the key; the body is keyed as it is (no ignored fields: the generic rules keyed this
traffic before this module existed). Streams use AWS's binary event-stream framing, which
nfproxy records and replays byte for byte but does not read.
"""

from __future__ import annotations

from typing import Any

from noisefloor.proxy.providers import anthropic, generic
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
    opt_int,
    opt_str,
    text_mark,
    thread_add,
)


def matches(host: str, route: str) -> bool:
    return host.startswith("bedrock-runtime") or (route.startswith("/model/") and route.endswith(
        ("/converse", "/converse-stream", "/invoke", "/invoke-with-response-stream")))


def _content(content: Any, marks: Marks) -> list[str]:
    texts = []
    for b in dicts(content):
        if isinstance(b.get("text"), str):
            texts.append(b["text"])
        for name in ("toolUse", "toolResult"):
            if isinstance(b.get(name), dict):
                add(marks, id_mark("c", b[name].get("toolUseId")))
    return texts


def carried(doc: Any) -> Marks:
    if isinstance(doc, dict) and "anthropic_version" in doc:  # InvokeModel with an Anthropic body
        return anthropic.carried(doc)
    marks: Marks = set()
    for m in dicts(doc.get("messages") if isinstance(doc, dict) else None):
        texts = _content(m.get("content"), marks) if m.get("role") in ("assistant", "user") else []
        if m.get("role") == "assistant":
            add(marks, *(text_mark(t) for t in texts), text_mark("".join(texts)))
    return marks


def answered(doc: Any, events: list[dict[str, Any]] | None) -> Answered:
    if isinstance(doc, dict) and isinstance(doc.get("content"), list):
        return anthropic.answered(doc, None)
    marks: Marks = set()
    message = ((doc or {}).get("output") or {}).get("message") if isinstance(doc, dict) else None
    texts = _content(message.get("content"), marks) if isinstance(message, dict) else []
    if len(texts) > 1:
        texts.append("".join(texts))
    return answered_from(texts, marks)


def served(doc: Any) -> Served:
    """Converse's own usage (`inputTokens` / `outputTokens`) and `stopReason` ("max_tokens" is a
    truncation); an InvokeModel body in another provider's shape is read as that shape. Converse
    names no model in its answer: the requested one is in the route."""
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if isinstance(usage, dict) and ("inputTokens" in usage or "outputTokens" in usage):
        return Served(input_tokens=opt_int(usage.get("inputTokens")), output_tokens=opt_int(usage.get("outputTokens")),
                      finish_reason=opt_str(doc.get("stopReason")))
    return generic.served(doc)


def stream_texts(events: list[Any]) -> list[Thread]:
    """ConverseStream: each content block's text, reasoning and tool input deltas. InvokeModel's
    stream: the Anthropic events its chunks wrap (`bytes`, read by `stream_events`)."""
    threads: dict[Any, Thread] = {}
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            continue
        delta = ev.get("delta")
        if isinstance(delta, dict):
            index = ev.get("contentBlockIndex", 0)
            thread_add(threads, (index, "text"), i, ("delta", "text"), delta.get("text"))
            for name, inner in (("toolUse", "input"), ("reasoningContent", "text")):
                if isinstance(delta.get(name), dict):
                    thread_add(threads, (index, name), i, ("delta", name, inner), delta[name].get(inner))
    wrapped = [ev.get("bytes") if isinstance(ev, dict) else None for ev in events]
    inner = [[(i, ("bytes", *path)) for i, path in t] for t in anthropic.stream_texts(wrapped)]
    return list(threads.values()) + inner


def error_body(status: int, kind: str, message: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"message": message, "__type": kind, **extra}


PROVIDER = Provider(
    name="bedrock",
    matches=matches,
    credential_headers=("authorization", "x-amz-security-token", "x-amz-content-sha256"),
    base_url_env=(("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", ""),),
    carried=carried,
    answered=answered,
    error_body=error_body,
    served_doc=served,
    served_event=generic.served_event,
    rewrite_user=generic.rewrite_user,
    stream_texts=stream_texts,
)
