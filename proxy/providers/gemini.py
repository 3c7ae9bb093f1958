"""Google Gemini generateContent: earlier answers come back as `model` turns in `contents`."""

from __future__ import annotations

import json
from typing import Any

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
    first,
    obj,
    opt_int,
    opt_str,
    rewrite_last_user,
    text_mark,
    thread_add,
)


def matches(host: str, route: str) -> bool:
    low = route.lower()
    return ":generatecontent" in low or ":streamgeneratecontent" in low or "generativelanguage" in host


def _parts(parts: Any, marks: Marks) -> str:
    texts = []
    for p in dicts(parts):
        if isinstance(p.get("text"), str) and not p.get("thought"):
            texts.append(p["text"])
        if isinstance(p.get("functionCall"), dict):
            add(marks, "f:" + json.dumps(p["functionCall"], sort_keys=True))
    return "".join(texts)


def carried(doc: Any) -> Marks:
    marks: Marks = set()
    for turn in dicts(doc.get("contents") if isinstance(doc, dict) else None):
        if turn.get("role") == "model":
            add(marks, text_mark(_parts(turn.get("parts"), marks)))
    return marks


def answered(doc: Any, events: list[dict[str, Any]] | None) -> Answered:
    marks: Marks = set()
    pieces: dict[int, list[str]] = {}
    for chunk in (events if events is not None else [doc] if isinstance(doc, dict) else []):
        for i, cand in enumerate(dicts(chunk.get("candidates"))):
            content = cand.get("content") if isinstance(cand.get("content"), dict) else {}
            pieces.setdefault(cand.get("index", i), []).append(_parts(content.get("parts"), marks))
    return answered_from(["".join(p) for _, p in sorted(pieces.items())], marks)


def stream_texts(events: list[Any]) -> list[Thread]:
    """Each candidate's text parts across the stream's chunks (thoughts apart), as the SDK joins them."""
    threads: dict[Any, Thread] = {}
    for i, ev in enumerate(events):
        for k, cand in enumerate(ev.get("candidates") or () if isinstance(ev, dict) else ()):
            content = cand.get("content") if isinstance(cand, dict) else None
            parts = content.get("parts") if isinstance(content, dict) else None
            for j, part in enumerate(parts if isinstance(parts, list) else ()):
                if isinstance(part, dict):
                    name = (cand.get("index", k), "thought" if part.get("thought") else "text")
                    thread_add(threads, name, i, ("candidates", k, "content", "parts", j, "text"), part.get("text"))
    return list(threads.values())


def served(doc: Any) -> Served:
    usage = obj(doc, "usageMetadata")
    return Served(model=opt_str(doc.get("modelVersion")), input_tokens=opt_int(usage.get("promptTokenCount")),
                  output_tokens=opt_int(usage.get("candidatesTokenCount")),
                  finish_reason=opt_str(first(doc, "candidates").get("finishReason")))


def _turn_text(turn: dict[str, Any], rewrite: Rewrite) -> bool:
    for part in reversed(turn.get("parts") if isinstance(turn.get("parts"), list) else []):
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            part["text"] = rewrite(part["text"])
            return True
    return False


def rewrite_user(doc: dict[str, Any], rewrite: Rewrite) -> bool:
    return rewrite_last_user(doc.get("contents"), rewrite, _turn_text)


_STATUS = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 412: "FAILED_PRECONDITION", 500: "INTERNAL",
           501: "UNIMPLEMENTED", 502: "UNAVAILABLE"}


def error_body(status: int, kind: str, message: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": _STATUS.get(status, "UNKNOWN"),
                      "details": [{"@type": kind, **extra}]}}


PROVIDER = Provider(
    name="gemini",
    matches=matches,
    credential_headers=("x-goog-api-key", "authorization"),
    base_url_env=(("GOOGLE_GEMINI_BASE_URL", ""),),
    carried=carried,
    answered=answered,
    error_body=error_body,
    served_doc=served,
    rewrite_user=rewrite_user,
    stream_texts=stream_texts,
)
