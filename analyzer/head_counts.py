"""nfanalyze's counts of a store's heads per condition: calls, misses, order violations, errors,
truncated responses, tokens, sessions, and the modes, models and fingerprints served.

A million heads pass through here. Building a (head, labels, route) tuple per head and counting it
in a Python loop, then folding a group per session into conditions, was most of nfanalyze's cost
per exchange. A batch of heads as stored (`Walk.stored_head_batches`) is instead turned into
integer columns in C loops (`map`, `np.fromiter`) and summed per (labels number, route number) in
numpy; each labels number met is looked up once per 8192 heads, for its condition and session,
and the groups summed into (condition, route) cells. A batch whose values are not the usual shapes (usage as a dict, with a missing count, or
a count past 32 bits) is counted head by head in Python ints as before, so every head counts
exactly as it did.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from noisefloor.proxy.store.heads import Parts, Stored

Key = tuple[tuple[Any, ...], tuple[Any, ...]]  # (labels, route) as the store spells them
Group = list[int]  # calls, errors, truncated, input tokens, output tokens, the position of its first head
_LABELS, _ROUTE, _STATUS, _USAGE, _TRUNCATED, _ERROR = (
    attrgetter(f) for f in ("labels", "route", "status", "usage", "truncated", "error"))
_NO_USAGE = [0, 0]
_LIMIT = 1 << 32  # a count this large or larger is summed in Python (int64 sums stay exact below it)
_PENDING = 1 << 13  # `columns`' rows kept before they are summed into one row per group (a chunk)
_NUMBERED = 1 << 32  # a set's number is a u32: (labels, route) packed in one int64
UNLABELED = "(unlabeled)"


def columns(stored: Sequence[Stored], start: int) -> np.ndarray | None:
    """The rows (labels number, route number, position, 1, error, truncated, input, output) of a
    batch of heads as stored, the first at position `start`, as an (8, n) int64 array; None where
    a head's usage is not None, empty or [int, int] within 32 bits (those are counted by `HeadCounts.add_parts`)."""
    n = len(stored)
    usage = [u or _NO_USAGE for u in map(_USAGE, stored)]
    if set(map(type, usage)) != {list} or set(map(len, usage)) != {2}:
        return None
    try:
        tokens = np.fromiter(chain.from_iterable(usage), np.int64, 2 * n)
    except (TypeError, ValueError, OverflowError):  # a count that is None, or past 64 bits
        return None
    if tokens.max() >= _LIMIT or tokens.min() <= -_LIMIT:
        return None
    out = np.empty((8, n), np.int64)
    out[0] = np.fromiter(map(_LABELS, stored), np.int64, n)
    out[1] = np.fromiter(map(_ROUTE, stored), np.int64, n)
    out[2] = np.arange(start, start + n)
    out[3] = 1
    out[4] = _errors(stored, n)
    truncated = list(map(_TRUNCATED, stored))  # bool or None
    out[5] = np.fromiter(map(bool, truncated), np.int64, n) if truncated.count(True) else 0
    out[6], out[7] = tokens[0::2], tokens[1::2]
    return out


def _errors(stored: Sequence[Stored], n: int) -> np.ndarray | int:
    """Whether each head is an error (an error noted, or a status of 500 or more); 0 for none of them."""
    errors, status = list(map(_ERROR, stored)), list(map(_STATUS, stored))
    if errors.count(None) == n and max(filter(None, status), default=0) < 500:
        return 0
    return np.fromiter((e is not None or (s or 0) >= 500 for e, s in zip(errors, status)), np.int64, n)


def summed(rows: np.ndarray) -> np.ndarray:
    """`columns`' rows summed into one per (labels number, route number), its position the first."""
    key = rows[0] * _NUMBERED + rows[1]
    order = np.argsort(key, kind="stable")  # runs already sorted (summed chunks) are merged, not sorted again
    key, rows = key[order], rows[:, order]
    starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    out = np.empty((8, len(starts)), np.int64)
    out[:2] = rows[:2, starts]
    out[2] = np.minimum.reduceat(rows[2], starts)
    out[3:] = np.add.reduceat(rows[3:], starts, axis=1)
    return out


Folded = tuple[list[int], int, set[Any], set[Any], set[Any]]  # a condition's 7 counts, sessions, modes, models, fingerprints


class HeadCounts:
    """The counts of one or more stores' heads per condition, in the order conditions first appear.

    Batches of heads as stored are summed per (labels number, route number) in numpy, _PENDING
    heads at a time, and those groups into (condition, route) cells (each labels set's condition and
    session, and each route, numbered once across stores), so that nothing is done in Python per
    head and nothing kept per exchange. Heads counted one at a time (`add_parts`) are grouped per
    (labels, route) as before, in Python ints."""

    def __init__(self) -> None:
        self._groups: dict[Key, Group] = {}  # counted head by head
        self._pending: list[np.ndarray] = []  # `columns`' rows of the store being counted
        self._rows = 0
        self._seen = 0  # heads counted: the next head's position
        self._conditions: dict[Any, int] = {}
        self._sessions: dict[Any, int] = {}
        self._routes: dict[tuple[Any, ...], int] = {}
        self._cells = np.zeros((8, 0), np.int64)  # (condition, route, first, counts...) rows, summed
        self._pairs: list[np.ndarray] = []  # condition * _NUMBERED + session, each seen (distinct per array)
        self._pair_rows = 0
        self._merged = 0  # the pairs when last made distinct

    def add(self, stored: Sequence[Stored], labels: dict[int, tuple[Any, ...]],
            routes: dict[int, tuple[Any, ...]]) -> None:
        """A batch of one store's heads as stored, their sets' numbers those of `labels` / `routes`."""
        if not stored:
            return
        rows = columns(stored, self._seen)
        if rows is None:
            self.add_parts([(s, labels[s.labels], routes[s.route]) for s in stored])
            return
        self._seen += len(stored)
        self._pending.append(rows)
        self._rows += rows.shape[1]
        if self._rows >= _PENDING:
            self._fold_pending(labels, routes)

    def _fold_pending(self, labels: dict[int, tuple[Any, ...]], routes: dict[int, tuple[Any, ...]]) -> None:
        """The pending rows summed per (labels number, route number), each labels set looked up once
        for its condition and session, and the groups summed into the (condition, route) cells: what
        is kept grows with sessions (a number per session and condition), not with exchanges."""
        rows = summed(np.concatenate(self._pending, axis=1))
        self._pending, self._rows = [], 0
        new = np.concatenate(([True], rows[0, 1:] != rows[0, :-1]))  # rows[0] is sorted: `summed`'s first key
        lids, at_l = rows[0, new], np.cumsum(new) - 1
        rids, at_r = np.unique(rows[1], return_inverse=True)
        sets = [labels[i] for i in lids.tolist()]
        conds, sessions, known = self._conditions, self._sessions, self._routes
        cond = np.fromiter((conds.setdefault(t[3] or UNLABELED, len(conds)) for t in sets), np.int64, len(sets))
        session = np.fromiter((sessions.setdefault(t[0], len(sessions)) for t in sets), np.int64, len(sets))
        route = np.fromiter((known.setdefault(routes[i], len(known)) for i in rids.tolist()), np.int64, len(rids))
        self._add_pairs(np.unique(cond * _NUMBERED + session))
        rows[0], rows[1] = cond[at_l], route[at_r]
        self._cells = summed(np.concatenate((self._cells, rows), axis=1))

    def _add_pairs(self, pairs: np.ndarray) -> None:
        """Distinct (condition, session) numbers, made distinct again each time they have doubled."""
        self._pairs.append(pairs)
        self._pair_rows += len(pairs)
        if self._pair_rows >= 2 * self._merged:
            self._pairs = [np.unique(np.concatenate(self._pairs))]
            self._pair_rows = self._merged = len(self._pairs[0])

    def add_parts(self, heads: Iterable[Parts]) -> None:
        """Heads with their sets (`Walk.head_parts`), counted one at a time."""
        groups, pos = self._groups, self._seen
        for s, labels, route in heads:
            key = (labels, route)
            g = groups.get(key)
            if g is None:
                g = groups[key] = [0, 0, 0, 0, 0, pos]
            pos += 1
            g[0] += 1
            if s.error is not None or (s.status or 0) >= 500:
                g[1] += 1
            if s.truncated:
                g[2] += 1
            usage = s.usage
            if usage:
                pair = usage if isinstance(usage, list) else (usage.get("input"), usage.get("output"))
                g[3] += pair[0] or 0
                g[4] += pair[1] or 0
        self._seen = pos

    def end_store(self, labels: dict[int, tuple[Any, ...]], routes: dict[int, tuple[Any, ...]]) -> None:
        """The rows still pending of the store just counted, folded with its sets (`labels`, `routes`)."""
        if self._pending:
            self._fold_pending(labels, routes)

    def by_condition(self) -> dict[Any, Folded]:
        """Each condition's counts (calls, misses, order violations, errors, truncated, input and
        output tokens), its sessions and the modes, models and fingerprints it was served with."""
        conds, sessions, known = self._conditions, self._sessions, self._routes
        cells: dict[tuple[int, int], list[int]] = {}  # (condition, route) -> counts, first: Python ints
        pairs = [p.tolist() for p in self._pairs]
        for ((session, _, _, condition), route), group in self._groups.items():
            c = conds.setdefault(condition or UNLABELED, len(conds))
            pairs.append([c * _NUMBERED + sessions.setdefault(session, len(sessions))])
            _merge(cells, (c, known.setdefault(route, len(known))), group)
        for c, r, first, *counts in self._cells.T.tolist():
            _merge(cells, (c, r), [*counts, first])
        return _fold(cells, set(chain.from_iterable(pairs)), list(conds), list(known))


def _merge(cells: dict[tuple[int, int], list[int]], key: tuple[int, int], group: Group) -> None:
    cell = cells.get(key)
    if cell is None:
        cells[key] = list(group)
        return
    for i in range(5):
        cell[i] += group[i]
    cell[5] = min(cell[5], group[5])


def _fold(cells: dict[tuple[int, int], list[int]], pairs: set[int], conds: list[Any],
          routes: list[tuple[Any, ...]]) -> dict[Any, Folded]:
    """The (condition, route) cells folded per condition, in the order of each one's first head."""
    firsts: dict[int, int] = {}
    acc: dict[int, Folded] = {}
    for (c, r), (n, errors, truncated, tokens_in, tokens_out, first) in cells.items():
        firsts[c] = min(firsts.get(c, first), first)
        a = acc.get(c)
        if a is None:
            a = acc[c] = ([0] * 7, 0, set(), set(), set())
        counts, _, modes, models, fingerprints = a
        mode, _, _, model, fingerprint, result = routes[r]
        counts[0] += n
        if result == "miss":
            counts[1] += n
        elif result == "order_violation":
            counts[2] += n
        counts[3] += errors
        counts[4] += truncated
        counts[5] += tokens_in
        counts[6] += tokens_out
        modes.add(mode)
        if model:
            models.add(model)
        if fingerprint:
            fingerprints.add(fingerprint)
    seen = np.bincount(np.fromiter(pairs, np.int64, len(pairs)) // _NUMBERED, minlength=len(conds))
    return {conds[c]: (a[0], int(seen[c]), *a[2:]) for c, a in sorted(acc.items(), key=lambda ca: firsts[ca[0]])}
