"""The heads table (noisefloor-log/4): each exchange's head (`exchange_record.Head`, what listings
and nfanalyze read) kept beside its record, so that a listing never decompresses records.

A value is small and fixed in shape, so that a million of them cost little beside the records:

    CRC-32 of the exchange's u64 key and the rest | CRC-32 of its record as stored | names id (u32)
    | msgpack [fields the record leaves out (a bit each), time, key (32 bytes), another key, occurrence,
               status, usage ([input, output]), truncated, error, notes]

The strings an exchange shares with the rest of its session (mode, session, method, URL, task,
replicate, condition, model, fingerprint, replay result) are stored once per distinct tuple in
`names` (u32 -> CRC-32 | msgpack array), found again by `name_ids` (a digest of the array -> u32).
The CRC over the key ties a head to its exchange; the record's CRC ties it to the record's bytes.
"""

from __future__ import annotations

import hashlib
import re
import struct
import zlib
from typing import Any

import lmdb
import msgspec

from noisefloor.proxy.exchange_record import NOT_LISTED, Head

_U32 = struct.Struct(">I")
_SEAL = struct.Struct(">III")  # the head's CRC, its record's CRC, its names id
HEAD_AT = _SEAL.size
_HEX_KEY = re.compile(r"[0-9a-f]{64}")
_ENCODE = msgspec.msgpack.Encoder().encode
_STRINGS = 9  # Head's fields before its names (id, time, key, occurrence, status, usage, truncated, error, notes)
Row = tuple[bytes, bytes]  # a head before its names are numbered: (names array, the value less its CRC and id)


class _Stored(msgspec.Struct, array_like=True, gc=False):
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


_STORED = msgspec.msgpack.Decoder(_Stored)
_NAMES = msgspec.msgpack.Decoder(tuple[str, str, str, str, str | None, str | None, str | None, str | None,
                                       str | None, str | None])


def row(head: Head, left_out: int, stored: bytes) -> Row | None:
    """The heads-table row of `head`, whose record is stored as `stored` and leaves out the fields
    `left_out` says (NOT_LISTED: only the full parse can list it); None where msgpack cannot hold a
    string of it (a lone surrogate): its record is read instead."""
    digest = _HEX_KEY.fullmatch(head.key) is not None
    usage: Any = head.usage
    if type(usage) is dict and len(usage) == 2 and _counts(usage.get("input"), usage.get("output")):
        usage = [usage["input"], usage["output"]]
    try:
        names = _ENCODE(msgspec.structs.astuple(head)[_STRINGS:])
        rest = _ENCODE((left_out, head.time, bytes.fromhex(head.key) if digest else b"", None if digest else head.key,
                        head.occurrence, head.status, usage, head.truncated, head.error, head.notes))
    except UnicodeEncodeError:
        return None
    return names, _U32.pack(zlib.crc32(stored)) + rest


def _counts(a: Any, b: Any) -> bool:
    return (a is None or type(a) is int) and (b is None or type(b) is int)


def seal(exchange_key: bytes, names_id: int, part: bytes) -> bytes:
    """The stored value of a row's `part` under its exchange's u64 key, its names numbered `names_id`."""
    rest = part[:4] + _U32.pack(names_id) + part[4:]
    return _U32.pack(zlib.crc32(rest, zlib.crc32(exchange_key))) + rest


def check(exchange_key: bytes, value: bytes | memoryview, stored: bytes | memoryview) -> str | None:
    """What is wrong with a heads-table value beside its record as stored now: None, "head" (its
    CRC does not match: damaged, or another exchange's) or "record" (the record's bytes are not
    those it was written for)."""
    if len(value) < HEAD_AT or _U32.unpack_from(value)[0] != zlib.crc32(value[4:], zlib.crc32(exchange_key)):
        return "head"
    return None if _U32.unpack_from(value, 4)[0] == zlib.crc32(stored) else "record"


def left_out(value: bytes | memoryview) -> int:
    """The fields `log --json` adds to the record of a checked value (NOT_LISTED: parse the record).
    Read without decoding the rest: msgpack's array header, then a positive fixint or a uint32."""
    first = value[HEAD_AT + 1]
    if first < 0x80:
        return first
    return _U32.unpack_from(value, HEAD_AT + 2)[0] if first == 0xCE else _slow_left_out(value)


def _slow_left_out(value: bytes | memoryview) -> int:
    return _STORED.decode(value[HEAD_AT:]).left_out


def read(value: bytes | memoryview, exchange_id: int, names: dict[int, tuple[Any, ...]]) -> Head:
    """A checked value (`check`) as a Head; ValueError saying what is wrong with its shape, types or names."""
    try:
        s = _STORED.decode(value[HEAD_AT:])
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(str(exc)) from None
    shared = names.get(_U32.unpack_from(value, 8)[0])
    if shared is None:
        raise ValueError("its names are not in the names table")
    usage = s.usage
    return Head(exchange_id, s.time, s.key.hex() if s.other_key is None else s.other_key, s.occurrence, s.status,
                {"input": usage[0], "output": usage[1]} if type(usage) is list and len(usage) == 2 else usage,
                s.truncated, s.error, s.notes, *shared)


def read_names(items: Any) -> dict[int, tuple[Any, ...]]:
    """The names table's (u32 key, value) items, decoded; ValueError naming a damaged one."""
    out = {}
    for k, v in items:
        if len(v) < 4 or _U32.unpack_from(v)[0] != zlib.crc32(v[4:], zlib.crc32(k)):
            raise ValueError(f"names entry {_U32.unpack(bytes(k))[0]} is damaged (its checksum does not match)")
        try:
            out[_U32.unpack(bytes(k))[0]] = _NAMES.decode(v[4:])
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise ValueError(f"names entry {_U32.unpack(bytes(k))[0]} is damaged ({exc})") from None
    return out


class Names:
    """Numbers a writer's names arrays in a store's `names` / `name_ids` tables, remembering those
    committed (`settle` after each transaction: numbers given in one that was undone are forgotten)."""

    _CACHED = 1 << 16

    def __init__(self, names_db: Any, ids_db: Any) -> None:
        self._names, self._ids = names_db, ids_db
        self._known: dict[bytes, int] = {}
        self._pending: dict[bytes, int] = {}
        self._next: int | None = None

    def id_of(self, txn: lmdb.Transaction, names: bytes) -> int:
        found = self._known.get(names) or self._pending.get(names)
        if found:
            return found
        digest = hashlib.blake2b(names, digest_size=16).digest()
        value = txn.get(digest, db=self._ids)
        if value is not None:
            found = _U32.unpack(value)[0]
        else:
            if self._next is None:
                with txn.cursor(db=self._names) as cur:
                    self._next = _U32.unpack(cur.key())[0] + 1 if cur.last() else 1
            found, self._next = self._next, self._next + 1
            packed = _U32.pack(found)
            txn.put(packed, _U32.pack(zlib.crc32(names, zlib.crc32(packed))) + names, db=self._names, append=True)
            txn.put(digest, packed, db=self._ids)
        self._pending[names] = found
        return found

    def sealed(self, txn: lmdb.Transaction, exchange_key: bytes, r: Row | None) -> bytes:
        """The heads-table value of row `r` (empty for None: the record is read instead)."""
        return b"" if r is None else seal(exchange_key, self.id_of(txn, r[0]), r[1])

    def settle(self, committed: bool) -> None:
        if committed:
            if len(self._known) + len(self._pending) > self._CACHED:
                self._known.clear()
            self._known.update(self._pending)
        else:
            self._next = None
        self._pending.clear()


__all__ = ["NOT_LISTED", "Names", "Row", "check", "left_out", "read", "read_names", "row", "seal"]
