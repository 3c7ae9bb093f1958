"""Content dependencies: which earlier recorded answers a recorded request carries.

A request depends on an earlier answer of its session when it sends that answer back: its text
or tool calls in the messages, its response id, its output items (each provider module says how
its API does this). Replay pairs identical requests by these, and calls a request that carries an
answer not yet served a call-order violation; timing alone never makes a request wait.

Dependencies are computed while recording (`Tracker`) and stored with the recorded entry as the
seqs of the answers, which stay valid when sessions are merged into another store; for stores
recorded before, `recompute` derives them from the stored exchanges.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from noisefloor.proxy import providers
from noisefloor.proxy.providers import Provider

MIN_TEXT = 16  # the generic rule: shorter answers occur inside unrelated bodies by chance
_TEXTS = 256  # answers per session the generic rule looks for
_MARKS = 8192  # marks kept per session
_SESSIONS = 4096  # sessions tracked at once (the oldest forgotten first)


@dataclass
class _Answers:
    marks: dict[str, int] = field(default_factory=dict)  # mark -> seq of the latest answer with it
    texts: deque[tuple[str, int]] = field(default_factory=lambda: deque(maxlen=_TEXTS))


class Tracker:
    """The answers completed so far, per recorded session, and the dependencies of a new request."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, _Answers] = OrderedDict()

    def deps(self, session: str, provider: Provider, doc: Any, body_text: str | None) -> tuple[int, ...]:
        """Seqs of this session's completed answers that a request (its parsed JSON body, or its
        text for the generic rule) carries."""
        answers = self._sessions.get(session)
        if answers is None:
            return ()
        found = {answers.marks[m] for m in providers.carried(provider, doc) if m in answers.marks} if doc else set()
        if provider.substring_deps and body_text:
            found |= {seq for text, seq in answers.texts if _contains(body_text, text)}
        return tuple(sorted(found))

    def answered(self, session: str, seq: int, provider: Provider, body: bytes, content_type: str | None,
                 doc: Any = providers.UNPARSED) -> None:
        got = providers.answered(provider, body, content_type, doc)
        if not got.marks:
            return
        answers = self._sessions.get(session)
        if answers is None:
            answers = self._sessions[session] = _Answers()
            if len(self._sessions) > _SESSIONS:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(session)
        for m in got.marks:
            answers.marks[m] = seq
        if len(answers.marks) > _MARKS:
            for m in list(answers.marks)[: len(answers.marks) - _MARKS]:
                del answers.marks[m]
        answers.texts.extend((t, seq) for t in got.texts if len(t.strip()) >= MIN_TEXT)


def _contains(body: str, text: str) -> bool:
    t = text.strip()
    return t in body or json.dumps(t, ensure_ascii=False)[1:-1] in body


def body_text(raw: bytes | None) -> str | None:
    return raw.decode("utf-8", "replace") if raw else None


def recompute(store: Any, rules: Any, entries: list[Any]) -> dict[int, tuple[int, ...]]:
    """Dependencies of a store recorded before they were kept: id -> seqs. Requests go through a
    `Tracker` in arrival order, each answer registered after its request: a request can carry
    only an answer to one that arrived before it."""
    from noisefloor.proxy.request.traffic import RequestData

    tracker = Tracker()
    out: dict[int, tuple[int, ...]] = {}
    for e in sorted(entries, key=lambda e: (e.session, e.seq)):
        ex = store.exchange(e.id)
        if ex is None:
            continue
        request = RequestData.from_record(ex.request, store.part_body(ex.request))
        provider = providers.pick(rules.profile, request.host, request.path)
        body = store.decoded_body(ex.request) or b""
        try:
            doc = json.loads(body) if body else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            doc = None
        deps = tracker.deps(e.session, provider, doc, body_text(body))
        if deps:
            out[e.id] = deps
        if ex.response is not None and 200 <= ex.response.get("status", 0) < 300:
            ctype = next((v for k, v in ex.response["headers"] if k.lower() == "content-type"), None)
            tracker.answered(e.session, e.seq, provider, store.decoded_body(ex.response) or b"", ctype)
    return out
