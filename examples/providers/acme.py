"""A provider module for a made-up API, "Acme generate": everything nfproxy needs to know about it
in one file. Registered through the `noisefloor.providers` entry point group:

    [project.entry-points."noisefloor.providers"]
    acme = "acme:PROVIDER"

Request: POST /acme/v1/generate {"engine", "prompt", "history": [{"from": "acme", "text"}],
"request_id"}; answer: {"engine", "text", "halt", "meter": {"in", "out"}}; credential header
x-acme-key; acme-version selects the API version.
"""

from __future__ import annotations

from typing import Any

from noisefloor.proxy.providers import Answered, Marks, Provider, Rewrite, Served
from noisefloor.proxy.providers.base import answered_from, dicts, obj, opt_int, opt_str, text_mark


def matches(host: str, route: str) -> bool:
    return route.endswith("/acme/v1/generate")


def carried(doc: Any) -> Marks:
    """Earlier answers come back in `history`."""
    return {m for turn in dicts(doc.get("history")) if turn.get("from") == "acme" and (m := text_mark(turn.get("text")))}


def answered(doc: Any, events: list[dict[str, Any]] | None) -> Answered:
    return answered_from([doc.get("text")] if isinstance(doc, dict) else [], set())


def served(doc: Any) -> Served:
    meter = obj(doc, "meter")
    return Served(model=opt_str(doc.get("engine")), input_tokens=opt_int(meter.get("in")),
                  output_tokens=opt_int(meter.get("out")), finish_reason=opt_str(doc.get("halt")))


def rewrite_user(doc: dict[str, Any], rewrite: Rewrite) -> bool:
    if not isinstance(doc.get("prompt"), str):
        return False
    doc["prompt"] = rewrite(doc["prompt"])
    return True


def error_body(status: int, kind: str, message: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"acme_error": {"code": kind, "detail": message, **extra}}


PROVIDER = Provider(
    name="acme",
    matches=matches,
    ignore_fields=("/request_id",),  # a client-made id: never changes the answer
    credential_headers=("x-acme-key",),
    version_headers=("acme-version",),
    base_url_env=(("ACME_BASE_URL", ""),),
    carried=carried,
    answered=answered,
    error_body=error_body,
    served_doc=served,
    rewrite_user=rewrite_user,
)
