"""What the log wants to know about a response, read the way each provider writes it.

The analyzer groups by served model and fingerprint and counts truncations, so these fields are
pulled out once at record time rather than re-parsed from bodies later.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from noisefloor.proxy import providers as _providers
from noisefloor.proxy.providers import PROVIDERS, sse_events

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


sse_data = sse_events


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


# Provider detection and keying moved to the providers package; these names stay for callers.
PROFILES = PROVIDERS
detect = _providers.detect
pick = _providers.pick
