"""Content dependencies: which earlier recorded answers a recorded request carries.

A request depends on an earlier answer of its session when it sends that answer back: its text
or tool calls in the messages, its response id, its output items (each provider module says how
its API does this), or, in any provider's request, the answer's text or a tool call's arguments or
id quoted inside a message (agents that keep their transcript as text, as smolagents does). Replay pairs identical requests by these, and calls a request that carries an
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


_GRAM = 8  # the texts' index: every text of MIN_TEXT or more holds one of a body's aligned grams
# (MIN_TEXT must stay at least 2 * _GRAM - 1: see _Texts)


class _Texts:
    """A session's last `_TEXTS` answer texts (each stripped, with its form inside a JSON string
    where that differs), indexed so that finding which of them a request body quotes costs in
    proportion to the body, not to the body times the texts.

    An occurrence of a text of n >= 2 * _GRAM - 1 characters at position p of a body holds the
    body's _GRAM characters at the first multiple of _GRAM from p, which are the text's own
    characters at an offset below _GRAM. Each text is filed under its grams at those offsets;
    a body's grams at multiples of _GRAM pick the candidates, and a plain search confirms them."""

    def __init__(self) -> None:
        self._order: deque[tuple[int, ...]] = deque()  # each text's entries (its forms), oldest first
        self._entries: dict[int, tuple[str, int]] = {}  # entry number -> (a text's form, its answer's seq)
        # gram -> the entry holding it, or a set of those where several do (a plain int, most
        # often: the collector has no container to walk for it)
        self._by_gram: dict[str, int | set[int]] = {}
        self._next = 0

    def add(self, text: str, escaped: str | None, seq: int) -> None:
        numbers = []
        by_gram = self._by_gram
        for form in (text,) if escaped is None else (text, escaped):
            n = self._next
            self._next += 1
            self._entries[n] = (form, seq)
            for gram in _grams(form):
                held = by_gram.get(gram)
                if held is None:
                    by_gram[gram] = n
                elif isinstance(held, int):
                    by_gram[gram] = {held, n}
                else:
                    held.add(n)
            numbers.append(n)
        self._order.append(tuple(numbers))
        if len(self._order) > _TEXTS:
            for n in self._order.popleft():
                form, _ = self._entries.pop(n)
                for gram in _grams(form):
                    held = by_gram[gram]
                    if isinstance(held, int):
                        del by_gram[gram]
                    else:
                        held.discard(n)
                        if len(held) == 1:
                            by_gram[gram] = held.pop()

    def quoted(self, body: str, skip: set[int]) -> set[int]:
        """Seqs (not in `skip`) of the texts `body` holds, in either form."""
        by_gram, entries = self._by_gram, self._entries
        candidates: set[int] = set()
        for i in range(0, len(body) - _GRAM + 1, _GRAM):
            got = by_gram.get(body[i:i + _GRAM])
            if got is None:
                continue
            if isinstance(got, int):
                candidates.add(got)
            else:
                candidates.update(got)
        found: set[int] = set()
        for n in candidates:
            form, seq = entries[n]
            if form in body and seq not in skip:
                found.add(seq)
        return found

    def __len__(self) -> int:
        return len(self._order)


def _grams(form: str) -> set[str]:
    return {form[i:i + _GRAM] for i in range(_GRAM)}


@dataclass
class _Answers:
    marks: dict[str, int] = field(default_factory=dict)  # mark -> seq of the latest answer with it
    texts: _Texts = field(default_factory=_Texts)


class Tracker:
    """The answers completed so far, per recorded session, and the dependencies of a new request."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, _Answers] = OrderedDict()

    def deps(self, session: str, provider: Provider, doc: Any, body_text: str | None) -> tuple[int, ...]:
        """Seqs of this session's completed answers that a request carries: by the provider's marks
        in its parsed JSON body, and by an answer's texts (`Answered.texts`) found in its text."""
        answers = self._sessions.get(session)
        if answers is None:
            return ()
        found = {answers.marks[m] for m in providers.carried(provider, doc) if m in answers.marks} if doc else set()
        if body_text and answers.texts:  # quoted as text (a transcript kept in messages), in any provider's request
            found |= answers.texts.quoted(body_text, found)
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
        for t in (x.strip() for x in got.texts):
            if len(t) >= MIN_TEXT:
                answers.texts.add(t, _escaped(t), seq)


def _escaped(text: str) -> str | None:
    """`text` as it appears inside a JSON string, when that differs from the text (quotes, newlines,
    backslashes, control characters): worked out once per answer, not once per later request."""
    inner = json.dumps(text, ensure_ascii=False)[1:-1]
    return None if inner == text else inner


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
        request = RequestData.from_record(ex.request, store.bodies.of_part(ex.request))
        provider = providers.pick(rules.profile, request.host, request.path)
        body = store.bodies.decoded(ex.request) or b""
        try:
            doc = json.loads(body) if body else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            doc = None
        deps = tracker.deps(e.session, provider, doc, body_text(body))
        if deps:
            out[e.id] = deps
        if ex.response is not None and 200 <= ex.response.get("status", 0) < 300:
            ctype = next((v for k, v in ex.response["headers"] if k.lower() == "content-type"), None)
            tracker.answered(e.session, e.seq, provider, store.bodies.decoded(ex.response) or b"", ctype)
    return out
