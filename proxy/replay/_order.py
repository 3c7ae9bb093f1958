"""Recorded order, for replay: which recorded requests had their answer before another was asked
(its predecessors, which `order="recorded"` waits for and order notes name), how far each replay
session has come through each recorded session, and which recorded requests carry an answer."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from noisefloor.proxy.store.log import RecordedEntry


@dataclass
class _Progress:
    """One replay session's progress through one recorded session: which of its requests have
    been asked, and how long a prefix of them, in order of completion, is complete."""

    asked: set[int]
    frontier: int = 0


@dataclass
class _Order:
    """One recorded session's requests in order of completion, and for each how many of them had
    completed before it arrived (its recorded predecessors are that prefix)."""

    by_end: list[RecordedEntry]
    needs: dict[int, int]
    dependents: dict[int, list[int]] = field(default_factory=dict)  # seq -> seqs that carry its answer


class RecordedOrder:
    """Built per recorded session on first use, from `entries(name)` (its recorded requests)."""

    def __init__(self, entries: Callable[[str], list[RecordedEntry]]) -> None:
        self._entries = entries
        self._progress: dict[tuple[str, str], _Progress] = {}
        self._orders: dict[str, _Order] = {}

    def ask(self, session: str, entry: RecordedEntry) -> None:
        """Replay session `session` has asked recorded request `entry`."""
        prog = self._progress.setdefault((session, entry.session), _Progress(set()))
        prog.asked.add(entry.id)
        order = self._order(entry.session).by_end
        while prog.frontier < len(order) and order[prog.frontier].id in prog.asked:
            prog.frontier += 1

    def first_unasked(self, session: str, entry: RecordedEntry) -> RecordedEntry | None:
        """The first recorded predecessor of `entry` that `session` has not asked yet, or None."""
        prog = self._progress.get((session, entry.session))
        order = self._order(entry.session)
        need = order.needs.get(entry.id, 0)
        if prog is None or prog.frontier >= need:
            return None
        return next((e for e in order.by_end[:need] if e.id not in prog.asked), None)

    def affected(self, session: str, exchange_id: int, by_seq: dict[int, RecordedEntry]) -> tuple[int, ...]:
        """Recorded requests that carry the answer of `exchange_id`, directly or through others."""
        start = next((e for e in by_seq.values() if e.id == exchange_id), None)
        if start is None:
            return ()
        dependents = self._order(session).dependents
        seen: set[int] = set()
        todo = [start.seq]
        while todo:
            for s in dependents.get(todo.pop(), ()):
                if s not in seen:
                    seen.add(s)
                    todo.append(s)
        return tuple(sorted(by_seq[s].id for s in seen if s in by_seq))

    def _order(self, name: str) -> _Order:
        if name not in self._orders:
            entries = self._entries(name)
            span = _spans(entries)
            ordered = sorted(entries, key=lambda e: (span[e.id][1], e.seq))
            ends = [span[e.id][1] for e in ordered]
            needs = {e.id: bisect_right(ends, span[e.id][0]) for e in entries}
            dependents: dict[int, list[int]] = {}
            for e in entries:
                for d in e.deps:
                    dependents.setdefault(d, []).append(e.seq)
            self._orders[name] = _Order(ordered, needs, dependents)
        return self._orders[name]


def _spans(session: list[RecordedEntry]) -> dict[int, tuple[float, float]]:
    """(start, end) per request. A session recorded before times were kept gets its arrival order
    as a total order: each request then follows every earlier one."""
    if all(e.start is not None and e.end is not None for e in session):
        return {e.id: (float(e.start), float(e.end)) for e in session}  # type: ignore[arg-type]
    return {e.id: (float(e.seq), e.seq + 0.5) for e in session}
