"""Merge's copy: a checked shard's sessions written into OUT in batches of whole sessions.

A batch is prepared as OUT will store it (`Batch`): each record copied as stored (its id is its
key, its head's fields are in its head: nothing in its bytes changes; its dictionary goes with
it), else given its id in OUT and encoded with OUT's record dictionary (one stored whole, a
replay record whose source id changes);
the replay entries (with their nearest-request entries) under the
new ids, the bodies taken as the shard stores them. Preparing is most of the work, so for a large shard it is
done by worker processes, a few batches ahead, while the merging process writes the batches in
order, one transaction each (an interrupted merge leaves whole sessions).
"""

from __future__ import annotations

import fcntl
import functools
import json
import multiprocessing
import os
import signal
import struct
import threading
import zlib
from array import array
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec

from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store import _records as store_records
from noisefloor.proxy.store import exchange as exchange_record
from noisefloor.proxy.store import heads as store_heads
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store.log import Store, StoreError
from noisefloor.proxy.store.merge.scan import NO_BODY, PLAN, HeadTail, MergeScan
from noisefloor.proxy.store.merge.shard import Batch, MergeIO
from noisefloor.proxy.store.replay_index import RecordedEntry

LOOKUP_CHUNK = 1 << 16  # lookups read and written at a time (about 1 MB stored, 9 MB as Python rows)
_SAID = 1 << 20  # lookups written between two progress lines
_CHUNK, _END, _FAILED = b"c", b".", b"!"  # what a message from the lookups' process is (its first byte)
PARALLEL_FROM = 20000  # exchanges; fewer are prepared in this process (starting workers costs more)
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
def index_entries(src: Store, olds: list[int], first: int) -> list[tuple[int, RecordedEntry]]:
    """The replay-index entries of exchanges `olds` of `src` (the recorded ones), each with its
    nearest-request entry as the shard holds it (a layout-4 one's computed again from its request:
    `MergeIO.near_again`), under the id it takes in OUT (first, first + 1, ...): OUT writes their
    lookups in its own layout (`Index.put`)."""
    entries = {e.id: e for e in src.index.entries_by_id(olds)}
    recorded = [i for i in olds if i in entries]
    near = dict(zip(recorded, MergeIO(src).near_again(recorded)))
    return [(new_id, replace(entries[old], near=near[old])) for new_id, old in enumerate(olds, first)
            if old in entries]


class Preparer:
    """Batches of one shard made ready for OUT, records encoded with OUT's record dictionary;
    with `bulk`, the replay entries as the shard stores them under their new ids (their lookups
    are copied after the shard's records, `copy_lookups`)."""

    def __init__(self, path: Path, record_dict: bytes | None, bulk: bool = False, bodies: bool = True) -> None:
        self.src = Store.open(path, write=False)
        self.scan = MergeScan(self.src)
        self.bodies = bodies  # False: OUT has them all already (`copy_bodies`): their digests only
        self.bulk = bulk
        self.key = codec.dict_key(record_dict) if record_dict else None
        self.codec = codec.Codec({self.key: record_dict}.get if record_dict and self.key else lambda k: None)

    def record(self, new_id: int, text: bytes, tail: HeadTail | None = None) -> tuple[bytes, store_heads.Row | None]:
        """A record's JSON (an object, with its source id or none) as OUT stores it under `new_id`,
        and its head's row: the shard's checked head (`tail`) tied to the new bytes (the record
        stored without the head's fields, the id among them), or read from the record given its
        new id."""
        if tail is not None:  # the id is in no head's field: only the record's CRC changes
            stored = self.codec.encode(store_records.stripped(text), self.key)
            return stored, (tail[0], tail[1], _U32.pack(zlib.crc32(stored)) + tail[2])
        try:
            whole = store_records.renumbered(text, new_id)
        except msgspec.DecodeError:  # keys msgspec cannot read (a lone surrogate): json's reading
            doc = {k: v for k, v in json.loads(text).items() if k != "id"}
            whole = json.dumps({"id": new_id, **doc}, separators=(",", ":")).encode()
        return store_records.encoded(self.codec, self.key, whole, self.src.records.checked_head(whole, new_id))

    def batch(self, olds: list[int], first: int, plans: bytes | None = None) -> tuple[Batch, list[tuple[int, bytes]]]:
        """Exchanges `olds` as OUT's ids first, first + 1, ...; a replay record (whose source id
        must be mapped to OUT's, which the merging process knows) is left to it: returned with its
        place in the batch, its value empty. `plans`: the check's `PLAN` bytes of each (a record
        it found copied as stored is not decompressed again: its bodies' digests are the check's)."""
        records: list[tuple[bytes, bytes]] = []
        heads: list[Any] = []
        replays: list[tuple[int, bytes]] = []
        digests: set[bytes] = set()
        for k, (text, tail, as_stored) in enumerate(self.scan.copied_records(olds, True, plans)):
            if text is None:
                assert plans is not None
                at, replay = k * PLAN, False
                digests.update(d for d in (plans[at + 1:at + 33], plans[at + 33:at + PLAN]) if d != NO_BODY)
            else:
                named, replay = exchange_record.body_refs(text)
                digests.update(named)
            if as_stored is not None and tail is not None:  # a record stored stripped: its bytes as they are
                value, head = as_stored, (tail[0], tail[1], _U32.pack(zlib.crc32(as_stored)) + tail[2])
            elif replay:
                assert text is not None
                replays.append((k, text))
                value, head = b"", None
            else:
                assert text is not None
                value, head = self.record(first + k, text, tail)
            records.append((_U64.pack(first + k), value))
            heads.append(head)
        wanted = sorted(digests)
        bodies = dict(zip(wanted, self.src.bodies.raw_many(wanted))) if self.bodies else dict.fromkeys(wanted)
        if self.bulk:
            moved = [(_U64.pack(new_id), replay_index.moved_entry(raw))
                     for new_id, raw in enumerate(self.src.index.raw_entries(olds), first) if raw is not None]
            return Batch(records, bodies=bodies, moved=moved, heads=heads), replays
        return Batch(records, index_entries(self.src, olds, first), bodies, heads=heads), replays

    def close(self) -> None:
        self.src.close()


_worker: Preparer | None = None


def _start(path: str, record_dict: bytes | None, bulk: bool, bodies: bool) -> None:
    global _worker
    _worker = Preparer(Path(path), record_dict, bulk, bodies)


def _prepare(olds: bytes, first: int, plans: bytes | None) -> tuple[Batch, list[tuple[int, bytes]]]:
    assert _worker is not None
    return _worker.batch(array("Q", olds).tolist(), first, plans)


def workers(jobs: int, exchanges: int) -> int:
    """How many worker processes to use: none for a small shard, and none in a process running
    threads (Ray's driver), where fork is not safe and spawn would run the caller's script again."""
    return jobs if jobs > 1 and exchanges >= PARALLEL_FROM and threading.active_count() == 1 else 0


def pool(jobs: int, init: Callable[..., None] | None = None, args: tuple[Any, ...] = ()) -> multiprocessing.pool.Pool:
    """Forked workers that leave an interrupt to the merge, which stops them (no traceback of
    theirs; killed by a signal, a worker holding the pool's queue lock would hang the pool's
    stop), and that end with the merge (`_ends_with`), should an interrupt come while the
    pool starts. `init(*args)` runs in each as it starts."""
    with _forking() as interrupted:
        started = multiprocessing.get_context("fork").Pool(jobs, _worker_start, (os.getpid(), init, args))
    if interrupted:
        started.terminate()
        raise KeyboardInterrupt
    return started


@contextmanager
def _forking() -> Iterator[list[int]]:
    """An interrupt held off while processes are forked (noted, and the caller raises it once
    they are: the list is not empty), so that a child never takes one inside Python's after-fork
    steps, with a traceback, before its start says what it does with one."""
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


def _worker_start(parent: int, init: Callable[..., None] | None, args: tuple[Any, ...]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _ends_with(parent)
    if init is not None:
        init(*args)


def _ahead(pool: multiprocessing.pool.Pool, batches: list[array], starts: list[int], jobs: int,
           plans: Callable[[Any], bytes | None]) -> Iterator[tuple[Batch, list[tuple[int, bytes]]]]:
    """The batches prepared by the pool's workers in order, at most `jobs` ahead of the writer."""
    ahead: list[multiprocessing.pool.AsyncResult] = []
    for b, start in zip(batches, starts):
        ahead.append(pool.apply_async(_prepare, (b.tobytes(), start, plans(b))))
        if len(ahead) >= jobs:
            yield ahead.pop(0).get()
    for result in ahead:
        yield result.get()


def copy_lookups(dest: Store, src: Store, new_ids: array, first: int) -> None:
    """The shard's lookups of the exchanges this merge copied (new id `first` or above:
    `new_ids` maps the others to older ids, or 0) into OUT with their ids mapped, in key order (so
    OUT's pages fill in order, not one random page per row), a chunk per transaction (memory does
    not grow with a key's ids); the last one clears the mark `mark_unindexed` set. The rows were
    checked with the shard (`MergeIO.checked_lookups`)."""
    import numpy as np

    mapped = np.frombuffer(new_ids, dtype=np.uint64)
    width = replay_index.LOOKUP_KEY
    append, merging = dest.tables.count("lookups") == 0, MergeIO(dest)
    before = None  # the last key written: a key with more ids than a chunk (a bucket's) goes on in the next
    for key_blob, id_blob in src.index.lookup_chunks(LOOKUP_CHUNK):
        keys = np.frombuffer(key_blob, dtype=f"V{width}")
        ids = mapped[np.frombuffer(id_blob, dtype=">u4")]
        lead = int((keys == before).sum()) if before is not None else 0  # sorted: they come first
        merging.put_lookups(_rows(keys[:lead], ids[:lead], first), _rows(keys[lead:], ids[lead:], first),
                         append=append, last=False)
        before = keys[-1]
    merging.put_lookups([], [], append=append, last=True)


@dataclass(frozen=True)
class Deferred:
    """A shard's lookups left for the refill: its path, old id -> id in OUT, the first id it took."""

    path: Path
    new_ids: array  # old id -> id in OUT (uint64), as `write_shard` was given it
    first: int


def merged_lookups(dest: Store | None, deferred: list[Deferred]) -> Iterator[tuple[Any, Any]]:
    """OUT's own lookups (`dest`; None: it has none) and the deferred shards' (ids mapped, only
    those this merge copied), in key order, ids ascending under each key, a chunk at a time as
    arrays (keys as numbers, ids as 4-byte values: `rows` makes them rows): what the refill
    appends once, in place of copying each shard's into OUT and then OUT's into the refilled file.
    Memory: a chunk of each store at a time (a key's rows whole, 12 bytes each: one key may be
    under every exchange), given out `LOOKUP_CHUNK` rows at a time. The shards' rows were checked
    with the shards (`checked_lookups`)."""
    import numpy as np

    with ExitStack() as stack:
        srcs = [stack.enter_context(Store.open(d.path, write=False)) for d in deferred]
        width = replay_index.LOOKUP_KEY
        streams = [_chunks(dest.index.lookup_chunks(LOOKUP_CHUNK), width, None, 0)] if dest is not None else []
        for d, src in zip(deferred, srcs):
            streams.append(_chunks(src.index.lookup_chunks(LOOKUP_CHUNK), width, np.frombuffer(d.new_ids, dtype=np.uint64),
                                   d.first))
        held = [_Held(s) for s in streams]
        while True:
            for h in held:
                h.fill()
            open_ = [h.keys[-1] for h in held if not h.done]
            if not open_ and not any(len(h.keys) for h in held):
                return
            bound = min(int(k) for k in open_) if open_ else None  # rows before it are all in hand, from every store
            taken = [h.take(bound) for h in held]
            k, v = _in_order(np.concatenate([t[0] for t in taken]), np.concatenate([t[1] for t in taken]))
            v = v.astype(">u4").view("V4")
            for at in range(0, len(k), LOOKUP_CHUNK):  # a key under every exchange: in pieces
                yield k[at:at + LOOKUP_CHUNK], v[at:at + LOOKUP_CHUNK]


def _merged_ahead(deferred: list[Deferred]) -> Iterator[tuple[Any, Any]]:
    """`merged_lookups` of the shards alone, read and merged by a forked process while this one
    writes what it sent before (reading and merging cost more than the writes): its chunks come
    through a pipe as bytes, a chunk ahead (the pipe holds the rest back). A StoreError there is
    raised here as it was, any other end as one line saying so (its traceback, a bug's, on
    stderr); the process is stopped if this one stops reading."""
    import numpy as np

    ctx = multiprocessing.get_context("fork")
    receiving, sending = ctx.Pipe(duplex=False)
    _widened(sending.fileno())
    child = ctx.Process(target=_send_merged, args=(sending, deferred, os.getpid()), daemon=True)
    with _forking() as interrupted:
        child.start()  # forked with OUT open: the child never touches it, and leaves by os._exit
    sending.close()
    try:
        if interrupted:
            raise KeyboardInterrupt
        while True:
            try:
                head = receiving.recv_bytes()
            except EOFError:
                raise StoreError("merging the replay lookups: the process reading them ended without a word; "
                                 "run the same nfproxy merge again (it writes them from OUT's entries)") from None
            kind, n = head[:1], (len(head) - 1) // 12  # a chunk: 8 bytes a key, then 4 an id
            if kind == _END:
                return
            if kind == _FAILED:
                raise StoreError(head[1:].decode(errors="replace"))
            yield (np.frombuffer(head, dtype=np.uint64, count=n, offset=1),
                   np.frombuffer(head, dtype="V4", count=n, offset=1 + 8 * n))
    finally:
        receiving.close()
        child.join(timeout=5)
        if child.is_alive():
            child.terminate()
            child.join()


def _ends_with(parent: int) -> None:
    """This forked process is sent SIGTERM when the merge that forked it (`parent`) ends, however
    it ends (Linux's PR_SET_PDEATHSIG; elsewhere a worker ends when its pipe closes)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the merge ended before the request was made
        os._exit(1)


def _widened(fd: int) -> None:
    """A pipe that holds a whole chunk (12 bytes a row; Linux gives 64 kB): the sender is a chunk
    ahead instead of handing each over in pieces, a wake-up of both processes each."""
    try:
        limit = int(Path("/proc/sys/fs/pipe-max-size").read_text())
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, min(limit, 2 * 12 * LOOKUP_CHUNK))
    except (OSError, ValueError, AttributeError):
        pass  # not Linux, or not allowed: the chunks go in pieces


def _send_merged(sending: Any, deferred: list[Deferred], parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is the merge's to handle: it stops this
    _ends_with(parent)
    try:
        for k, v in merged_lookups(None, deferred):
            sending.send_bytes(_CHUNK + k.tobytes() + v.tobytes())
        sending.send_bytes(_END)
    except StoreError as exc:
        sending.send_bytes(_FAILED + str(exc).encode())
    except (BrokenPipeError, EOFError):
        pass  # the merge stopped reading


def _in_order(keys: Any, ids: Any) -> tuple[Any, Any]:
    """Rows (keys as numbers, uint32 ids) ordered by key, then id: a stable sort by key (a few
    sorted runs, one a store: near linear), then one by (key's rank, id) packed in 64 bits (ten
    times `np.lexsort`'s speed on these)."""
    import numpy as np

    first = np.argsort(keys, kind="stable")
    keys, ids = keys[first], ids[first]
    second = _by_key_then_id(keys, ids)
    return keys[second], ids[second]


def _by_key_then_id(keys: Any, ids: Any) -> Any:
    """The order of rows whose keys are sorted that puts each key's ids ascending: one stable sort
    of (the key's rank, id) packed in 64 bits (ids below 2**32)."""
    import numpy as np

    rank = np.zeros(len(keys), dtype=np.uint64)
    np.cumsum(keys[1:] != keys[:-1], out=rank[1:])
    return np.argsort((rank << np.uint64(32)) | ids.astype(np.uint64), kind="stable")


def rows(chunk: tuple[Any, Any], width: int) -> Iterator[tuple[bytes, bytes]]:
    """A chunk of `merged_lookups` as (key, id) rows: a lazy zip (putmulti takes each row as it
    comes, and zip reuses its tuple)."""
    return zip(_as_keys(chunk[0], width), chunk[1].tolist())


def _rows_of_held(held: list[tuple[Any, Any]], width: int) -> Iterator[Iterator[tuple[bytes, bytes]]]:
    return (rows(c, width) for c in held)


def append_merged_lookups(dest: Store, deferred: list[Deferred], progress: Callable[[str], None],
                          per_txn: int = LOOKUP_CHUNK) -> int:
    """Into an OUT whose every table went in in key order (a fresh OUT, `copy_bodies` first) and
    whose lookups were all deferred: the merged lookups appended to its empty table, about
    `per_txn` rows a transaction (held as arrays, 12 bytes a row, so a transaction retried on a
    full map writes them again; a chunk each, so the process merging them works on the next one
    meanwhile), its mark cleared with the last. Returns how many rows."""
    width, merging = replay_index.LOOKUP_KEY, MergeIO(dest)
    held: list[tuple[Any, Any]] = []
    written = count = 0
    ahead = threading.active_count() == 1  # no fork in a process running threads (as `workers`)
    for chunk in _merged_ahead(deferred) if ahead else merged_lookups(None, deferred):
        held.append(chunk)
        count += len(chunk[0])
        if count >= per_txn:
            written += merging.append_rows("lookups", functools.partial(_rows_of_held, held, width))
            if written // _SAID > (written - count) // _SAID:
                progress(f"{dest.path}: {written} replay lookups written")
            held, count = [], 0
    return written + merging.append_rows("lookups", lambda: (rows(c, width) for c in held), indexed=True)


class _Held:
    """One store's lookups read ahead: a buffer that, unless the store is read to its end, holds
    rows under at least two keys (a key's rows go out together, whichever chunks they span)."""

    def __init__(self, chunks: Iterator[tuple[Any, Any]]) -> None:
        import numpy as np

        self.chunks, self.done = chunks, False
        self.keys, self.ids = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint32)

    def fill(self) -> None:
        import numpy as np

        while not self.done and (not len(self.keys) or self.keys[0] == self.keys[-1]):
            got = next(self.chunks, None)
            if got is None:
                self.done = True
            else:
                self.keys, self.ids = np.concatenate([self.keys, got[0]]), np.concatenate([self.ids, got[1]])

    def take(self, bound: Any) -> tuple[Any, Any]:
        """The rows under keys before `bound` (None: all), out of the buffer."""
        import numpy as np

        cut = len(self.keys) if bound is None else int(np.searchsorted(self.keys, np.uint64(bound), side="left"))
        out = self.keys[:cut], self.ids[:cut]
        self.keys, self.ids = self.keys[cut:], self.ids[cut:]
        return out


def _chunks(blobs: Iterator[tuple[bytes, bytes]], width: int, mapped: Any, first: int) -> Iterator[tuple[Any, Any]]:
    """A store's lookup chunks as (keys as big-endian numbers: their order is the bytes' order,
    ids as uint32): ids mapped through `mapped` and only those `first` or above kept (None: OUT's
    own, as they are); no empty chunk."""
    import numpy as np

    for key_blob, id_blob in blobs:
        keys = _as_numbers(key_blob, width)
        ids = np.frombuffer(id_blob, dtype=">u4").astype(np.uint32)
        if mapped is not None:
            ids = mapped[ids]
            keep = ids >= first
            keys, ids = keys[keep], ids[keep].astype(np.uint32)
        if len(keys):
            yield keys, ids


def _as_numbers(blob: bytes, width: int) -> Any:
    """Keys of `width` <= 8 bytes as uint64 (big-endian, zero-padded in front)."""
    import numpy as np

    padded = np.zeros((len(blob) // width, 8), dtype=np.uint8)
    padded[:, 8 - width:] = np.frombuffer(blob, dtype=np.uint8).reshape(-1, width)
    return padded.view(">u8").ravel().astype(np.uint64)


def _as_keys(numbers: Any, width: int) -> list[bytes]:
    """`_as_numbers` undone: each key's bytes."""
    import numpy as np

    raw = numbers.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - width:]
    return np.ascontiguousarray(raw).view(f"V{width}").ravel().tolist()


def copy_bodies(dest: Store, paths: list[Path], chunk: int = 4096) -> int:
    """A fresh OUT's bodies, every shard's, written once and in key order before any record (a
    k-way merge of the shards' bodies tables, each in key order; a digest two shards hold taken
    from the first), with every dictionary they may be compressed with: instead of inserting each
    batch's bodies at random places and copying them again at the refill. Every value was read
    whole and hashed before OUT was made (`verify_bodies`, which `merge` runs first for a fresh OUT).
    A merge killed while writing leaves bodies that no record names yet: the next merge keeps them
    and writes the records (the old way: OUT is no longer fresh). Returns how many bodies were written."""
    import heapq
    from operator import itemgetter

    with ExitStack() as stack:
        srcs = [stack.enter_context(Store.open(p, write=False)) for p in paths]
        dicts, merging = dest.tables.db["dicts"], MergeIO(dest)
        for src in srcs:
            rows = list(src.tables.rows("dicts"))
            dest.tables.write(lambda txn, rows=rows: [txn.put(k, v, db=dicts, overwrite=False) for k, v in rows])
        merged = heapq.merge(*(src.tables.rows("bodies") for src in srcs), key=itemgetter(0))
        written, last, rows = 0, None, []
        for k, v in merged:
            if k == last:
                continue
            last = k
            rows.append((k, v))
            if len(rows) >= chunk:
                written += merging.append_rows("bodies", functools.partial(list, [rows]))
                rows = []
        return written + (merging.append_rows("bodies", lambda: [rows]) if rows else 0)


def verify_bodies(paths: list[Path]) -> None:
    """Every body of every shard read whole and hashed (`Bodies.get`), the ones no exchange names
    too: a forged one would win its digest in a fresh OUT (the first shard's copy is taken) and the
    other shard's exchanges would read another content. StoreError naming the store and the body."""
    for p in paths:
        with Store.open(p, write=False) as src:
            for k, _ in src.tables.rows("bodies"):
                src.bodies.get(k.hex())


def check_dictionaries(paths: list[Path]) -> None:
    """Each compression dictionary of the stores (OUT's, where it exists, and the shards') stored
    under its key, its zstd id, and each id naming one dictionary across them: values are copied
    as stored, and a frame names its dictionary by that 32-bit id alone, so a shard's value whose
    id OUT (or an earlier shard) holds for another dictionary would be decoded with that one (its
    checksum would then refuse it). StoreError naming the store, the id and the fix."""
    held: dict[bytes, tuple[bytes, Path]] = {}
    for p in paths:
        with Store.open(p, write=False) as src:
            for k, v in src.tables.rows("dicts"):
                data, where = held.setdefault(k, (v, src.path))
                if codec.dict_key(v) != k:
                    raise StoreError(f"store {src.path}: compression dictionary {k.hex()} is not stored under its id "
                                     "(tampered or damaged); restore the store from a copy; nothing was merged")
                if data != v:
                    raise StoreError(f"store {src.path}: compression dictionary {k.hex()} has the id of another "
                                     f"dictionary in {where}; run `nfproxy compact --store {src.path}` (dictionaries "
                                     "trained again, with new ids) and merge again; nothing was merged")


def _rows(keys: Any, ids: Any, first: int) -> list[tuple[bytes, bytes]]:
    """(key, 4-byte id) rows of the ids `first` or above, ids ascending under each key (keys in order)."""

    if not len(keys):
        return []
    order = _by_key_then_id(keys, ids)
    keep = order[ids[order] >= first]
    return list(zip(keys[keep].tolist(), ids[keep].astype(">u4").view("V4").tolist()))


def write_shard(dest: Store, path: Path, batches: list[Any], jobs: int, new_ids: Any,
                moved: Callable[[bytes], bytes], done: Callable[[int, int, int], None],
                plans: Callable[[Any], bytes | None] = lambda olds: None, defer: bool = False,
                bodies_copied: bool = False, sessions: Callable[[int], list[tuple[bytes, bytes]]] | None = None
                ) -> Deferred | None:
    """Write the batches (old ids each) of shard `path` into `dest`, in order (`new_ids`: old id
    -> id in OUT); prepared by `jobs` worker processes when there are enough exchanges. `moved`
    gives a replay record as OUT stores it (its source id mapped, without its id); `done(exchanges,
    bodies, new bodies)` after each batch; `plans(olds)` the check's `PLAN` bytes of a batch. The shard's lookups are
    copied after its records (ids mapped), OUT marked until they are in (`MergeIO.repair_lookups`);
    with `defer`, they are not copied but returned (`Deferred`), for the refill to write once
    with every other shard's (`merged_lookups`), OUT marked until then. `bodies_copied`: OUT holds
    every body of the shard already (`copy_bodies`): the batches carry their digests only.
    `sessions(n)`: batch n's sessions' rows for OUT's sessions table (`_known`), written with it."""
    key = (dest.meta("dicts") or {}).get("record")
    record_dict = dest.dictionaries.dictionary(bytes.fromhex(key)) if key else None
    starts = [dest.last_id() + 1]
    for b in batches:
        starts.append(starts[-1] + len(b))
    with Store.open(path, write=False) as src:  # entries and lookups copied as stored, unless a route row differs
        bulk = dest.index.adopt_routes(src.index)
    merging = MergeIO(dest)
    if bulk and batches:
        merging.mark_unindexed(starts[0])
    jobs = workers(jobs, starts[-1] - starts[0])
    # the workers start before this process opens the shard (a forked child must not inherit it)
    with pool(jobs, _start, (str(path), record_dict, bulk, not bodies_copied)) if jobs else nullcontext() \
            as running:
        # for the replay records, the bodies' dictionaries, a small shard
        local = Preparer(path, record_dict, bulk, not bodies_copied)
        try:
            ready = _ahead(running, batches, starts, jobs, plans) if running is not None else (
                local.batch(b.tolist(), start, plans(b)) for b, start in zip(batches, starts))
            for n, (batch, replays) in enumerate(ready):
                batch.sessions = sessions(n) if sessions is not None else []
                for k, text in replays:
                    packed = batch.records[k][0]
                    value, batch.heads[k] = local.record(_U64.unpack(packed)[0], moved(text))
                    batch.records[k] = (packed, value)
                fresh = merging.absorb(batch, local.src)
                done(len(batch.records), len(batch.bodies), fresh)
            if bulk and batches:
                if defer:
                    return Deferred(path, new_ids, starts[0])
                copy_lookups(dest, local.src, new_ids, starts[0])
        finally:
            local.close()
    return None
