"""What the log wants to know about a response, read the way each provider writes it.

The analyzer groups by served model and fingerprint and counts truncations, so these fields are
pulled out once at record time rather than re-parsed from bodies later.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

# finish reasons that mean "the model was cut off by the token limit"
_TRUNCATION = {"length", "max_tokens", "MAX_TOKENS"}


@dataclass(frozen=True)
class ResponseMeta:
    model: str | None = None
    fingerprint: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason in _TRUNCATION


def extract_meta(body: bytes, content_type: str | None = None) -> ResponseMeta:
    """Model, fingerprint, usage and finish reason from an OpenAI, Anthropic or Gemini body,
    a JSON document or a server-sent event stream."""
    if content_type and content_type.lower().startswith("text/event-stream"):
        return _from_events(sse_data(body))
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ResponseMeta()
    if not isinstance(doc, dict):
        return ResponseMeta()
    return _from_doc(doc)


def sse_data(body: bytes) -> list[dict[str, Any]]:
    """The JSON `data:` payloads of an event stream, in order (`[DONE]` and non-JSON skipped)."""
    out = []
    text = body.decode("utf-8", errors="replace").replace("\r\n", "\n")
    for block in text.split("\n\n"):
        data = "\n".join(line[5:].lstrip() for line in block.split("\n") if line.startswith("data:"))
        if not data or data == "[DONE]":
            continue
        try:
            doc = json.loads(data)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def _from_events(events: list[dict[str, Any]]) -> ResponseMeta:
    """Fold per-event metadata: later events fill what earlier ones left empty or update it."""
    merged: dict[str, Any] = {}
    for ev in events:
        kind = ev.get("type")
        if kind == "message_start" and isinstance(ev.get("message"), dict):  # Anthropic
            part = _from_doc(ev["message"])
        elif kind == "message_delta":  # Anthropic: stop reason and output tokens arrive here
            delta = ev.get("delta") if isinstance(ev.get("delta"), dict) else {}
            usage = ev.get("usage") if isinstance(ev.get("usage"), dict) else {}
            part = ResponseMeta(finish_reason=_str(delta.get("stop_reason")), output_tokens=_int(usage.get("output_tokens")))
        elif kind in ("response.completed", "response.incomplete") and isinstance(ev.get("response"), dict):
            part = _from_doc(ev["response"])  # OpenAI Responses API
        else:
            part = _from_doc(ev)
        for k, v in asdict(part).items():
            if v is not None:
                merged[k] = v
    return ResponseMeta(**merged)


def _from_doc(doc: dict[str, Any]) -> ResponseMeta:
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    gemini_usage = doc.get("usageMetadata") if isinstance(doc.get("usageMetadata"), dict) else {}
    finish: str | None = None
    choices = doc.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        finish = choices[0].get("finish_reason")  # OpenAI chat completions
    if finish is None and isinstance(doc.get("stop_reason"), str):
        finish = doc["stop_reason"]  # Anthropic messages
    candidates = doc.get("candidates")
    if finish is None and isinstance(candidates, list) and candidates and isinstance(candidates[0], dict):
        finish = candidates[0].get("finishReason")  # Gemini
    if finish is None and doc.get("status") == "incomplete":  # OpenAI Responses API
        reason = (doc.get("incomplete_details") or {}).get("reason")
        finish = "length" if reason == "max_output_tokens" else reason
    return ResponseMeta(
        model=_str(doc.get("model")) or _str(doc.get("modelVersion")),
        fingerprint=_str(doc.get("system_fingerprint")),
        input_tokens=_int(usage.get("prompt_tokens", usage.get("input_tokens", gemini_usage.get("promptTokenCount")))),
        output_tokens=_int(
            usage.get("completion_tokens", usage.get("output_tokens", gemini_usage.get("candidatesTokenCount")))
        ),
        finish_reason=_str(finish),
    )


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Profile:
    """A provider API: how to recognize it and which body fields never change the answer."""

    name: str
    ignore_fields: tuple[str, ...] = ()


# End-user identifiers and cache-routing hints: set per run by some agents, no effect on sampling.
PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("openai", ("/user", "/prompt_cache_key", "/safety_identifier")),
        Profile("openai-responses", ("/user", "/prompt_cache_key", "/safety_identifier")),
        Profile("anthropic", ("/metadata/user_id",)),
        Profile("gemini"),
        Profile("generic"),
    )
}


def detect(host: str, path: str) -> Profile:
    """The profile for a request, from its host and path (any OpenAI-compatible server included)."""
    route = path.split("?", 1)[0].rstrip("/")
    host = host.lower()
    if ":generatecontent" in route.lower() or ":streamgeneratecontent" in route.lower() or "generativelanguage" in host:
        return PROFILES["gemini"]
    if route.endswith("/messages") or "anthropic" in host:
        return PROFILES["anthropic"]
    if route.endswith("/responses"):
        return PROFILES["openai-responses"]
    if route.endswith(("/chat/completions", "/completions", "/embeddings")) or "openai" in host:
        return PROFILES["openai"]
    return PROFILES["generic"]


def pick(forced: str | None, host: str, path: str) -> Profile:
    if forced is not None:
        if forced not in PROFILES:
            raise ValueError(f"unknown profile {forced!r}; choose one of {', '.join(PROFILES)}")
        return PROFILES[forced]
    return detect(host, path)
