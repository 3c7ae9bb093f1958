"""The answers replay gives itself instead of a recorded one: a miss, a call-order violation, a
refused WebSocket, a replay that broke, a recorded connection failure. JSON error bodies in the
error shape of the request's provider (its module says which), so its SDK prints the message,
with the `x-nf-replay` header saying which."""

from __future__ import annotations

import json
from typing import Any

from noisefloor.proxy import providers
from noisefloor.proxy.request.traffic import Prepared, ResponseData
from noisefloor.proxy.store.replay_index import RecordedEntry

MISS_STATUS = 404  # SDKs do not retry 4xx (except 408/409/429), so a miss surfaces at once
ORDER_STATUS = 412
FAILURE_STATUS = 500
WEBSOCKET_STATUS = 501
RECORDED_FAILURE_STATUS = 502


def error_body(kind: str, message: str | None) -> bytes:
    """An answer nfproxy gives itself where no provider shape applies, in the JSON error shape the
    SDKs print: {"error": {"type": ..., "message": ...}}. The one home of that body."""
    return json.dumps({"error": {"type": kind, "message": message}}).encode()


def _json(status: int, kind: str, message: str | None, headers: tuple[tuple[str, str], ...] = ()) -> ResponseData:
    body = error_body(kind, message)
    return ResponseData(status, (("content-type", "application/json"), *headers,
                                 ("content-length", str(len(body)))), body)


def _keyed(status: int, doc: dict[str, Any], p: Prepared, result: str) -> ResponseData:
    provider = providers.detect(p.canonical.host, p.canonical.path)
    extra = {k: v for k, v in doc.items() if k not in ("type", "message")}
    body = json.dumps(provider.error_body(status, doc["type"], doc["message"], extra), indent=1).encode()
    return ResponseData(status, (("content-type", "application/json"), ("x-nf-replay", result), ("x-nf-key", p.key),
                                 ("x-nf-occurrence", str(p.occurrence)), ("content-length", str(len(body)))), body)


def miss(p: Prepared, recorded: int, nearest: dict[str, Any] | None, affected: list[int] | None = None
         ) -> ResponseData:
    if recorded:
        message = (f"nfproxy replay miss: request key {p.key[:12]} asked for occurrence {p.occurrence} "
                   f"but the recording holds {recorded}; pass --allow-reuse to repeat the last answer")
    else:
        message = f"nfproxy replay miss: request key {p.key[:12]} was never recorded"
        if nearest is not None:
            message += (f"; the nearest recorded request (exchange {nearest['exchange_id']}) differs first at "
                        f"{nearest['differs_at']}")
    return _keyed(MISS_STATUS, {"type": "nfproxy_replay_miss", "message": message, "key": p.key,
                                "occurrence": p.occurrence, "recorded_occurrences": recorded, "nearest": nearest,
                                "affected": affected or []},
                  p, "miss")


def order_violation(p: Prepared, entry: RecordedEntry, why: str, first: RecordedEntry | None) -> ResponseData:
    return _keyed(ORDER_STATUS, {
        "type": "nfproxy_order_violation", "message": f"nfproxy call-order violation: {why}", "key": p.key,
        "occurrence": p.occurrence, "source_exchange": entry.id,
        "should_come_first": None if first is None else {"exchange": first.id, "key": first.key, "route": first.route,
                                                         "session": first.session},
    }, p, "order_violation")


def websocket_refused(p: Prepared) -> ResponseData:
    return _keyed(WEBSOCKET_STATUS, {"type": "nfproxy_websocket", "message": "nfproxy cannot replay WebSocket "
                                     "connections; record and replay the HTTP API instead", "key": p.key,
                                     "occurrence": p.occurrence}, p, "miss")


def replay_failed(exc: BaseException) -> ResponseData:
    return _json(FAILURE_STATUS, "nfproxy_replay_error", f"nfproxy replay failed: {exc!r}; the request was not "
                 "forwarded upstream (check the store and nfproxy's log)", (("x-nf-replay", "error"),))


def recorded_failure(error: str | None) -> ResponseData:
    """The recording holds a connection failure: replayed as one."""
    return _json(RECORDED_FAILURE_STATUS, "nfproxy_recorded_error", error)
