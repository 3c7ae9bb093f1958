"""Which exchanges a listing shows: one filter for `nfproxy log` and nfview (condition, task,
session, status, replay result, order note, model, text), and the row both print."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from noisefloor.errors import InputError
from noisefloor.proxy.store.exchange import Exchange, Head
from noisefloor.proxy.store.log import BodyOverLimit, Store

SHOWN_BODY = 2 << 20  # bytes of a body searched (and shown by nfview)
STATUS = re.compile(r"[1-5][0-9][0-9]|[1-5]xx|error")


class FilterError(InputError):
    """A filter no exchange could ever match (a misspelt status): said, not silently empty."""


@dataclass(frozen=True)
class Filters:
    condition: str | None = None
    task: str | None = None
    session: str | None = None
    status: str | None = None  # "200", "4xx", "5xx", "error"
    result: str | None = None  # replay result: hit, miss, order_violation, or "recorded" (none)
    order: bool = False  # only exchanges with an order note (or a call-order violation)
    model: str | None = None
    q: str | None = None  # case-insensitive text in labels, URL, key, model and both bodies

    def __post_init__(self) -> None:
        if self.status is not None:
            status = self.status.strip().lower()
            if not STATUS.fullmatch(status):
                raise FilterError(f"status {self.status[:40]!r} is not a status filter; give 200, 4xx, 5xx or error")
            object.__setattr__(self, "status", status)

    @classmethod
    def from_query(cls, q: Any) -> Filters:
        def get(name: str) -> str | None:
            v = q.get(name)
            return v if v else None

        return cls(get("condition"), get("task"), get("session"), get("status"), get("result"),
                   q.get("order") in ("1", "true", "yes"), get("model"), get("q"))

    @property
    def empty(self) -> bool:
        """No filter given: every exchange is wanted (a listing then skips asking, per exchange)."""
        return self == _NONE

    def wanted(self, ex: Exchange | Head, store: Store) -> bool:
        """Whether `ex` passes; a head suffices unless the text or order filter is given."""
        if self.condition is not None and ex.condition != self.condition:
            return False
        if self.task is not None and ex.task != self.task:
            return False
        if self.session is not None and ex.session != self.session:
            return False
        if self.model is not None and ex.model != self.model:
            return False
        if self.status is not None and not _status_matches(ex, self.status):
            return False
        if self.result is not None and result_of(ex) != self.result:
            return False
        if not (self.order or self.q):
            return True
        assert isinstance(ex, Exchange), "the order and text filters read the whole record, not its head"
        if self.order and order_note(ex) is None:
            return False
        return self.q is None or _mentions(ex, store, self.q.lower())


_NONE = Filters()


def _status_matches(ex: Exchange | Head, want: str) -> bool:
    status = ex.status
    if want == "error":
        return status is None or ex.error is not None
    if status is None:
        return False
    if len(want) == 3 and want.endswith("xx"):
        return str(status)[0] == want[0]
    return str(status) == want


def result_of(ex: Exchange | Head) -> str:
    """hit / miss / order_violation for replayed exchanges, error, or recorded."""
    r = ex.replay_result
    if r:
        return r
    return "error" if ex.error else "recorded"


def order_note(ex: Exchange) -> str | None:
    replay = ex.replay or {}
    note = replay.get("order_note") or replay.get("note")
    if note:
        return str(note)
    if replay.get("result") == "order_violation":
        return str(replay.get("detail") or "call-order violation")
    return next((n for n in ex.notes if "order" in str(n).lower()), None)


def _mentions(ex: Exchange, store: Store, needle: str) -> bool:
    fields = (ex.session, ex.task, ex.condition, ex.replicate, ex.model, ex.key, ex.request.get("url"), ex.error)
    if any(f is not None and needle in str(f).lower() for f in fields):
        return True
    for part in (ex.request, ex.response):
        if part:
            try:
                data = store.bodies.decoded(part)
            except BodyOverLimit:  # over this reader's --max-body-mb: searched by its other fields only
                continue
            if data and needle in data[:SHOWN_BODY].decode("utf-8", "replace").lower():
                return True
    return False


def unsearched(ex: Exchange, store: Store) -> bool:
    """Whether a body of `ex` is over this reader's --max-body-mb, so a text search could not read it."""
    return any(part and (part.get("body_size") or 0) > store.max_body for part in (ex.request, ex.response))


def row(ex: Exchange) -> dict[str, Any]:
    """One line of the exchange list."""
    return {"id": ex.id, "time": ex.time, "mode": ex.mode, "session": ex.session, "task": ex.task,
            "replicate": ex.replicate, "condition": ex.condition, "method": ex.request.get("method"),
            "url": ex.request.get("url"), "status": ex.response["status"] if ex.response else None,
            "result": result_of(ex), "order_note": order_note(ex), "model": ex.model, "latency_ms": ex.latency_ms,
            "key": ex.key, "occurrence": ex.occurrence, "error": ex.error}
