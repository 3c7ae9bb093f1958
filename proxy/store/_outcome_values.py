"""How the outcomes table keeps a graded row: under its key, the JSON of (condition, task,
replicate), and as its value the row without the three fields its key already holds.

A row whose first three fields are task_id, condition and replicate, in that order (every row
nfverify and nfladder write), is kept as `KEYED` and the JSON of its other fields (a study's row
shrinks from ~80 bytes to ~15); read back, the three are put first again from the key, so the row
and its JSON text are exactly those `json.dumps` wrote whole. Any other row is kept whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from itertools import islice
from typing import Any

import msgspec

from noisefloor.outcome_rows import row_key
from noisefloor.proxy.store._tables import Tables

KEYED = b"\x01"  # a value without its key's fields (JSON text never starts with this byte)
_LEAD = ("task_id", "condition", "replicate")


def key(row: Mapping[str, Any]) -> bytes:
    """A row's key: (condition, task, replicate) as JSON (merge looks rows up by it)."""
    return json.dumps(row_key(row)).encode()


def value(row: Mapping[str, Any]) -> bytes:
    """A row as the table keeps it: without its key's fields where it leads with them."""
    whole = dict(row)
    if tuple(islice(whole, 3)) == _LEAD:
        return KEYED + json.dumps({k: v for k, v in whole.items() if k not in _LEAD}).encode()
    return json.dumps(whole).encode()


def text(stored_key: bytes, stored: bytes) -> bytes:
    """The row's JSON text, as `json.dumps` wrote the whole row; ValueError for a keyed value whose
    key is not a (condition, task, replicate) array."""
    if stored[:1] != KEYED:
        return stored
    lead = json.loads(stored_key)
    if not isinstance(lead, list) or len(lead) != 3:
        raise ValueError("an outcome row's key is not (condition, task, replicate)")
    condition, task, replicate = (json.dumps(v) for v in lead)
    rest = stored[1:]
    if rest[:1] != b"{" or rest[-1:] != b"}":
        raise ValueError("an outcome row's value is not a JSON object")
    head = f'{{"task_id": {task}, "condition": {condition}, "replicate": {replicate}'.encode()
    return head + (b"}" if rest == b"{}" else b", " + rest[1:])


def row(stored_key: bytes, stored: bytes) -> Any:
    """A stored row: msgspec's decoder (a study's rows number one per graded attempt), or json's
    for what msgspec refuses and json reads (NaN, a lone surrogate)."""
    whole = text(stored_key, stored)
    try:
        return msgspec.json.decode(whole)
    except msgspec.DecodeError:
        return json.loads(whole)


class Outcomes:
    """The outcomes table (a part of Store): graded rows put, read, and streamed as stored (merge)."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables

    def put(self, rows: list[Mapping[str, Any]]) -> None:
        """Graded rows, one per (condition, task, replicate); grading again replaces a row."""
        db = self.tables.db["outcomes"]
        self.tables.write(lambda txn: [txn.put(key(r), value(r), db=db) for r in rows])

    def rows(self) -> list[dict[str, Any]]:
        with self.tables.reading("outcome rows"):
            return [row(k, v) for k, v in self._stored()]

    def texts(self, size: int = 10_000) -> Iterator[list[bytes]]:
        """The stored rows' texts in key order (`rows`' order), `size` at a time, in one read: a
        reader holds one list of them, not a study's rows."""
        with self.tables.reading("outcome rows"):
            items = self._stored()
            while chunk := list(islice(items, size)):
                yield [text(k, v) for k, v in chunk]

    def items(self) -> Iterator[tuple[bytes, bytes, Any]]:
        """Every row as (its key and value as stored, the row read from them), one at a time (merge streams them)."""
        with self.tables.reading("outcome rows"):
            for k, v in self._stored():
                yield k, v, row(k, v)

    def _stored(self) -> Iterator[tuple[bytes, bytes]]:
        db = self.tables.db["outcomes"]
        if db is not None:
            with self.tables.begin(db=db, buffers=False) as txn:
                yield from txn.cursor()

    @contextmanager
    def rows_of(self) -> Iterator[Callable[[bytes], Any]]:
        """The row stored under a key (`key`), or None, looked up in one read transaction for as
        many keys as the caller asks (merge's check: one per shard row)."""
        db = self.tables.db["outcomes"]
        if db is None:
            yield lambda k: None
            return
        with self.tables.reading("outcome rows"), self.tables.begin(db=db, buffers=False) as txn:
            def row_of(k: bytes) -> Any:
                v = txn.get(k)
                return None if v is None else row(k, v)

            yield row_of

    def add(self, items: list[tuple[bytes, bytes]]) -> int:
        """Rows (key, value as stored) this store does not hold yet; returns how many were new."""
        db = self.tables.db["outcomes"]
        return int(self.tables.write(lambda txn: sum(1 for k, v in items if txn.put(k, v, db=db, overwrite=False)))) \
            if items else 0
