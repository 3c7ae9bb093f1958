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

The row is msgpack of `Answered` behind a CRC-32 and a version byte: a row that does not check or
decode to these fields and types is refused by name, never half-used.
"""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from typing import Any

import lmdb
import msgspec

from noisefloor.proxy.store_env import StoreError

VERSION = 1
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
    layout: list[tuple[float, int]] | None  # streamed: (offset_ms, length) per chunk
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
    data = _ENCODER.encode(answered)
    return bytes([VERSION]) + zlib.crc32(data).to_bytes(4, "big") + data


def decode(value: bytes) -> Answered:
    """The row's `Answered`, or ValueError saying what is wrong with it."""
    value = bytes(value)
    if value[:1] != bytes([VERSION]):
        raise ValueError(f"its version is {value[:1].hex() or 'missing'}, not {VERSION:02x}")
    if len(value) < 5 or zlib.crc32(value[5:]) != int.from_bytes(value[1:5], "big"):
        raise ValueError("its CRC does not match its bytes")
    try:
        return _DECODER.decode(value[5:])
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(f"it does not decode as an answered exchange ({exc})") from None


class AnsweredRows:
    """The store's answered-but-unwritten rows (a part of Store): kept before an answer is released,
    deleted by the transaction that writes the exchange in full (`Store.append(done=...)`)."""

    _env: Any
    _write: Any
    _reading: Any
    _record_lock: Any
    _answered: Any
    path: Any
    writable: bool

    def _answered_db(self, create: bool) -> Any:
        db = self._answered
        if db is None:
            try:  # made by the first row: a store never recorded through a proxy has no such table
                db = self._env.open_db(TABLE, create=create and self.writable)
            except lmdb.NotFoundError:
                return None
            self._answered = db
        return db

    def keep_answered(self, answered: Answered) -> int:
        """Commit the row (its own transaction, before the answer is released); returns its number."""
        db = self._answered_db(create=True)
        value = encode(answered)

        def put(txn: lmdb.Transaction) -> int:
            with txn.cursor(db=db) as cur:
                n = _U64.unpack(cur.key())[0] + 1 if cur.last() else 1
            txn.put(_U64.pack(n), value, db=db, append=True)
            return n

        return int(self._write(put))

    def drop_answered(self, txn: lmdb.Transaction, n: int) -> None:
        """Inside the transaction that writes row `n`'s exchange in full."""
        txn.delete(_U64.pack(n), db=self._answered_db(create=False))

    def answered_rows(self) -> list[tuple[int, Answered]]:
        """Every row kept, oldest first; StoreError naming the first that is damaged."""
        db = self._answered_db(create=False)
        if db is None:
            return []
        rows = []
        with self._reading("answered rows"), self._env.begin(db=db) as txn:
            for k, v in txn.cursor():
                n = _U64.unpack(k)[0] if len(k) == 8 else -1
                try:
                    rows.append((n, decode(v)))
                except ValueError as exc:
                    raise StoreError(f"store {self.path}: answered row {n} (an exchange a killed nfproxy did not "
                                     f"finish writing) is damaged: {exc}; restore the store from a copy or record it "
                                     "again") from None
        return rows

    def unfinished(self) -> int:
        """How many answered exchanges a killed recorder left unwritten: its rows, where no live
        recorder holds the store (one that does writes its own at once; this handle's are its own)."""
        db = self._answered_db(create=False)
        if db is None:
            return 0
        with self._reading("answered rows"), self._env.begin(db=db) as txn:
            n = txn.stat(db)["entries"]
        if n == 0 or self._record_lock is not None:
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

    def refuse_unfinished(self, verb: str) -> None:
        """StoreError where a killed recorder left answered exchanges unwritten: `verb` (replay,
        merge, compact) would go on without them."""
        n = self.unfinished()
        if n:
            raise StoreError(f"store {self.path} holds {n} answered exchange{'s' if n != 1 else ''} that a killed "
                             f"nfproxy did not finish writing; run `nfproxy repair --store {self.path}` to write "
                             f"them, then {verb} again")
