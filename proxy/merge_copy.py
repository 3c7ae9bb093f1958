"""Merge's copy: a checked shard's sessions written into OUT in batches of whole sessions.

A batch is prepared as OUT will store it (`Batch`): each record given its id in OUT and encoded
with OUT's record dictionary, the replay entries (with their nearest-request entries) under the
new ids, the bodies taken as the shard stores them. Preparing is most of the work, so for a large shard it is
done by worker processes, a few batches ahead, while the merging process writes the batches in
order, one transaction each (an interrupted merge leaves whole sessions).
"""

from __future__ import annotations

import multiprocessing
import re
import struct
import threading
from array import array
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

from noisefloor.proxy import codec, replay_index, store_heads
from noisefloor.proxy.replay_index import RecordedEntry
from noisefloor.proxy.store import Store
from noisefloor.proxy.store_merge import Batch

PARALLEL_FROM = 20000  # exchanges; fewer are prepared in this process (starting workers costs more)
_U64 = struct.Struct(">Q")
_BODY = re.compile(rb'"body": ?"([0-9a-f]{64})"')
_ID_PREFIX = re.compile(rb'^\{"id": ?\d+, ?')


def index_entries(src: Store, olds: list[int], first: int) -> list[tuple[int, RecordedEntry]]:
    """The replay-index entries of exchanges `olds` of `src` (the recorded ones), each with its
    nearest-request entry as the shard holds it, under the id it takes in OUT (first, first + 1,
    ...): OUT writes their lookups in its own layout (`Store._put_index`)."""
    entries = {e.id: e for e in src.recorded_entries_by_id(olds)}
    recorded = [i for i in olds if i in entries]
    near = dict(zip(recorded, replay_index.stored_near(src, recorded)))
    return [(new_id, replace(entries[old], near=near[old])) for new_id, old in enumerate(olds, first)
            if old in entries]


class Preparer:
    """Batches of one shard made ready for OUT, records encoded with OUT's record dictionary."""

    def __init__(self, path: Path, record_dict: bytes | None) -> None:
        self.src = Store.open(path, write=False)
        self.key = codec.dict_key(record_dict) if record_dict else None
        self.codec = codec.Codec({self.key: record_dict}.get if record_dict and self.key else lambda k: None)

    def record(self, new_id: int, text: bytes) -> tuple[bytes, store_heads.Row | None]:
        """A record's JSON (an object without "id") as OUT stores it under `new_id`, and its head's row."""
        doc = b'{"id":%d,%s' % (new_id, text[1:])
        stored = self.codec.encode(doc, self.key)
        return stored, self.src.head_row(doc, stored, new_id)

    def batch(self, olds: list[int], first: int) -> tuple[Batch, list[tuple[int, bytes]]]:
        """Exchanges `olds` as OUT's ids first, first + 1, ...; a replay record (whose source id
        must be mapped to OUT's, which the merging process knows) is left to it: returned with its
        place in the batch, its value empty."""
        records, heads, replays, digests = [], [], [], set()
        for k, text in enumerate(self.src.record_texts_of(olds)):
            digests.update(_BODY.findall(text))
            if b'"replay": {' in text or b'"replay":{' in text:
                replays.append((k, text))
                value, head = b"", None
            else:
                value, head = self.record(first + k, b"{" + _ID_PREFIX.sub(b"", text, 1))
            records.append((_U64.pack(first + k), value))
            heads.append(head)
        wanted = sorted(d.decode() for d in digests)
        entries = index_entries(self.src, olds, first)
        return Batch(records, entries, dict(zip(wanted, self.src.raw_bodies(wanted))), heads), replays

    def close(self) -> None:
        self.src.close()


_worker: Preparer | None = None


def _start(path: str, record_dict: bytes | None) -> None:
    global _worker
    _worker = Preparer(Path(path), record_dict)


def _prepare(olds: bytes, first: int) -> tuple[Batch, list[tuple[int, bytes]]]:
    assert _worker is not None
    return _worker.batch(array("Q", olds).tolist(), first)


def workers(jobs: int, exchanges: int) -> int:
    """How many worker processes to use: none for a small shard, and none in a process running
    threads (Ray's driver), where fork is not safe and spawn would run the caller's script again."""
    return jobs if jobs > 1 and exchanges >= PARALLEL_FROM and threading.active_count() == 1 else 0


def pool(jobs: int, *init: Any) -> multiprocessing.pool.Pool:
    return multiprocessing.get_context("fork").Pool(jobs, *init)


def _ahead(pool: multiprocessing.pool.Pool, batches: list[array], starts: list[int],
           jobs: int) -> Iterator[tuple[Batch, list[tuple[int, bytes]]]]:
    """The batches prepared by the pool's workers in order, at most `jobs` ahead of the writer."""
    ahead: list[multiprocessing.pool.AsyncResult] = []
    for b, start in zip(batches, starts):
        ahead.append(pool.apply_async(_prepare, (b.tobytes(), start)))
        if len(ahead) >= jobs:
            yield ahead.pop(0).get()
    for result in ahead:
        yield result.get()


def write_shard(dest: Store, path: Path, batches: list[array], jobs: int,
                moved: Callable[[bytes], bytes], done: Callable[[int, int, int], None]) -> None:
    """Write the batches (old ids each) of shard `path` into `dest`, in order; prepared by `jobs`
    worker processes when there are enough exchanges. `moved` gives a replay record as OUT stores
    it (its source id mapped, without its id); `done(exchanges, bodies, new bodies)` after each batch."""
    key = (dest.meta("dicts") or {}).get("record")
    record_dict = dest.dictionary(bytes.fromhex(key)) if key else None
    starts = [dest.last_id() + 1]
    for b in batches:
        starts.append(starts[-1] + len(b))
    jobs = workers(jobs, starts[-1] - starts[0])
    # the workers start before this process opens the shard (a forked child must not inherit it)
    with pool(jobs, _start, (str(path), record_dict)) if jobs else nullcontext() as running:
        local = Preparer(path, record_dict)  # for the replay records, the bodies' dictionaries, a small shard
        try:
            ready = _ahead(running, batches, starts, jobs) if running is not None else (
                local.batch(b.tolist(), start) for b, start in zip(batches, starts))
            for batch, replays in ready:
                for k, text in replays:
                    packed = batch.records[k][0]
                    value, batch.heads[k] = local.record(_U64.unpack(packed)[0], moved(text))
                    batch.records[k] = (packed, value)
                fresh = dest.absorb(batch, local.src)
                done(len(batch.records), len(batch.bodies), fresh)
        finally:
            local.close()
