"""Answers released before their exchange is written in full: the row that keeps each one until it is.

A recording proxy must not let an answer reach the agent before the store holds it (a proxy
killed with SIGKILL keeps every exchange it answered). Writing the exchange in full (bodies
compressed, the record, its head, the replay entry, the nearest-request sketch and its lookups) is
most of the record path's CPU, and on a fast upstream all of it sits between the answer's arrival
and its release. So the proxy commits this row first (the request's record part and the answer
with every caller secret already erased: what the full write is made from, nothing more), releases
the answer, and writes the exchange in full at once after, deleting the row in the same
transaction. A row still in the store when no recorder holds it is an answered exchange a killed
proxy did not finish: `Recorder` (or `nfproxy repair`) writes it from the row alone.

The row is msgpack of `Answered` behind a CRC-32 and a version byte (JSON where a label or header
holds a lone surrogate, which msgpack cannot carry and a record's JSON keeps): a row that does not
check or decode to these fields and types is refused by name, never half-used.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import zlib
from collections.abc import Callable
from typing import Any

import lmdb
import msgspec

from noisefloor.display import counted
from noisefloor.proxy.store.env import StoreError

VERSION = 1  # msgpack
ESCAPED = 2  # JSON (ASCII, lone surrogates escaped), bodies in base64: a row msgpack cannot carry
TABLE = b"pending"
LOCK = "nfproxy-record.lock"  # held by the recording proxy (`Store.lock_for_recording`)
_U64 = struct.Struct(">Q")


class Answered(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What an exchange's full write is made of, once its answer is complete (secrets erased)."""

    request_json: str  # the request's record fields, a JSON object without "notes" (`exchange_record.request_part`)
    notes: list[str]
    request_digest: str  # sha256 hex of the request body as stored
    request_body: bytes
    provider: str | None  # the provider the request was picked for (its name), None: not recorded as one
    status: int | None  # None: no response (a connection error)
    headers: list[tuple[str, str]]
    body: bytes  # as sent on the wire
    layout: list[tuple[float | None, int]] | None  # streamed: (offset_ms, length) per chunk; None: not recorded
    partial: bool
    error: str | None
    latency_ms: float | None
    end: float
    key: str
    occurrence: int
    seq: int
    started: float
    route: str  # the replay index's route ("METHOD host path")
    deps: tuple[int, ...]
    session: str
    task: str | None
    replicate: str | None
    condition: str | None
    method: str  # the method and URL as recorded (the head's)
    url: str


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Answered)


def encode(answered: Answered) -> bytes:
    try:
        version, data = VERSION, _ENCODER.encode(answered)
    except UnicodeEncodeError:  # a lone surrogate (a label or header byte that is not UTF-8)
        version, data = ESCAPED, json.dumps(msgspec.to_builtins(answered)).encode()
    return bytes([version]) + zlib.crc32(data).to_bytes(4, "big") + data


def decode(value: bytes) -> Answered:
    """The row's `Answered`, or ValueError saying what is wrong with it."""
    value = bytes(value)
    if value[:1] not in (bytes([VERSION]), bytes([ESCAPED])):
        raise ValueError(f"its version is {value[:1].hex() or 'missing'}, not {VERSION:02x} or {ESCAPED:02x}")
    if len(value) < 5 or zlib.crc32(value[5:]) != int.from_bytes(value[1:5], "big"):
        raise ValueError("its CRC does not match its bytes")
    try:
        if value[0] == VERSION:
            return _DECODER.decode(value[5:])
        return msgspec.convert(json.loads(value[5:]), Answered)
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"it does not decode as an answered exchange ({exc})") from None


class AnsweredRows:
    """The store's answered-but-unwritten rows (a part of Store): kept before an answer is released,
    deleted by the transaction that writes the exchange in full (`Store.append(done=...)`).
    `recording`: whether this handle holds the record lock (its rows are then its own)."""

    def __init__(self, tables: Any, recording: Callable[[], bool]) -> None:
        self.tables, self.path, self._recording = tables, tables.path, recording
        self._db: Any = None  # opened on use

    def table(self, create: bool) -> Any:
        """The rows' table, None where there is none (made by the first row: a store never
        recorded through a proxy has no such table)."""
        if self._db is None:
            self._db = self.tables.opened(TABLE.decode(), create=create and self.tables.writable)
        return self._db

    def keep(self, answered: Answered) -> int:
        """Commit the row (its own transaction, before the answer is released); returns its number."""
        db = self.table(create=True)
        value = encode(answered)

        def put(txn: lmdb.Transaction) -> int:
            with txn.cursor(db=db) as cur:
                n = _U64.unpack(cur.key())[0] + 1 if cur.last() else 1
            txn.put(_U64.pack(n), value, db=db, append=True)
            return n

        return int(self.tables.write(put))

    def drop(self, txn: lmdb.Transaction, row: bytes | int) -> None:
        """Inside the transaction that writes the row's exchange in full (or drops a damaged row)."""
        txn.delete(_U64.pack(row) if isinstance(row, int) else row, db=self.table(create=False))

    def rows(self) -> list[tuple[bytes, Answered | ValueError]]:
        """Every row kept, oldest first, as (its key, its `Answered`, or the ValueError saying why
        it is damaged)."""
        db = self.table(create=False)
        if db is None:
            return []
        rows: list[tuple[bytes, Answered | ValueError]] = []
        with self.tables.reading("answered rows"), self.tables.begin(db=db) as txn:
            for k, v in txn.cursor():
                try:
                    if len(k) != 8:
                        raise ValueError(f"its key is {len(k)} bytes, not a row number")
                    rows.append((k, decode(v)))
                except ValueError as exc:
                    rows.append((k, exc))
        return rows

    def drop_damaged(self, key: bytes) -> None:
        self.tables.write(lambda txn: self.drop(txn, key))

    def damaged(self, key: bytes, why: Exception) -> StoreError:
        """The one line for a damaged row, with the two ways on."""
        name = f"row {_U64.unpack(key)[0]}" if len(key) == 8 else f"the row keyed {key[:16].hex()}"
        return StoreError(f"store {self.path}: answered {name} (an exchange a killed nfproxy did not finish writing) "
                          f"is damaged: {why}; `nfproxy repair {self.path} --drop-damaged` writes the others "
                          "and drops it (that exchange is lost), or restore the store from a copy")

    def unfinished(self) -> int:
        """How many answered exchanges a killed recorder left unwritten: its rows, where no live
        recorder holds the store (one that does writes its own at once; this handle's are its own)."""
        db = self.table(create=False)
        if db is None:
            return 0
        with self.tables.reading("answered rows"), self.tables.begin(db=db) as txn:
            n = txn.stat(db)["entries"]
        if n == 0 or self._recording():
            return n
        try:
            fd = os.open(self.path / LOCK, os.O_RDONLY)
        except OSError:
            return n  # no recorder ever locked it
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return 0  # a recorder is live: its rows are being written
        finally:
            os.close(fd)
        return n

    def note(self) -> str | None:
        """A reader's warning where a killed recorder left answered exchanges unwritten (None: none)."""
        n = self.unfinished()
        return None if not n else (f"{unfinished_line(n)} {'are' if n != 1 else 'is'} not included; "
                                   f"`nfproxy repair {self.path}` writes {'them' if n != 1 else 'it'}")

    def refuse(self, verb: str) -> None:
        """StoreError where a killed recorder left answered exchanges unwritten: `verb` (replay,
        merge, compact) would go on without them."""
        n = self.unfinished()
        if n:
            raise StoreError(f"store {self.path} holds {unfinished_line(n)}; run `nfproxy repair {self.path}` "
                             f"to write {'them' if n != 1 else 'it'}, then {verb} again")


def unfinished_line(n: int) -> str:
    return f"{counted(n, 'answered exchange')} that a killed nfproxy did not finish writing"
