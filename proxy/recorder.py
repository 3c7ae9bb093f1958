"""Record mode: key each request on arrival, write the exchange when its answer is complete."""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from noisefloor.proxy import exchange_record, providers, replay_index, secrets
from noisefloor.proxy.dependencies import Tracker, body_text
from noisefloor.proxy.exchange_record import Head
from noisefloor.proxy.keys import Rules
from noisefloor.proxy.labels import Labels
from noisefloor.proxy.providers import Provider
from noisefloor.proxy.replay_index import RecordedEntry
from noisefloor.proxy.stats import Stats
from noisefloor.proxy.store import Store
from noisefloor.proxy.traffic import Counters, Prepared, RequestData, ResponseData, prepare


@dataclass(frozen=True)
class Pending:
    """A keyed request waiting for its answer, with the request's half of the exchange record
    already serialized: begun while the upstream works, so that finishing, which the client waits
    for, only handles the response."""

    prepared: Prepared
    request_json: str  # the request's record fields, a JSON object without "notes"
    notes: list[str]
    provider: Provider | None = None
    deps: tuple[int, ...] = ()  # seqs of this session's answers the request carries
    near: tuple[bytes, tuple[bytes, ...], bytes] | None = None  # its nearest-request index entry
    route: tuple[str, str] = ("", "")  # its method and URL as recorded (the head's)


class Recorder:
    def __init__(self, store: Store, rules: Rules) -> None:
        store.bind_rules(rules.id, rules.describe(), also=rules.legacy_ids)
        self.store = store
        self.answers = Tracker()
        self.rules = rules
        self.stats = Stats()
        self._left_out: dict[tuple[str, ...], int] = {}  # the answer part's keys -> what the record leaves out
        self._request_keys: frozenset[str] = frozenset()
        self._untracked: deque[tuple[Any, ...]] = deque()  # answers finish left for `track_answers`
        if store.has_replay_index():  # a session's earlier exchanges are looked up when it reappears
            self.counters = Counters(earlier=lambda name: [(e.key, e.occurrence, e.seq)
                                                           for e in store.session_entries(name)])
        else:  # a store older than the index rows: read whole, once
            self.counters = Counters()
            self.counters.seed((e.session, e.key, e.occurrence, e.seq) for e in store.recorded_entries())

    def begin(self, request: RequestData, labels: Labels) -> Pending:
        """Key the request; call in arrival order (occurrence numbers follow it)."""
        self.track_answers()  # a request keyed after an answer was complete may carry it
        p = prepare(request, labels, self.rules, self.counters)
        record = exchange_record.request_part(p, "record", self.rules.id)
        if not self._request_keys:
            self._request_keys = frozenset((*record, "id"))
        notes = record.pop("notes")
        c = p.canonical
        provider = providers.pick(self.rules.profile, c.host, c.path)
        doc = c.body if c.body_kind == "json" else None
        text = body_text(request.decoded if request.decoded is not None else request.raw_body) \
            if provider.substring_deps else None
        deps = self.answers.deps(labels.session, provider, doc, text)
        near = replay_index.sketch(c, _route(p)) if c.body_kind == "json" else None
        route = (record["request"]["method"], record["request"]["url"])
        if request.raw_body:  # compressed now, while the upstream works, instead of in finish
            self.store.ahead(labels.session, request.stored_digest, request.stored_body)
        return Pending(p, json.dumps(record), notes, provider, deps, near, route)

    def finish(
        self,
        pending: Pending,
        response: ResponseData | None,
        *,
        error: str | None = None,
        latency_ms: float | None = None,
        notes: Sequence[str] = (),
        end: float | None = None,
        defer_tracking: bool = False,
    ) -> int:
        """Write the exchange: a response, a connection error, or a stream that broke off (both).
        `defer_tracking`: the answer's marks for later requests' dependencies are registered by
        `track_answers` (or the next `begin`), not here: a proxy does that once the answer is out."""
        p = pending.prepared
        if error is not None:  # an upstream's status line or message may carry the key it was sent
            error = secrets.erase_text(error, p.request.secret_values)
        # the answer is complete: a request arriving after this may depend on it (an import gives the
        # recorded time)
        end = time.time() if end is None else end
        record: dict[str, Any] = {"end": end, "latency_ms": latency_ms, "error": error,
                                  "notes": pending.notes + list(notes)}
        # a body already stored (a replicate asking the same again) is not compressed again
        bodies = {p.request.stored_digest: p.request.stored_body}
        identity = None
        if response is not None:
            response = response.without(p.request.secret_values)
            bodies[response.digest] = response.raw_body
            decoded, ctype = response.decoded_body, response.header("content-type")
            doc = providers.body_doc(decoded, ctype)  # parsed once for the served fields and the dependencies
            meta = providers.served(pending.provider or providers.PROVIDERS["generic"], decoded, ctype, doc)
            identity = {"model": meta.model, "fingerprint": meta.fingerprint,
                        "usage": {"input": meta.input_tokens, "output": meta.output_tokens},
                        "finish_reason": meta.finish_reason, "truncated": meta.truncated}
            if response.status >= 400:
                self.stats.upstream_errors[response.status] = self.stats.upstream_errors.get(response.status, 0) + 1
            elif 200 <= response.status < 300 and pending.provider is not None and error is None:
                self._untracked.append((p.labels.session, p.seq, pending.provider, decoded, ctype, doc))
                if not defer_tracking:
                    self.track_answers()
        record.update(exchange_record.answer_part(response, identity))
        if error is not None:
            self.stats.errors += 1
        entry = RecordedEntry(
            id=0,
            key=p.key,
            session=p.labels.session,
            occurrence=p.occurrence,
            seq=p.seq,
            route=_route(p),
            start=p.started,
            end=end,
            deps=pending.deps,
            near=pending.near,
        )
        exchange_id = self.store.append(exchange_record.join(pending.request_json, record), bodies, entry,
                                        self._head(pending, record, response, identity), later=True)
        self.stats.exchanges += 1
        return exchange_id

    def track_answers(self) -> None:
        """Register the answers `finish` left untracked, in the order they were finished (the
        dependency marks of a request keyed afterwards are then what they would have been), and
        the store's work that its writes left for later (`Store.catch_up`): dictionary samples, the
        compressor each session's next request will use; done once the answer is out."""
        while self._untracked:
            self.answers.answered(*self._untracked.popleft())
        self.store.catch_up()

    def _head(self, pending: Pending, record: dict[str, Any], response: ResponseData | None,
              identity: dict[str, Any] | None) -> tuple[Head, int] | None:
        """The exchange's head and the fields its record leaves out, from the values the record was
        built of (the store need not read them back from its text); None where the provider's
        identity is not of the record's types, which the store then checks from the text."""
        p, labels = pending.prepared, pending.prepared.labels
        model = fingerprint = None
        usage: dict[str, Any] = {}
        truncated: Any = False
        if identity is not None:
            model, fingerprint, usage, truncated = (identity["model"], identity["fingerprint"], identity["usage"],
                                                    identity["truncated"])
            if not (_text(model) and _text(fingerprint) and _text(identity["finish_reason"])
                    and _count(usage["input"]) and _count(usage["output"]) and type(truncated) is bool):
                return None
        keys = tuple(record)
        left = self._left_out.get(keys)
        if left is None:
            left = self._left_out[keys] = exchange_record.left_out_of(self._request_keys | set(keys))
        return Head(0, p.started, p.key, p.occurrence, None if response is None else response.status, usage,
                    truncated, record["error"], record["notes"], labels.session, labels.task, labels.replicate,
                    labels.condition, "record", *pending.route, model, fingerprint, None), left


def _text(v: Any) -> bool:
    return v is None or type(v) is str


def _count(v: Any) -> bool:
    return v is None or type(v) is int


def _route(p: Prepared) -> str:
    return replay_index.indexed_route(p.canonical)
