"""Replay mode: answer every request from the recording, and say so loudly when it cannot.

Which answer a request gets (README, "Which answer a replayed request gets"): the recorded
answers for its key, in scope (the sessions asked for), ordered by recorded session (in the
order sessions began) and then by occurrence. Pairing follows content, not time:

- a key with one recorded answer in scope is answered at once, whatever came before it;
- identical requests (one key, several answers: sampling) take the answers occurrence by
  occurrence, in recorded order, preferring an answer whose request carried only answers this
  replay session has been served (its content dependencies); a replay session never shares
  them with another, so every replayed agent run sees the same answers;
- a call-order violation is a request that carries an answer this replay session has not been
  served (it cannot have come from this replay);
- any other departure from the recorded order (a request asked before one that had its answer
  before it was recorded) changes no pairing: an order note, counted and shown, never refused.

`order="recorded"` keeps the earlier, stricter rule for users who want it: the n-th request with
a key gets the n-th answer, and may be given only once every request of its recorded session
that had its answer before it was asked has been asked in this replay session (the proxy waits
`--order-wait` for them; still missing, a call-order violation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from noisefloor.display import visible
from noisefloor.errors import InputError
from noisefloor.proxy._stats import Stats
from noisefloor.proxy.replay import _report as replay_report
from noisefloor.proxy.replay import diagnosis, replies, trajectory
from noisefloor.proxy.replay._order import RecordedOrder
from noisefloor.proxy.replay._report import MissReport
from noisefloor.proxy.replay.trajectory import Divergence, Trajectories
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.request.traffic import Counters, Prepared, RequestData, ResponseData, prepare
from noisefloor.proxy.store import exchange as exchange_record
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store.exchange import Exchange
from noisefloor.proxy.store.log import Store, StoreError
from noisefloor.proxy.store.replay_index import RecordedEntry

ORDERS = ("content", "recorded")


@dataclass(frozen=True)
class Answer:
    result: str  # "hit", "miss" or "order_violation"
    response: ResponseData


@dataclass(frozen=True)
class Matched:
    """A request matched to its recorded answer, not answered yet (in `order="recorded"` its
    recorded predecessors may still have to be asked: see `blocker`)."""

    prepared: Prepared
    entry: RecordedEntry
    session: str
    violation: str | None = None  # why it is a call-order violation (content pairing)
    carried: RecordedEntry | None = None  # the answer it carries that was not served
    note: str | None = None  # an order note: recorded order departed from, no pairing changed


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
        order: str = "content",
        say: Callable[[str], None] | None = None,
    ) -> None:
        """`log` receives, for each replayed request, a function that builds its exchange record and
        bodies; calling it later keeps that work off the answer's path (default: written at once).
        `say` gets one line per miss (stderr in the proxy)."""
        if order not in ORDERS:
            raise InputError(f"unknown replay order {order!r}; choose one of {', '.join(ORDERS)}")
        store.bind_rules(rules.id, rules.describe(), also=rules.legacy_ids)
        store.answered.refuse("replay")  # answered exchanges a killed recorder left: they would be misses
        self.store = store
        self.rules = rules
        def write_now(build: LogEntry) -> None:  # a typed def: mypy checks an untyped lambda's *build() as *Any
            store.append(*build(), None)

        self._log_sink = log or write_now
        self._say = say
        self.strict = strict
        self.allow_reuse = allow_reuse
        self.order = order
        self.stats = Stats()
        self.counters = Counters()
        self.index = replay_index.open_index(store)
        self.sources = frozenset(sources)
        if self.sources and all(self.index.first_id(s) is None for s in self.sources):
            raise InputError(f"no recorded session named {sorted(self.sources)} in {store.path}; "
                             "list them with `nfproxy log`")
        self._order = RecordedOrder(lambda name: self._session(name)[0])
        self._used: dict[str, set[int]] = {}  # replay session -> recorded ids it was served
        self._served: dict[str, set[tuple[str, int]]] = {}  # ... as (recorded session, seq)
        self.misses: list[MissReport] = []
        self.order_notes: list[str] = []
        self.trajectories = Trajectories()
        self.turn: Any = None  # turns.Turn: the recorded run `--replay-session next / first` took
        self._diverged: dict[tuple[str, int], Divergence] = {}  # (session, step) -> its departure, until logged

    @property
    def recorded(self) -> int:
        return self.index.count()

    def ready_note(self) -> str:
        """Which recorded sessions this replay follows, for the ready line."""
        if self.turn is not None:
            return self.turn.line()
        if self.sources:
            return "answering from recorded sessions " + ", ".join(f"'{visible(s)}'" for s in sorted(self.sources))
        return ("each replay session follows the first recorded session holding its first request (the summary "
                "names it; --replay-session next replays repeated recorded runs in turn)")

    def answer(self, request: RequestData, labels: Labels) -> Answer:
        """Match and answer at once, without waiting for predecessors (a library caller)."""
        m = self.match(request, labels)
        return m if isinstance(m, Answer) else self.settle(m)

    def match(self, request: RequestData, labels: Labels) -> Answer | Matched:
        """Key the request and pick its recorded answer (a miss is answered at once). The request
        counts as asked from here on, so requests waiting for it can go ahead."""
        p = prepare(request, labels, self.rules, self.counters)
        labels = p.labels  # erased of the request's secrets: a session name reaches the summary on screen
        candidates = self._candidates(p.key, labels)
        self.trajectories.asked(labels.session, (e.session for e in candidates) if p.seq == 0 else ())
        if self.order == "recorded":
            if p.occurrence < len(candidates) or (candidates and self.allow_reuse):
                picked = candidates[min(p.occurrence, len(candidates) - 1)]
                self._order.ask(labels.session, picked)
                return Matched(p, picked, labels.session)
            return self._miss(p, candidates)
        used = self._used.setdefault(labels.session, set())
        fresh = [e for e in candidates if e.id not in used]
        if not fresh:
            if candidates and self.allow_reuse:
                return Matched(p, candidates[-1], labels.session)
            return self._miss(p, candidates)
        served = self._served.setdefault(labels.session, set())
        entry = next((e for e in fresh if all((e.session, d) in served for d in e.deps)), None)
        if entry is None:  # every recorded occurrence carries an answer this session was not served
            entry = fresh[0]
            seq = next(d for d in entry.deps if (entry.session, d) not in served)
            carried = self._session(entry.session)[1].get(seq)
            where = f"exchange {carried.id}, {carried.route}" if carried else f"seq {seq}"
            why = (f"this request carries the answer of recorded session {entry.session!r}'s request ({where}), "
                   "which this replay session has not been served")
            return Matched(p, entry, labels.session, violation=why, carried=carried)  # taken only if served
        self._take(labels.session, entry)
        return Matched(p, entry, labels.session, note=self._order_note(labels.session, entry))

    def blocker(self, m: Matched) -> RecordedEntry | None:
        """`order="recorded"`: the first recorded predecessor of `m` (same recorded session, answered
        before `m` was asked) that this replay session has not asked yet; None when `m` may be
        answered. Content pairing never waits: always None."""
        if self.order != "recorded":
            return None
        return self._order.first_unasked(m.session, m.entry)

    def settle(self, m: Matched, waited: float = 0.0) -> Answer:
        """Answer a matched request: a hit, or a call-order violation. `waited`: the seconds the
        proxy held it before this (kept in its replay record as `wait_ms`)."""
        if self.order == "recorded":
            first = self.blocker(m)
            if first is None:
                return self._hit(m, waited)
            why = (f"recorded session {m.entry.session!r} asked {first.route} (exchange {first.id}, key "
                   f"{first.key[:12]}) and had its answer before it asked this request; this replay session "
                   f"has not asked it" + (f" (waited {waited:.3g} s)" if waited >= 0.001 else ""))
            return self._violation(m, why, first, waited)
        if m.violation is not None:
            return self._violation(m, m.violation, m.carried, waited)
        return self._hit(m, waited)

    def summary_lines(self) -> list[str]:
        """What the exit summary adds: which recorded session each replay session followed and where
        it diverged, each miss and what it affected, the order notes."""
        followed = self.trajectories.lines(pinned=bool(self.sources))
        shown = followed[:2 * trajectory.SHOWN]
        if len(followed) > len(shown):
            shown.append("  ... more replay sessions (`nfproxy log` lists each)")
        return shown + replay_report.summary_lines(self.misses, self.order_notes,
                                                   lambda name: len(self._session(name)[0]))

    # -- pairing -------------------------------------------------------------------------------

    def _candidates(self, key: str, labels: Labels) -> list[RecordedEntry]:
        if labels.replay_from is not None:  # one recorded session answers: its own requests, read once
            # for the session, not every recorded exchange with this key (a page read each, at 1M)
            return self.index.session(labels.replay_from).by_key.get(key, [])
        found = self.index.candidates(key)
        return [e for e in found if e.session in self.sources] if self.sources else found

    def _take(self, session: str, entry: RecordedEntry) -> None:
        self._used[session].add(entry.id)
        self._served[session].add((entry.session, entry.seq))
        self._order.ask(session, entry)

    def _stands_in(self, session: str, recorded: str, exchange_id: int) -> None:
        """A miss took the place of the recorded request nearest to it: for the order that request
        counts as asked, so the requests after it are no departure from recorded order (a changed
        request is one miss, not a miss and an order note for every request that follows)."""
        entry = next((e for e in self._session(recorded)[0] if e.id == exchange_id), None)
        if entry is not None:
            self._order.ask(session, entry)

    def _order_note(self, session: str, entry: RecordedEntry) -> str | None:
        first = self._order.first_unasked(session, entry)
        if first is None:
            return None
        note = (f"exchange {entry.id} ({entry.route}) was asked before exchange {first.id}, which had its answer "
                f"before it in recorded session {entry.session!r}")
        self.order_notes.append(note)
        return note

    def _session(self, name: str) -> tuple[list[RecordedEntry], dict[int, RecordedEntry]]:
        s = self.index.session(name)
        return s.entries, s.by_seq

    # -- answers -------------------------------------------------------------------------------

    def _hit(self, m: Matched, waited: float) -> Answer:
        source, response = self._source(m.entry.id)
        return self._log(m.prepared, "hit", response, m.entry, None, source, note=m.note, waited=waited)

    def _violation(self, m: Matched, why: str, first: RecordedEntry | None, waited: float) -> Answer:
        self._departed(m.prepared, Divergence(m.prepared.seq, "order_violation", m.entry.session, None, 0))
        if self.strict:
            return self._log(m.prepared, "order_violation", replies.order_violation(m.prepared, m.entry, why, first),
                             m.entry, why, waited=waited)
        if self.order != "recorded":
            self._take(m.session, m.entry)
        source, response = self._source(m.entry.id)
        return self._log(m.prepared, "order_violation", response, m.entry, why, source, waited=waited)

    def _miss(self, p: Prepared, candidates: list[RecordedEntry]) -> Answer:
        near = None if candidates else self._pinned(p, diagnosis.nearest(self.store, self.rules, self.index, p))
        affected: tuple[int, ...] = ()
        if near and near.get("session"):
            affected = self._order.affected(near["session"], near["exchange_id"], self._session(near["session"])[1])
            self._stands_in(p.labels.session, near["session"], near["exchange_id"])
        route = f"{p.canonical.method} {p.canonical.path}"
        left = near.get("session") if near else (candidates[0].session if candidates else None)
        self._departed(p, Divergence(p.seq, "miss", left, near.get("differs_at") if near else None, len(affected)))
        self.misses.append(MissReport(p.labels.session, p.labels.task, p.key, route, near, affected))
        if self._say is not None:
            self._say(replay_report.miss_line(p, route, len(candidates), near, affected))
        return self._log(p, "miss", replies.miss(p, len(candidates), near, list(affected)), None, None)

    def _pinned(self, p: Prepared, near: dict[str, Any] | None) -> dict[str, Any] | None:
        """The nearest recorded request, taken from the one recorded session this replay follows
        (a label's replay_from, or a single --replay-session) when that session holds the same request
        as the nearest found elsewhere (repeated runs begin alike)."""
        pinned = p.labels.replay_from or (next(iter(self.sources)) if len(self.sources) == 1 else None)
        if near is None or pinned is None or near.get("session") == pinned:
            return near
        same = self.index.session(pinned).by_key.get(str(near.get("key")), [])
        return {**near, "exchange_id": same[0].id, "session": pinned} if same else near

    def _departed(self, p: Prepared, d: Divergence) -> None:
        """The replay session's first departure from the recording is kept (`trajectory`); later
        ones follow from it."""
        if self.trajectories.departed(p.labels.session, d):
            self._diverged[(p.labels.session, p.seq)] = d

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
        return ResponseData.from_record(rec, self.store.bodies.of_part(rec))  # within its recorded size

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
        note: str | None = None,
        waited: float = 0.0,
    ) -> Answer:
        if result != "hit":  # replay's own answer (a miss's diff) quotes the asked request: erase its secrets
            response = response.without(p.request.secret_values)
        def build() -> tuple[dict[str, Any], dict[str, bytes]]:  # called by the log sink, maybe later
            record = exchange_record.request_part(p, "replay", self.rules.id)
            # what was served carries the recorded answer's identity and usage
            identity = None if source is None else {k: getattr(source, k) for k in exchange_record.ANSWER_FIELDS}
            record.update(exchange_record.answer_part(response, identity))
            record["replay"] = {"result": result, "source_id": entry.id if entry else None, "detail": why,
                                "wait_ms": round(waited * 1000, 3)}
            if entry is not None:
                record["replay"]["from"] = entry.session  # the recorded session this answer came from
            if p.seq == 0:
                t = self.trajectories.get(p.labels.session)
                record["replay"]["matching"] = t.matching if t else 0  # recorded sessions holding its first request
            diverged = self._diverged.pop((p.labels.session, p.seq), None)
            if diverged is not None:
                record["replay"]["diverged"] = diverged.to_json()
            if note is not None:
                record["replay"]["order_note"] = note
            record["latency_ms"] = 0.0
            if source is not None:
                record["error"] = source.error
            return record, {p.request.stored_digest: p.request.stored_body, response.digest: response.raw_body}

        self._log_sink(build)
        self.stats.exchanges += 1
        if result == "hit" and entry is not None:
            self.trajectories.served(p.labels.session, entry.session)
        if result == "hit":
            self.stats.hits += 1
            self.stats.order_notes += note is not None
        elif result == "miss":
            self.stats.misses += 1
        else:
            self.stats.order_violations += 1
        return Answer(result, response)


LogEntry = Callable[[], tuple[dict[str, Any], dict[str, bytes]]]
