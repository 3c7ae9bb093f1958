"""Replay mode: answer every request from the recording, and say so loudly when it cannot.

Matching rule (Appendix A.4 of the ladder paper asks for it to be explicit): the recorded answers
for a key are ordered by recorded session (in the order sessions began) and then by occurrence
within the session. The n-th request with that key in a replay session gets the n-th answer.
A replay session never shares counters with another, so every replayed agent run sees the same
answers.

Order is the recorded happens-before order, not a total order: requests that overlapped in time
when recorded have no order between them (a harness sends them concurrently); only a request
that arrived after another's answer was complete can depend on it. So an answer drawn from a
recorded session may be given once every request of that session that had finished before it
started has been asked in this replay session. The proxy waits for that (the predecessors are
usually a concurrent request a moment behind); a predecessor still not asked when the wait runs
out is a real departure: a call-order violation naming the request that should have come first.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from noisefloor.proxy import diagnosis, exchange_record, replies
from noisefloor.proxy.keys import Rules
from noisefloor.proxy.store import Exchange, RecordedEntry, Store, StoreError
from noisefloor.proxy.traffic import Counters, Labels, Prepared, RequestData, ResponseData, Stats, prepare


@dataclass(frozen=True)
class Answer:
    result: str  # "hit", "miss" or "order_violation"
    response: ResponseData


@dataclass(frozen=True)
class Matched:
    """A request matched to its recorded answer, not answered yet: its recorded predecessors may
    still have to be asked (see `blocker`)."""

    prepared: Prepared
    entry: RecordedEntry
    session: str


@dataclass
class _Progress:
    """One replay session's progress through one recorded session: which of its requests have
    been asked, and how long a prefix of them, in order of completion, is complete."""

    asked: set[int]
    frontier: int = 0


class Replayer:
    def __init__(
        self,
        store: Store,
        rules: Rules,
        *,
        strict: bool = True,
        allow_reuse: bool = False,
        sources: Iterable[str] = (),
        log: Callable[[LogEntry], None] | None = None,
    ) -> None:
        """`log` receives, for each replayed request, a function that builds its exchange record and
        bodies; calling it later keeps that work off the answer's path (default: written at once)."""
        store.bind_rules(rules.id, rules.describe())
        self.store = store
        self.rules = rules
        self._log_sink = log or (lambda build: store.append(*build(), None))
        self.strict = strict
        self.allow_reuse = allow_reuse
        self.stats = Stats()
        self.counters = Counters()
        wanted = set(sources)
        entries = [e for e in store.recorded_entries() if not wanted or e.session in wanted]
        if wanted and not entries:
            raise ValueError(f"no recorded session named {sorted(wanted)} in {store.path}; list them with `nfproxy log`")
        self._by_key, self._session_keys, self._by_end, self._needs = _index(entries)
        self._progress: dict[tuple[str, str], _Progress] = {}
        self._entries = entries

    @property
    def recorded(self) -> int:
        return len(self._entries)

    def answer(self, request: RequestData, labels: Labels) -> Answer:
        """Match and answer at once, without waiting for predecessors (a library caller)."""
        m = self.match(request, labels)
        return m if isinstance(m, Answer) else self.settle(m)

    def match(self, request: RequestData, labels: Labels) -> Answer | Matched:
        """Key the request and pick its recorded answer (a miss is answered at once). The request
        counts as asked from here on, so requests waiting for it can go ahead."""
        p = prepare(request, labels, self.rules, self.counters)
        index = self._by_key if labels.replay_from is None else self._session_keys.get(labels.replay_from, {})
        candidates = index.get(p.key, [])
        if p.occurrence < len(candidates) or (candidates and self.allow_reuse):
            entry = candidates[min(p.occurrence, len(candidates) - 1)]
            self._ask(labels.session, entry)
            return Matched(p, entry, labels.session)
        near = None if candidates else diagnosis.nearest(self.store, self.rules, self._entries, p)
        return self._log(p, "miss", replies.miss(p, len(candidates), near), None, None)

    def blocker(self, m: Matched) -> RecordedEntry | None:
        """The first recorded predecessor of `m` (same recorded session, answered before `m` was
        asked) that this replay session has not asked yet; None when `m` may be answered."""
        prog = self._progress[(m.session, m.entry.session)]
        need = self._needs[m.entry.id]
        if prog.frontier >= need:
            return None
        return next(e for e in self._by_end[m.entry.session][:need] if e.id not in prog.asked)

    def settle(self, m: Matched, waited: float = 0.0) -> Answer:
        """Answer a matched request: a hit, or a call-order violation if a predecessor is still missing."""
        first = self.blocker(m)
        if first is None:
            source, response = self._source(m.entry.id)
            return self._log(m.prepared, "hit", response, m.entry, None, source)
        why = (f"recorded session {m.entry.session!r} asked {first.route} (exchange {first.id}, key "
               f"{first.key[:12]}) and had its answer before it asked this request; this replay session "
               f"has not asked it" + (f" (waited {waited:g} s)" if waited else ""))
        if self.strict:
            return self._log(m.prepared, "order_violation", replies.order_violation(m.prepared, m.entry, why, first),
                             m.entry, why)
        source, response = self._source(m.entry.id)
        return self._log(m.prepared, "order_violation", response, m.entry, why, source)

    # -- helpers -------------------------------------------------------------------------------

    def _ask(self, session: str, entry: RecordedEntry) -> None:
        prog = self._progress.setdefault((session, entry.session), _Progress(set()))
        prog.asked.add(entry.id)
        order = self._by_end[entry.session]
        while prog.frontier < len(order) and order[prog.frontier].id in prog.asked:
            prog.frontier += 1

    @lru_cache(maxsize=4096)  # noqa: B019 - one replayer per process; replicates serve the same answers again
    def _source(self, exchange_id: int) -> tuple[Exchange, ResponseData]:
        source = self.store.exchange(exchange_id)
        if source is None:
            raise StoreError(f"the replay index names exchange {exchange_id}, which the store does not hold")
        response = self._recorded_response(source.response, source.error)
        return source, replace(response, headers=response.headers + (("x-nf-replay", "hit"),))

    def _recorded_response(self, rec: dict[str, Any] | None, error: str | None) -> ResponseData:
        if rec is None:  # the recording holds a connection failure: replay it as one
            return replies.recorded_failure(error)
        return ResponseData.from_record(rec, self.store.body(rec.get("body")))

    def refuse_websocket(self, request: RequestData, labels: Labels) -> ResponseData:
        """A WebSocket upgrade cannot be replayed: refused, logged and counted as a miss."""
        p = prepare(request, labels, self.rules, self.counters)
        return self._log(p, "miss", replies.websocket_refused(p), None, "websocket upgrade refused").response

    def failure(self, exc: BaseException) -> ResponseData:
        """The answer when replay itself broke (an unreadable store, a log that cannot be written):
        an error the agent sees at once, counted so that a strict run exits non-zero."""
        self.stats.errors += 1
        return replies.replay_failed(exc)

    def _log(
        self,
        p: Prepared,
        result: str,
        response: ResponseData,
        entry: RecordedEntry | None,
        why: str | None,
        source: Exchange | None = None,
    ) -> Answer:
        if result != "hit":  # replay's own answer (a miss's diff) quotes the asked request: erase its secrets
            response = response.without(p.request.secret_values)
        def build() -> tuple[dict[str, Any], dict[str, bytes]]:  # called by the log sink, maybe later
            record = exchange_record.request_part(p, "replay", self.rules.id)
            # what was served carries the recorded answer's identity and usage
            identity = None if source is None else {k: getattr(source, k) for k in exchange_record.ANSWER_FIELDS}
            record.update(exchange_record.answer_part(response, identity))
            record["replay"] = {"result": result, "source_id": entry.id if entry else None, "detail": why}
            record["latency_ms"] = 0.0
            if source is not None:
                record["error"] = source.error
            return record, {p.request.stored_digest: p.request.stored_body, response.digest: response.raw_body}

        self._log_sink(build)
        self.stats.exchanges += 1
        if result == "hit":
            self.stats.hits += 1
        elif result == "miss":
            self.stats.misses += 1
        else:
            self.stats.order_violations += 1
        return Answer(result, response)

Keyed = dict[str, list[RecordedEntry]]
LogEntry = Callable[[], tuple[dict[str, Any], dict[str, bytes]]]


def _index(entries: list[RecordedEntry]) -> tuple[Keyed, dict[str, Keyed], dict[str, list[RecordedEntry]],
                                                  dict[int, int]]:
    """Answers by key (sessions in the order they began, then occurrence), the same per recorded
    session, each session's requests in order of completion, and for each request how many of
    those had completed before it arrived (its recorded predecessors are that prefix)."""
    first_id: dict[str, int] = {}
    by_session: dict[str, list[RecordedEntry]] = defaultdict(list)
    for e in entries:
        first_id.setdefault(e.session, e.id)
        by_session[e.session].append(e)
    by_key: Keyed = defaultdict(list)
    for e in sorted(entries, key=lambda e: (first_id[e.session], e.occurrence)):
        by_key[e.key].append(e)
    per_session: dict[str, Keyed] = {}
    by_end: dict[str, list[RecordedEntry]] = {}
    needs: dict[int, int] = {}
    for name, lst in by_session.items():
        keyed: Keyed = defaultdict(list)
        for e in sorted(lst, key=lambda e: e.occurrence):
            keyed[e.key].append(e)
        per_session[name] = keyed
        span = _spans(lst)
        ordered = sorted(lst, key=lambda e: (span[e.id][1], e.seq))
        ends = [span[e.id][1] for e in ordered]
        by_end[name] = ordered
        for e in lst:
            needs[e.id] = bisect_right(ends, span[e.id][0])
    return by_key, per_session, by_end, needs


def _spans(session: list[RecordedEntry]) -> dict[int, tuple[float, float]]:
    """(start, end) per request. A session recorded before times were kept gets its arrival order
    as a total order: each request then follows every earlier one."""
    if all(e.start is not None and e.end is not None for e in session):
        return {e.id: (float(e.start), float(e.end)) for e in session}  # type: ignore[arg-type]
    return {e.id: (float(e.seq), e.seq + 0.5) for e in session}
