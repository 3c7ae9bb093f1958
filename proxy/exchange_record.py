"""The exchange record (DESIGN.md): built here only, by every mode.

A record is assembled in parts: the request's part when the request arrives (serialized while
the upstream works, so the client never waits for it), the answer's part when the answer is
complete, and the id when the store appends it. The parts have disjoint keys, and joining them
is a splice of JSON texts rather than a re-serialization of the whole record, which on the hot
path would cost as much as the rest of recording.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the store imports this module too: no import of traffic at run time
    from noisefloor.proxy.traffic import Prepared, ResponseData

ANSWER_FIELDS = ("model", "fingerprint", "usage", "finish_reason", "truncated")


def request_part(p: Prepared, mode: str, rules_id: str) -> dict[str, Any]:
    """The fields every exchange record has, whatever happened next."""
    return {
        "time": p.started,
        "mode": mode,
        "session": p.labels.session,
        "task": p.labels.task,
        "replicate": p.labels.replicate,
        "condition": p.labels.condition,
        "key": p.key,
        "occurrence": p.occurrence,
        "seq": p.seq,
        "rules_id": rules_id,
        "request": p.request.record(),
        "overrides": p.request.stamp.get("overrides"),
        "perturbation": p.request.stamp.get("perturbation"),
        "notes": [*p.canonical.notes, *p.request.stamp.get("notes", ())],
    }


def answer_part(response: ResponseData | None, identity: dict[str, Any] | None) -> dict[str, Any]:
    """The answer's fields: the response as stored, and what identifies the model that wrote it
    (`identity`: model, fingerprint, usage, finish_reason, truncated; None when unknown)."""
    part: dict[str, Any] = {"response": response.record() if response is not None else None}
    if identity is not None:
        part.update({k: identity.get(k) for k in ANSWER_FIELDS})
    return part


def join(head: str, tail: dict[str, Any]) -> str:
    """Two JSON objects with disjoint keys as one JSON text, `head` already serialized."""
    return head[:-1] + "," + json.dumps(tail)[1:]


def with_id(text: str, exchange_id: int) -> str:
    """The stored text: the id first, then the record (a JSON object without "id")."""
    return f'{{"id":{exchange_id},{text[1:]}'
