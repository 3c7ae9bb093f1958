"""Merge's per-session state in numpy arrays, not Python objects: a store's sessions (which of
them a shard brings, which OUT holds, which clash) and the ids each batch copies.

A store's check yields (id, identity) per exchange (`MergeScan.scan`); kept per exchange are
its id, a 16-byte hash of its session's name and the 32-byte hash of its identity (56 bytes, in
arrays), then per session its name's hash, first exchange, count and an order-free sum of its
identities' hashes (four 64-bit lanes, each summed modulo 2**64): about 90 bytes a session and 12
an exchange once a store is read, where a dict of session objects cost several hundred. A
session is named (read back from its first exchange) only where a message needs its name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from noisefloor.proxy.store.merge.scan import PLAN, Identity


def identity_hash(parts: Identity | tuple[Any, ...]) -> bytes:
    """What makes an exchange the same one in two stores (its id is only a position)."""
    return hashlib.blake2b(repr(parts).encode("utf-8", "surrogatepass"), digest_size=32).digest()


def name_hash(name: str) -> bytes:
    return hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@dataclass(frozen=True)
class Scanned:
    """A store's exchanges as its check read them: ids, session-name hashes, identity hashes (blobs)."""

    ids: bytes | bytearray
    names: bytes | bytearray
    marks: bytes | bytearray
    plans: bytes | bytearray = b""  # each exchange's `PLAN` bytes, where the check kept them


def scan(exchanges: Iterable[tuple[int, Identity]], plans: bytearray | None = None) -> Scanned:
    """The arrays of one read of a store (or of a range of its ids: `join` them in order); `plans`:
    the bytearray the read appends each exchange's `PLAN` bytes to."""
    ids, names, marks = bytearray(), bytearray(), bytearray()
    known: dict[str, bytes] = {}  # the last sessions' name hashes (a session's exchanges come close together)
    for exchange_id, parts in exchanges:
        ids += exchange_id.to_bytes(8, "little")
        h = known.get(parts[0])
        if h is None:
            if len(known) > 4096:
                known.clear()
            h = known[parts[0]] = name_hash(parts[0])
        names += h
        marks += identity_hash(parts)
    return Scanned(ids, names, marks, b"" if plans is None else plans)  # bytearrays, not copied: numpy reads them as they are


def join(parts: list[Scanned]) -> Scanned:
    return Scanned(*(b"".join(getattr(p, f) for p in parts) for f in ("ids", "names", "marks", "plans")))


@dataclass(frozen=True)
class Sessions:
    """A store's sessions in order of first appearance: `keys` (name hashes), `first` (their first
    exchange's id), `counts`, `marks` ((n, 4) lane sums), and `order`: the ids grouped by session,
    in write order within one, session s's from starts[s] to starts[s + 1]."""

    path: Path
    keys: np.ndarray
    first: np.ndarray
    counts: np.ndarray
    marks: np.ndarray
    order: np.ndarray
    starts: np.ndarray
    plans: np.ndarray | None = None  # (last id + 1, PLAN) uint8: each exchange's `PLAN` bytes by id, where kept

    def plans_of(self, olds: np.ndarray) -> bytes | None:
        """The `PLAN` bytes of these exchanges, in their order (None where the check kept none)."""
        return None if self.plans is None else self.plans[olds].tobytes()

    def __len__(self) -> int:
        return len(self.keys)

    def ids(self, s: int) -> np.ndarray:
        return self.order[self.starts[s]:self.starts[s + 1]]


def sessions(path: Path, scanned: Scanned) -> Sessions:
    """The sessions of one store's scan."""
    ids = np.frombuffer(scanned.ids, dtype="<u8")
    names = np.frombuffer(scanned.names, dtype="V16")
    marks = np.frombuffer(scanned.marks, dtype="<u8").reshape(-1, 4)
    if not len(ids):
        empty = np.zeros(0, dtype=np.int64)
        return Sessions(path, np.zeros(0, dtype="V16"), empty, empty, np.zeros((0, 4), np.uint64), ids, np.zeros(1, np.int64))
    keys, first, inverse = np.unique(names, return_index=True, return_inverse=True)
    rank = np.argsort(first, kind="stable")  # appearance number -> unique index
    at = np.empty_like(rank)
    at[rank] = np.arange(len(rank))
    of = at[inverse.reshape(-1)]  # each exchange's session, numbered by first appearance
    counts = np.bincount(of, minlength=len(rank))
    sums = np.zeros((len(rank), 4), dtype=np.uint64)
    np.add.at(sums, of, marks)
    order = ids[np.argsort(of, kind="stable")]
    plans = None
    if len(scanned.plans) == len(ids) * PLAN:  # 65 bytes an exchange, kept until its copy
        plans = np.zeros((int(ids.max()) + 1, PLAN), dtype=np.uint8)
        plans[ids] = np.frombuffer(scanned.plans, dtype=np.uint8).reshape(-1, PLAN)
    return Sessions(path, keys[rank], ids[first[rank]].astype(np.int64), counts, sums, order,
                    np.concatenate([[0], np.cumsum(counts)]), plans)


def of_rows(path: Path, rows: list[tuple[bytes, tuple[np.ndarray, np.ndarray]]]) -> Sessions:
    """Some sessions of a store from their rows (name hash, (lane sums, ids ascending)), in order
    of first exchange: OUT's sessions that the shards have too, read from its table (`_known`)."""
    rows = sorted(rows, key=lambda r: int(r[1][1][0]))
    counts = np.array([len(ids) for _, (_, ids) in rows], dtype=np.int64)
    return Sessions(path, np.array([k for k, _ in rows], dtype="V16"),
                    np.array([int(ids[0]) for _, (_, ids) in rows], dtype=np.int64), counts,
                    np.array([lanes for _, (lanes, _) in rows], dtype=np.uint64).reshape(-1, 4),
                    np.concatenate([ids for _, (_, ids) in rows]) if rows else np.zeros(0, dtype=np.uint64),
                    np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))


def row(sessions: Sessions, s: int) -> tuple[np.ndarray, np.ndarray]:
    """Session `s`'s lane sums and ids (a row of OUT's table, `_known`)."""
    return sessions.marks[s], sessions.ids(s)


@dataclass(frozen=True)
class Plan:
    """Per shard, which of its sessions it brings (a mask) and, for those OUT holds already, the
    OUT session each is (-1: none); `present`: sessions OUT holds that some shard has too."""

    brings: list[np.ndarray]
    in_out: list[np.ndarray]
    present: int


def plan(out: Sessions, shards: list[Sessions], name_of: Callable[[Sessions, int], str]) -> Plan:
    """Which shard brings each session (the first that has it, unless OUT holds it); a session in
    two stores with different exchanges is refused (ValueError with its message; `name_of` reads
    a session's name back for it)."""
    stores = [out, *shards]
    keys = np.concatenate([s.keys for s in stores])
    src = np.concatenate([np.full(len(s), i, dtype=np.int64) for i, s in enumerate(stores)])
    local = np.concatenate([np.arange(len(s), dtype=np.int64) for s in stores])
    counts = np.concatenate([s.counts for s in stores])
    marks = np.concatenate([s.marks for s in stores]) if keys.size else np.zeros((0, 4), np.uint64)
    by_key = np.argsort(keys, kind="stable")  # within one key: OUT first, then the shards in order
    sk = keys[by_key]
    lead = np.ones(len(sk), dtype=bool)
    lead[1:] = sk[1:] != sk[:-1]
    head = by_key[np.maximum.accumulate(np.where(lead, np.arange(len(sk)), 0))]  # each one's group's first
    first_of = np.empty_like(head)
    first_of[by_key] = head
    differ = (counts != counts[first_of]) | (marks != marks[first_of]).any(axis=1)
    if differ.any():
        bad = int(np.flatnonzero(differ)[np.lexsort((local[differ], src[differ]))[0]])
        theirs = int(first_of[bad])
        where = "the output store" if src[theirs] == 0 else str(stores[src[theirs]].path)
        raise ValueError(f"session {name_of(stores[src[bad]], int(local[bad]))!r} is in {stores[src[bad]].path} and "
                         f"in {where} with different exchanges: session names must be unique across shards (label "
                         "each process's runs differently); nothing was merged")
    own = first_of == np.arange(len(first_of))
    from_out = src[first_of] == 0
    brings, in_out, bounds = [], [], np.cumsum([0, *map(len, stores)])
    for i in range(1, len(stores)):
        part = slice(bounds[i], bounds[i + 1])
        brings.append(own[part])
        in_out.append(np.where(from_out[part], local[first_of[part]], -1))
    present = int(np.unique(first_of[(src != 0) & from_out]).size)
    return Plan(brings, in_out, present)


def batches(shard: Sessions, brings: np.ndarray, most: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(old ids, which sessions) per batch of whole sessions the shard brings, each closed once
    it holds `most` exchanges or more."""
    todo = np.flatnonzero(brings)
    mask = np.repeat(brings, shard.counts)
    ids = shard.order[mask]
    start, size, n = 0, 0, 0
    for c in shard.counts[todo].tolist():
        size += c
        n += 1
        if size >= most:
            yield ids[start:start + size], todo[:n]
            start, size, todo, n = start + size, 0, todo[n:], 0
    if n:
        yield ids[start:start + size], todo[:n]
