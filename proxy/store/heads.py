"""The heads table: each exchange's head (`exchange_record.Head`, what listings
and nfanalyze read) kept beside its record, so that a listing never decompresses records.

A value is small and fixed in shape, so that a million of them cost little beside the records:

    CRC-32 of the exchange's u64 key and the rest | CRC-32 of its record as stored
    | msgpack [labels id, route id, fields the record leaves out (a bit each), time, key (32 bytes),
               another key, occurrence, status, usage ([input, output]), truncated, error, notes]

The strings an exchange shares with others are numbered: its labels (session, task, replicate,
condition: shared with its session) in `labels`, its route (mode, method, URL, model, fingerprint,
replay result: shared with most of the store) in `routes`, each u32 -> CRC-32 | msgpack array. A
writer remembers the numbers it gave (a set it does not remember is numbered again: a duplicate
costs bytes, never meaning). The CRC over the key ties a head to its exchange; the record's CRC
ties it to the record's bytes.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Sequence
from itertools import islice
from operator import attrgetter
from typing import Any

import lmdb
import msgspec

from noisefloor.proxy.store.exchange import NOT_LISTED, Head

_U32 = struct.Struct(">I")
HEAD_AT = 8  # after the two CRCs
HEX_KEY = re.compile(r"[0-9a-f]{64}")  # a sha256 in hex: a request key, a body digest
_ENCODE = msgspec.msgpack.Encoder().encode
# the fields a head shares with other exchanges, each set stored once: its labels, then its route
_LABEL_FIELDS = ("session", "task", "replicate", "condition")
_ROUTE_FIELDS = ("mode", "method", "url", "model", "fingerprint", "replay_result")
_LABELS, _ROUTE = attrgetter(*_LABEL_FIELDS), attrgetter(*_ROUTE_FIELDS)
# `head` passes a set's strings to Head in its field order (by keyword it costs twice as much, on
# every head a listing reads): a Head whose fields no longer end with the sets' fields stops the import
if Head.__struct_fields__[-len(_LABEL_FIELDS + _ROUTE_FIELDS):] != _LABEL_FIELDS + _ROUTE_FIELDS:
    raise ImportError("exchange.Head's last fields are not the heads table's labels and route, in order")
Row = tuple[bytes, bytes, bytes]  # a head before its sets are numbered: (labels, route, the value less CRC and ids)


class Stored(msgspec.Struct, array_like=True, gc=False):
    """A head as the heads table keeps it: its labels and route by number, then its own fields."""

    labels: int
    route: int
    left_out: int
    time: float
    key: bytes  # a digest's 32 bytes (b"": `other_key`)
    other_key: str | None  # a key that is not a lowercase sha256 hex digest (a damaged or foreign record's)
    occurrence: int
    status: int | None
    usage: list[int | None] | dict[str, Any] | None
    truncated: bool | None
    error: str | None
    notes: list[str]


_STORED = msgspec.msgpack.Decoder(Stored)
_ARRAY = bytes([0x90 | len(Stored.__struct_fields__)])  # msgpack's header of an array of its fields
_OPT = str | None
SETS: dict[str, msgspec.msgpack.Decoder[Any]] = {"labels": msgspec.msgpack.Decoder(tuple[str, _OPT, _OPT, _OPT]),
        "routes": msgspec.msgpack.Decoder(tuple[str, str, str, _OPT, _OPT, _OPT])}


def row(head: Head, left_out: int, stored: bytes) -> Row | None:
    """The heads-table row of `head`, whose record is stored as `stored` and leaves out the fields
    `left_out` says (NOT_LISTED: only the full parse can list it); None where msgpack cannot hold a
    string of it (a lone surrogate): its record is read instead."""
    digest = HEX_KEY.fullmatch(head.key) is not None
    usage: Any = head.usage
    if type(usage) is dict and len(usage) == 2 and _counts(usage.get("input"), usage.get("output")):
        usage = [usage["input"], usage["output"]]
    try:
        labels, route = _ENCODE(_LABELS(head)), _ENCODE(_ROUTE(head))
        rest = _ENCODE((left_out, head.time, bytes.fromhex(head.key) if digest else b"", None if digest else head.key,
                        head.occurrence, head.status, usage, head.truncated, head.error, head.notes))
    except UnicodeEncodeError:
        return None
    return labels, route, _U32.pack(zlib.crc32(stored)) + rest[1:]  # rest's array header: written by `seal`


def _counts(a: Any, b: Any) -> bool:
    return (a is None or type(a) is int) and (b is None or type(b) is int)


def seal(exchange_key: bytes, labels: int, route: int, part: bytes) -> bytes:
    """The stored value of a row's `part` under its exchange's u64 key, its sets numbered."""
    rest = part[:4] + _ARRAY + _ENCODE(labels) + _ENCODE(route) + part[4:]
    return _U32.pack(zlib.crc32(rest, zlib.crc32(exchange_key))) + rest


def check(exchange_key: bytes, value: bytes | memoryview, stored: bytes | memoryview) -> str | None:
    """What is wrong with a heads-table value beside its record as stored now: None, "head" (its
    CRC does not match: damaged, or another exchange's) or "record" (the record's bytes are not
    those it was written for)."""
    if len(value) < HEAD_AT or _U32.unpack_from(value)[0] != zlib.crc32(value[4:], zlib.crc32(exchange_key)):
        return "head"
    return None if _U32.unpack_from(value, 4)[0] == zlib.crc32(stored) else "record"


def left_out(value: bytes | memoryview) -> int:
    """The fields `log --json` adds to the record of a checked value (NOT_LISTED: parse the record)."""
    return _STORED.decode(value[HEAD_AT:]).left_out


Parts = tuple[Stored, tuple[Any, ...], tuple[Any, ...]]  # a head, its labels and its route


def parts(value: bytes | memoryview, labels: dict[int, tuple[Any, ...]], routes: dict[int, tuple[Any, ...]]) -> Parts:
    """A checked value (`check`), its sets looked up (the same tuple objects for every head that
    shares them); ValueError saying what is wrong with its shape, types or sets."""
    try:
        s = _STORED.decode(value[HEAD_AT:])
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(str(exc)) from None
    shared, route = labels.get(s.labels), routes.get(s.route)
    if shared is None or route is None:
        raise ValueError(f"its {'labels' if shared is None else 'route'} are not in the store")
    return s, shared, route


def parts_many(values: Sequence[bytes], labels: dict[int, tuple[Any, ...]],
               routes: dict[int, tuple[Any, ...]]) -> list[Parts] | None:
    """`parts` of each of a batch of checked values; None where any of them is not what `parts`
    takes (see `stored_many`): read those one at a time."""
    stored = stored_many(values, labels, routes)
    return None if stored is None else [(s, labels[s.labels], routes[s.route]) for s in stored]


def stored_many(values: Sequence[bytes], labels: dict[int, tuple[Any, ...]],
                routes: dict[int, tuple[Any, ...]]) -> list[Stored] | None:
    """A batch of checked values decoded as `parts` decodes them (every field's type checked), for
    a reader that counts heads by their sets' numbers instead of building each head's parts; None
    where any of them is not what `parts` takes (empty, not a head's shape, or a set the store
    lacks): read those one at a time."""
    decode = _STORED.decode
    try:
        stored = [decode(v[HEAD_AT:]) for v in values]
    except msgspec.MsgspecError:
        return None
    if labels.keys() >= set(map(_LABELS_ID, stored)) and routes.keys() >= set(map(_ROUTE_ID, stored)):
        return stored
    return None


_LABELS_ID, _ROUTE_ID = attrgetter("labels"), attrgetter("route")


def parts_of(head: Head) -> Parts:
    """A head read from its record, as the heads table's parts (its sets not numbered)."""
    digest = HEX_KEY.fullmatch(head.key) is not None
    return (Stored(0, 0, NOT_LISTED, head.time, bytes.fromhex(head.key) if digest else b"", None if digest else head.key,
                   head.occurrence, head.status, head.usage, head.truncated, head.error, head.notes),
            _LABELS(head), _ROUTE(head))


def head(exchange_id: int, p: Parts) -> Head:
    s, shared, route = p
    usage = s.usage
    session, task, replicate, condition = shared
    mode, method, url, model, fingerprint, replay_result = route
    return Head(exchange_id, s.time, s.key.hex() if s.other_key is None else s.other_key, s.occurrence, s.status,
                usage_dict(usage), s.truncated, s.error, s.notes, session, task, replicate, condition,
                mode, method, url, model, fingerprint, replay_result)


def usage_dict(usage: Any) -> dict[str, Any] | None:
    """A head's usage as the record has it (the table keeps the usual shape as [input, output])."""
    return {"input": usage[0], "output": usage[1]} if type(usage) is list and len(usage) == 2 else usage


def read_sets(kind: str, items: Any) -> dict[int, tuple[Any, ...]]:
    """A `labels` or `routes` table's (u32 key, value) items, decoded; ValueError naming a damaged
    one (the first in key order). A set per session: checked and decoded in comprehensions, 4096
    at a time, and a chunk read again one at a time only where one of it fails."""
    out: dict[int, tuple[Any, ...]] = {}
    crc, u32, decode, items = zlib.crc32, _U32.unpack_from, SETS[kind].decode, iter(items)
    while rows := [(bytes(k), bytes(v)) for k, v in islice(items, 4096)]:
        if not [k for k, v in rows if len(k) != 4 or len(v) < 4 or u32(v)[0] != crc(v[4:], crc(k))]:
            try:
                out.update(zip(struct.unpack(f">{len(rows)}I", b"".join(k for k, _ in rows)),
                               [decode(v[4:]) for _, v in rows]))
                continue
            except (msgspec.ValidationError, msgspec.DecodeError):
                pass
        out.update(_read_sets_one_by_one(kind, rows))  # raises: the chunks before it were whole
    return out


def _read_sets_one_by_one(kind: str, items: Any) -> dict[int, tuple[Any, ...]]:
    out, decode = {}, SETS[kind].decode
    for k, v in items:
        n = _U32.unpack(bytes(k))[0]
        if len(v) < 4 or _U32.unpack_from(v)[0] != zlib.crc32(v[4:], zlib.crc32(k)):
            raise ValueError(f"{kind} entry {n} is damaged (its checksum does not match)")
        try:
            out[n] = decode(v[4:])
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise ValueError(f"{kind} entry {n} is damaged ({exc})") from None
    return out


class Sets:
    """Numbers a writer's labels and routes in a store's `labels` / `routes` tables, remembering
    the numbers committed (`settle` after each transaction: those of one undone are forgotten)."""

    _CACHED = 1 << 16

    def __init__(self, labels_db: Any, routes_db: Any) -> None:
        self._dbs = (labels_db, routes_db)
        self._known: tuple[dict[bytes, int], dict[bytes, int]] = ({}, {})
        self._pending: list[tuple[int, bytes, int]] = []

    def _id_of(self, txn: lmdb.Transaction, kind: int, packed: bytes) -> int:
        found = self._known[kind].get(packed)
        if found is not None:
            return found
        db = self._dbs[kind]
        with txn.cursor(db=db) as cur:
            found = _U32.unpack(cur.key())[0] + 1 if cur.last() else 1
        key = _U32.pack(found)
        txn.put(key, _U32.pack(zlib.crc32(packed, zlib.crc32(key))) + packed, db=db, append=True)
        self._known[kind][packed] = found  # taken back by `settle(False)`
        self._pending.append((kind, packed, found))
        return found

    def sealed(self, txn: lmdb.Transaction, exchange_key: bytes, r: Row | None) -> bytes:
        """The heads-table value of row `r` (empty for None: the record is read instead)."""
        if r is None:
            return b""
        return seal(exchange_key, self._id_of(txn, 0, r[0]), self._id_of(txn, 1, r[1]), r[2])

    def settle(self, committed: bool) -> None:
        if not committed:
            for kind, packed, _ in self._pending:
                self._known[kind].pop(packed, None)
        self._pending.clear()
        for known in self._known:
            if len(known) > self._CACHED:
                known.clear()


__all__ = ["NOT_LISTED", "Parts", "Row", "Sets", "Stored", "check", "head", "left_out", "parts", "parts_many",
           "parts_of", "read_sets", "row", "seal", "stored_many", "usage_dict"]
