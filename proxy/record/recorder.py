"""Record mode: key each request on arrival, write the exchange when its answer is complete."""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from noisefloor.proxy import providers
from noisefloor.proxy._stats import Stats
from noisefloor.proxy.providers import Provider
from noisefloor.proxy.record.answered_rows import Answered
from noisefloor.proxy.request import secrets
from noisefloor.proxy.request.dependencies import Tracker, body_text
from noisefloor.proxy.request.keys import CanonicalRequest, Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.request.traffic import Counters, Prepared, RequestData, ResponseData, prepare
from noisefloor.proxy.store import exchange as exchange_record
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store.exchange import Head
from noisefloor.proxy.store.heads import HEX_KEY
from noisefloor.proxy.store.log import Store
from noisefloor.proxy.store.merge.shard import stored_request_near
from noisefloor.proxy.store.replay_index import RecordedEntry


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
    route: tuple[str, str] = ("", "")  # its method and URL as recorded (the head's)


class Writer:
    """Writes an answered exchange in full from its `Answered` (record, bodies, head, replay
    entry): one code path for a proxy's write after the release, a synchronous writer's, and an
    answered row a killed proxy left (`finish_unwritten`), which needs nothing but the row."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.stats = Stats()
        self._left_out: dict[tuple[str, ...], int] = {}  # the answer part's keys -> what the record leaves out
        self._request_keys: frozenset[str] = frozenset()

    def write(self, a: Answered, response: ResponseData | None = None, near: Any = None,
              provider: Provider | None = None, done: int | bytes | None = None) -> tuple[int, Any]:
        """The exchange's id and its answer's parsed body (None where it has none). `response`,
        `provider`: the live objects `a` was made from (else rebuilt from it); `near`: the request's
        sketch (None: the entry has none, as for a body that is not JSON); `done`: its answered row."""
        text, bodies, entry, head, doc = self._parts(a, response, near, provider)
        exchange_id = self.store.append(text, bodies, entry, head, later=True, done=done)
        self.stats.exchanges += 1
        if a.error is not None:
            self.stats.errors += 1
        if a.status is not None and a.status >= 400:
            self.stats.upstream_errors[a.status] = self.stats.upstream_errors.get(a.status, 0) + 1
        return exchange_id, doc

    def _parts(self, a: Answered, response: ResponseData | None, near: Any, provider: Provider | None,
               from_row: bool = False) -> tuple[str, dict[str, bytes], RecordedEntry, Any, Any]:
        """The record's text, bodies, entry, head and the answer's parsed body. `from_row`: `a` was
        read back from disk: ValueError unless its record reads back as one (then the store takes
        the head from the text, as for an import)."""
        record: dict[str, Any] = {"end": a.end, "latency_ms": a.latency_ms, "error": a.error, "notes": a.notes}
        bodies = {a.request_digest: a.request_body}
        identity = doc = None
        if response is None and a.status is not None:
            response = ResponseData(a.status, tuple(a.headers), a.body,
                                    None if a.layout is None else tuple(a.layout), a.partial)
        if response is not None:
            bodies[response.digest] = response.raw_body
            decoded, ctype = response.decoded_body, response.header("content-type")
            doc = providers.body_doc(decoded, ctype)  # parsed once for the served fields and the dependencies
            provider = provider or providers.PROVIDERS.get(a.provider or "generic") or providers.PROVIDERS["generic"]
            meta = providers.served(provider, decoded, ctype, doc)
            identity = {"model": meta.model, "fingerprint": meta.fingerprint,
                        "usage": {"input": meta.input_tokens, "output": meta.output_tokens},
                        "finish_reason": meta.finish_reason, "truncated": meta.truncated}
        record.update(exchange_record.answer_part(response, identity))
        entry = RecordedEntry(id=0, key=a.key, session=a.session, occurrence=a.occurrence, seq=a.seq, route=a.route,
                              start=a.started, end=a.end, deps=a.deps, near=near)
        text = exchange_record.join(a.request_json, record)
        if from_row:
            _check_row(a, text)
            return text, bodies, entry, None, doc
        return text, bodies, entry, self._head(a, record, response, identity), doc

    def finish_unwritten(self, drop_damaged: bool = False) -> tuple[int, int]:
        """Write the answered rows a killed recorder left (no live one holds the store): how many
        were written and how many dropped. A damaged row is a StoreError naming it before any is
        written, or with `drop_damaged`, deleted (its exchange is lost) while the others are written."""
        if not self.store.answered.unfinished():
            return 0, 0
        rules = Rules.described(self.store.meta("rules"))
        good, bad, written = [], [], 0
        for key, a in self.store.answered.rows():
            try:
                if isinstance(a, ValueError):
                    raise a
                good.append((key, self._parts(a, None, _near_of_row(rules, a), None, from_row=True)))
            except (ValueError, KeyError, TypeError, UnicodeError) as exc:
                if not drop_damaged:
                    raise self.store.answered.damaged(key, exc) from None
                bad.append(key)
        for key, (text, bodies, entry, head, _) in good:  # not counted in this run's summary: an earlier run's
            try:
                self.store.append(text, bodies, entry, head, later=True, done=key)
                written += 1
            except (ValueError, KeyError, TypeError, OverflowError, struct.error) as exc:  # nothing of it kept
                if not drop_damaged:
                    raise self.store.answered.damaged(key, exc) from None
                bad.append(key)
        for key in bad:
            self.store.answered.drop_damaged(key)
        self.store.catch_up()
        return written, len(bad)

    def _head(self, a: Answered, record: dict[str, Any], response: ResponseData | None,
              identity: dict[str, Any] | None) -> tuple[Head, int] | None:
        """The exchange's head and the fields its record leaves out, from the values the record was
        built of (the store need not read them back from its text); None where the provider's
        identity is not of the record's types, which the store then checks from the text."""
        model = fingerprint = None
        usage: dict[str, Any] = {}
        truncated: Any = False
        if identity is not None:
            model, fingerprint, usage, truncated = (identity["model"], identity["fingerprint"], identity["usage"],
                                                    identity["truncated"])
            if not (_text(model) and _text(fingerprint) and _text(identity["finish_reason"])
                    and _count(usage["input"]) and _count(usage["output"]) and type(truncated) is bool):
                return None
        if not self._request_keys:
            self._request_keys = frozenset((*json.loads(a.request_json), "notes", "id"))
        keys = tuple(record)
        left = self._left_out.get(keys)
        if left is None:
            left = self._left_out[keys] = exchange_record.left_out_of(self._request_keys | set(keys))
        return Head(id=0, time=a.started, key=a.key, occurrence=a.occurrence,
                    status=None if response is None else response.status, usage=usage, truncated=truncated,
                    error=record["error"], notes=record["notes"], session=a.session, task=a.task,
                    replicate=a.replicate, condition=a.condition, mode="record", method=a.method, url=a.url,
                    model=model, fingerprint=fingerprint, replay_result=None), left


class Recorder:
    def __init__(self, store: Store, rules: Rules) -> None:
        store.bind_rules(rules.id, rules.describe(), also=rules.legacy_ids)
        self.store = store
        self.answers = Tracker()
        self.rules = rules
        self.writer = Writer(store)
        self.stats = self.writer.stats
        self._untracked: deque[tuple[Any, ...]] = deque()  # answers written, their marks left for `track_answers`
        # answers released before their full write: (row, pending, its answered, the response)
        self._unwritten: deque[tuple[int, Pending, Answered, ResponseData | None]] = deque()
        # the sketches of recent requests by (key, stored body's digest): a request asked again
        # (a rerun's replicates, a retry) has the same canonical form, parsed from the same bytes
        self._sketches: OrderedDict[tuple[str, str], Any] = OrderedDict()
        # told, one line each, of an exchange written after its release that could not be (its row stays)
        self.on_unwritten: Callable[[str], None] = lambda line: None
        # told, one line each, of an answer over the store's body limit (recorded as an error, its body not kept)
        self.on_refused: Callable[[str], None] = lambda line: None
        # a killed recorder's answered exchanges, before this one numbers any
        self.recovered = self.writer.finish_unwritten()[0]
        self.numbered = False  # --new-session: a name the store holds starts NAME-2, NAME-3, ... instead
        self._sessions: dict[str, str] = {}  # session named by this run -> the session it records into
        # a session's earlier exchanges are looked up when it reappears
        self.counters = Counters(earlier=lambda name: [(e.key, e.occurrence, e.seq) for e in store.index.session_entries(name)])

    def session_for(self, name: str) -> str | None:
        """The session a run naming `name` records into: `name` itself when the store does not hold it
        yet (or this recorder began it), else None (refused: appending to an earlier run's session
        would mix two runs, and a replay would follow the mix), or with `numbered` the first free
        `name-N` (N >= 2)."""
        got = self._sessions.get(name)
        if got is not None:
            return got
        chosen: str | None = name
        if self.store.index.session_first(name) is not None:
            taken = set(self._sessions.values())
            chosen = next(f"{name}-{n}" for n in itertools.count(2) if f"{name}-{n}" not in taken
                          and self.store.index.session_first(f"{name}-{n}") is None) if self.numbered else None
        if chosen is not None:
            self._sessions[name] = chosen
        return chosen

    def begin(self, request: RequestData, labels: Labels) -> Pending:
        """Key the request; call in arrival order (occurrence numbers follow it)."""
        self.track_answers()  # a request keyed after an answer was complete may carry it
        p = prepare(request, labels, self.rules, self.counters)
        record = exchange_record.request_part(p, "record", self.rules.id)
        notes = record.pop("notes")
        c = p.canonical
        provider = providers.pick(self.rules.profile, c.host, c.path)
        doc = c.body if c.body_kind == "json" else None
        text = body_text(request.decoded if request.decoded is not None else request.raw_body)
        deps = self.answers.deps(labels.session, provider, doc, text)
        route = (record["request"]["method"], record["request"]["url"])
        return Pending(p, json.dumps(record), notes, provider, deps, route)

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
        """Write the exchange: a response, a connection error, or a stream that broke off (both);
        returns its id. `defer_tracking` (a proxy, before it releases the answer): only the
        exchange's answered row is committed here (`answered_rows`), and the exchange is written in
        full by `track_answers` (or the next `begin`), with the answer's marks for later requests'
        dependencies; the id is then 0."""
        p = pending.prepared
        if error is not None:  # an upstream's status line or message may carry the key it was sent
            error = secrets.erase_text(error, p.request.secret_values)
        if response is not None and len(response.raw_body) > self.store.max_body:
            # one limit from record to every reader: an answer no reader would take is not kept
            error = "; ".join(filter(None, [error, over_limit(len(response.raw_body), self.store.max_body)]))
            self.on_refused(error)
            response = None
        if response is not None:
            response = response.without(p.request.secret_values, pending.provider)
        # the answer is complete: a request arriving after this may depend on it (an import gives the
        # recorded time)
        answered = _answered(pending, response, error, latency_ms, notes, time.time() if end is None else end)
        if defer_tracking:
            self._unwritten.append((self.store.answered.keep(answered), pending, answered, response))
            return 0
        exchange_id = self._write(pending, answered, response)
        self.track_answers()
        return exchange_id

    def track_answers(self) -> None:
        """After an answer's release: write in full the exchanges `finish` kept as answered rows,
        register the answers' dependency marks in the order they were finished (those of a request
        keyed afterwards are then what they would have been), and do the store's work its writes
        left for later (`Store.catch_up`: dictionary samples, the compressor each session's next
        request will use). An exchange that cannot be written is told to `on_unwritten`: its
        answered row stays in the store for `nfproxy repair` (or the next recorder) to write."""
        while self._unwritten:
            row, pending, answered, response = self._unwritten.popleft()
            try:
                self._write(pending, answered, response, row)
            except Exception as exc:  # noqa: BLE001 - the answer is out and kept: say so, write the next
                self.stats.unwritten += 1
                self.on_unwritten(secrets.erase_text(f"{exc.__class__.__name__}: {exc}",
                                                     pending.prepared.request.secret_values))
        while self._untracked:
            self.answers.answered(*self._untracked.popleft())
        self.store.catch_up()

    def _write(self, pending: Pending, answered: Answered, response: ResponseData | None,
               row: int | None = None) -> int:
        c = pending.prepared.canonical
        near = self._sketch(c, answered) if c.body_kind == "json" else None
        exchange_id, doc = self.writer.write(answered, response, near, pending.provider, row)
        if (response is not None and 200 <= response.status < 300 and pending.provider is not None
                and answered.error is None):
            self._untracked.append((answered.session, answered.seq, pending.provider, response.decoded_body,
                                    response.header("content-type"), doc))
        return exchange_id

    def _sketch(self, c: CanonicalRequest, answered: Answered) -> Any:
        """The request's sketch: a pure function of its canonical form (which its key hashes) and of
        the order its body's bytes (which the digest hashes) give the parsed body's fields."""
        seen = (answered.key, answered.request_digest)
        near = self._sketches.get(seen)
        if near is None:
            near = self._sketches[seen] = replay_index.sketch(c, answered.route)
            if len(self._sketches) > _SKETCHES:
                self._sketches.popitem(last=False)
        else:
            self._sketches.move_to_end(seen)
        return near


_SKETCHES = 4096  # sketches remembered (each well under a kilobyte)


def over_limit(size: int, limit: int) -> str:
    """Why an answer of `size` bytes was not recorded under the body limit `limit`."""
    return (f"the answer's body ({size / (1 << 20):.1f} MiB) is over --max-body-mb {limit >> 20}: not recorded (the "
            f"client got it); record it again with --max-body-mb {-(-size >> 20)} to keep it")


def _check_row(a: Answered, text: str) -> None:
    """A row read back from disk makes a record that reads back as one, with its own request
    body (hashing to its digest) and the key, session and order numbers the row says; ValueError
    naming what is wrong otherwise (`Store.append` trusts what it is given)."""
    if not HEX_KEY.fullmatch(a.key) or not HEX_KEY.fullmatch(a.request_digest):
        raise ValueError("its key or request digest is not a sha256")
    if hashlib.sha256(a.request_body).hexdigest() != a.request_digest:
        raise ValueError("its request body does not hash to its digest")
    if a.occurrence < 0 or a.seq < 0:
        raise ValueError("its occurrence or sequence number is negative")
    try:
        ex = exchange_record.parse(exchange_record.with_id(text, 1).encode())
    except (TypeError, ValueError, msgspec.DecodeError) as exc:
        raise ValueError(f"its record does not read back as an exchange record ({exc})") from None
    if (ex.key, ex.session, ex.occurrence, ex.seq) != (a.key, a.session, a.occurrence, a.seq) or \
            ex.request.get("body") != (a.request_digest if a.request_body else None):
        raise ValueError("its record names another request than the row does")


def _near_of_row(rules: Rules | None, a: Answered) -> Any:
    """The sketch of a row's request, rebuilt from its stored form (None where it cannot be: the
    store then checks the record's text, and the exchange replays by its key all the same)."""
    try:
        return stored_request_near(rules, json.loads(a.request_json)["request"], a.request_body)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _answered(pending: Pending, response: ResponseData | None, error: str | None, latency_ms: float | None,
              notes: Sequence[str], end: float) -> Answered:
    """What the exchange's full write is made of (every secret already erased)."""
    p, labels = pending.prepared, pending.prepared.labels
    return Answered(
        pending.request_json, pending.notes + list(notes), p.request.stored_digest, p.request.stored_body,
        None if pending.provider is None else pending.provider.name,
        None if response is None else response.status,
        [] if response is None else secrets.scrub_headers(response.headers),  # as the record keeps them
        b"" if response is None else response.raw_body,
        None if response is None or response.layout is None else list(response.layout),
        False if response is None else response.partial, error, latency_ms, end, p.key, p.occurrence, p.seq,
        p.started, _route(p), pending.deps, labels.session, labels.task, labels.replicate, labels.condition,
        *pending.route)


def _text(v: Any) -> bool:
    return v is None or type(v) is str


def _count(v: Any) -> bool:
    return v is None or type(v) is int


def _route(p: Prepared) -> str:
    return replay_index.indexed_route(p.canonical)
