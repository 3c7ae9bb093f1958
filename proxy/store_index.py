"""The store's replay-index tables read: the `recorded` entries and the `rindex` lookup rows
(`replay_index.py` owns their layout and what replay asks of them)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import lmdb

from noisefloor.proxy import replay_index
from noisefloor.proxy.replay_index import RecordedEntry

_U64 = struct.Struct(">Q")


class IndexLookups:
    """Reads of the `recorded` and `rindex` tables (a part of Store)."""

    _env: Any
    _recorded: Any
    _rindex: Any
    _reading: Any
    meta: Any

    def recorded_entries(self) -> Iterator[RecordedEntry]:
        with self._reading("replay index"), self._env.begin(db=self._recorded) as txn:
            for _, raw in txn.cursor():
                yield replay_index.entry(raw)

    def has_replay_index(self) -> bool:
        """Whether every recorded exchange has its lookup rows (stores made since they exist)."""
        return self._rindex is not None and self.meta("replay_index") == replay_index.VERSION

    def recorded_count(self) -> int:
        with self._reading(), self._env.begin(db=self._recorded) as txn:
            return txn.stat(self._recorded)["entries"]

    def recorded_entry(self, exchange_id: int) -> RecordedEntry | None:
        with self._reading(), self._env.begin(db=self._recorded) as txn:
            raw = txn.get(_U64.pack(exchange_id))
            return None if raw is None else replay_index.entry(raw)

    def index_scan(self, prefix: bytes, *, newest: int | None = None, oldest: int | None = None) -> list[bytes]:
        """The index keys under `prefix` (their suffixes), oldest first; with `newest` (`oldest`),
        only the last (first) that many."""
        out: list[bytes] = []
        with self._reading(), self._env.begin(db=self._rindex, buffers=False) as txn, txn.cursor() as cur:
            if newest is None:
                if cur.set_range(prefix):
                    for k in cur.iternext(values=False):
                        if not k.startswith(prefix) or (oldest is not None and len(out) >= oldest):
                            break
                        out.append(k[len(prefix):])
                return out
            out = _newest_under(cur, prefix, newest)
        return out[::-1]

    def index_scan_newest(self, prefixes: list[bytes], newest: int) -> list[list[bytes]]:
        """`index_scan(prefix, newest=n)` for several prefixes in one read transaction."""
        out = []
        with self._reading(), self._env.begin(db=self._rindex, buffers=False) as txn, txn.cursor() as cur:
            for prefix in prefixes:
                out.append(_newest_under(cur, prefix, newest))
        return out

    def index_distinct(self, prefix: bytes, width: int) -> list[bytes]:
        """The distinct `width` bytes that follow `prefix` in index keys: one seek each."""
        found: list[bytes] = []
        if self._rindex is None:
            return found
        with self._reading(), self._env.begin(db=self._rindex, buffers=False) as txn, txn.cursor() as cur:
            at: bytes | None = prefix
            while at is not None and cur.set_range(at):
                k = cur.key()
                if not k.startswith(prefix) or len(k) < len(prefix) + width:
                    break
                found.append(k[len(prefix):len(prefix) + width])
                at = replay_index.after(k[:len(prefix) + width])
        return found

    def index_get_many(self, keys: list[bytes]) -> list[bytes | None]:
        with self._reading(), self._env.begin(db=self._rindex, buffers=False) as txn:
            return [txn.get(k) for k in keys]

    def latest_recorded_ids(self, n: int) -> list[int]:
        """The ids of the last `n` recorded exchanges, newest first."""
        out: list[int] = []
        with self._reading(), self._env.begin(db=self._recorded) as txn, txn.cursor() as cur:
            more = cur.last()
            while more and len(out) < n:
                out.append(_U64.unpack(cur.key())[0])
                more = cur.prev()
        return out

    def recorded_entries_by_id(self, ids: list[int]) -> list[RecordedEntry]:
        with self._reading(), self._env.begin(db=self._recorded) as txn:
            out = []
            for i in ids:
                raw = txn.get(_U64.pack(i))
                if raw is not None:
                    out.append(replay_index.entry(raw))
            return out


def _newest_under(cur: lmdb.Cursor, prefix: bytes, newest: int) -> list[bytes]:
    """The last `newest` keys under `prefix` (newest first), with the prefix cut off."""
    found: list[bytes] = []
    end = replay_index.after(prefix)
    more = cur.prev() if end is not None and cur.set_range(end) else cur.last()
    while more and len(found) < newest:
        k = cur.key()
        if not k.startswith(prefix):
            break
        found.append(k[len(prefix):])
        more = cur.prev()
    return found
