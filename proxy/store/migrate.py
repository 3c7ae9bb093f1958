"""`nfproxy migrate`: a store of an earlier format brought to today's (`env.FORMAT`).

The one place that knows the earlier formats. They differ from today's in five ways, each
converted by one step over the old store's tables as written, into a new environment beside it:

  values     format 1 kept zstd frames untagged: tagged as today's frames; formats 6 and 7 kept a
             body behind a CRC-32 of its bytes (tag 4): checked and unwrapped; before format 8 a
             frame compressed with a dictionary (tag 2) carried the first 8 bytes of the
             dictionary's sha256, the key of the `dicts` table: dropped, the table keyed by
             zstd's dictionary id, which its frames name already (`_Values`)
  records    before format 5 a record was kept whole with no head row: a head row written for it
             and the record stored without the head's fields, as today (`_records`)
  outcomes   before format 7 a row was kept whole: keyed (`outcome_values`)
  index      layouts 1 and 2 (JSON or msgpack entries, `rindex` rows) and none (a store indexed in
             memory by its reader) rebuilt as layout 4 from what their entries carry; layout 3's
             entries get layout 4's shorter sketch, its lookups already alike (`_index_*`)

The new environment is then a store of today's format, which `compact.rewrite` (today's code
only) re-encodes with dictionaries trained on it; its data file replaces the old one in one
rename. Killed at any point, the store is as it was, and running it again starts over.

Every byte of the old store may have been written by an adversary: each value is read within
today's bounds, a dictionary must hash to its key, meta must name a layout and rules nfproxy
wrote, and the converted index must name each recorded exchange as its record does; anything
else is one line naming the store and the fix, with the store and its folder as they were.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import struct
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import Any

import lmdb
import msgspec

from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store import _records as store_records
from noisefloor.proxy.store import compact, replay_index
from noisefloor.proxy.store import exchange as exchange_record
from noisefloor.proxy.store import heads as store_heads
from noisefloor.proxy.store._tables import created
from noisefloor.proxy.store.env import DAMAGE, FORMAT, StoreError, check_path, refusal
from noisefloor.proxy.store.log import DEFAULT_MAX_BODY, Store
from noisefloor.proxy.store.replay_index import RecordedEntry

OLDER = ("noisefloor-log/1", "noisefloor-log/2", "noisefloor-log/3", "noisefloor-log/4", "noisefloor-log/5",
         "noisefloor-log/6", "noisefloor-log/7")
_JOINED = ("noisefloor-log/5", "noisefloor-log/6", "noisefloor-log/7")  # records stored without their heads' fields
_UNTAGGED = b"\x28\xb5\x2f\xfd"  # a zstd frame's magic: format 1's values had no tag in front
_BATCH = 5000
_UNCHANGED = "nothing was changed"
_LAYOUTS = (1, 2, 3, 4)  # the replay index layouts formats 1-7 were written with (or none: no meta)
# what reading a damaged old store raises (a value nested past the parser's depth: RecursionError)
_BAD = (*DAMAGE, RecursionError)
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_BUCKET = 8  # bytes of a nearest-request bucket (`replay_index.bucket`)


class _Entry2(msgspec.Struct, array_like=True):
    """An index entry of layout 2: id inline, route inline, the sketch's 32-bit minima."""

    version: int
    id: int
    key: bytes
    session: bytes
    occurrence: int
    seq: int
    route: bytes
    start: float | None
    end: float | None
    deps: tuple[int, ...]
    bucket: bytes | None
    sketch: bytes | None


def migrate(path: Path, progress: Callable[[str], None] = lambda s: None,
            max_body: int = DEFAULT_MAX_BODY) -> compact.Rewritten:
    """The store at `path` in today's format: converted from an earlier one, or (already in it)
    compacted. A store of no format this knows is refused by one line. No value read decompresses
    past `max_body` (--max-body-mb)."""
    path = Path(path)
    check_path(path, write=True, create=False)
    fmt = _format(path)
    if fmt == FORMAT:
        return compact.rewrite(path, progress, max_body)
    if fmt not in OLDER:
        raise StoreError(refusal(path, fmt) or f"{path} is not an nfproxy store; point --store at one made by nfproxy")
    before = (path / "data.mdb").stat().st_size
    real = path.resolve()  # the work folder beside the store's real folder: its data file moves in by a rename
    work = real.parent / f".{real.name}.migrate"
    left = (work, work.parent / f".{work.name}.rewrite", work.parent / f".{work.name}.compact")  # and compact's
    try:
        with _record_lock(path):  # until swapped in: no proxy records into it, no other migrate shares `work`
            try:
                _clear(work)
                work.mkdir()
                _convert(path, work, fmt, progress, max_body)
                _check_index(work)
                done = compact.rewrite(work, progress, max_body)
                compact.swap_in(work, path)
            finally:
                for p in left:
                    _clear(p)
    except StoreError as exc:  # found in the converted copy (by today's reader too): the old store's damage
        said = str(exc).replace(str(work), str(path))
        raise StoreError(said if said.endswith(_UNCHANGED) else f"{said}; {_UNCHANGED}") from None
    except _BAD as exc:  # the converted copy's index, read back
        raise StoreError(f"store {path} is damaged ({exc.__class__.__name__}: {exc}); restore it from a copy; "
                         f"{_UNCHANGED}") from None
    except OSError as exc:
        raise StoreError(f"cannot migrate store {path}: {exc.strerror or exc.__class__.__name__} "
                         f"({exc.filename}); fix that and run migrate again; {_UNCHANGED}") from None
    return replace(done, before_bytes=before, after_bytes=(path / "data.mdb").stat().st_size, from_format=fmt)


def _format(path: Path) -> Any:
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=32)
    try:
        with env.begin(db=env.open_db(b"meta", create=False)) as txn:
            raw = txn.get(b"format")
        return None if raw is None else json.loads(raw)
    except (lmdb.Error, ValueError, RecursionError) as exc:
        raise StoreError(f"{path} is an LMDB environment but not an nfproxy store ({exc})") from None
    finally:
        env.close()


@contextmanager
def _record_lock(path: Path) -> Iterator[None]:
    """The old store's recording lock, held while it is read and replaced: no proxy records into it
    meanwhile, and a second migrate of it is refused instead of sharing the first's work folder."""
    with open(path / "nfproxy-record.lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise StoreError(f"store {path} is being recorded or migrated by another nfproxy; stop it or let it finish, "
                             "then run migrate again") from None
        yield


def _convert(path: Path, work: Path, fmt: str, progress: Callable[[str], None], max_body: int) -> None:
    """The old store's tables, read as written, put into a new environment at `work` as today's
    format keeps them; a damaged value stops it by name, before anything replaces the store."""
    old = lmdb.open(str(path), readonly=True, lock=False, max_dbs=32)
    try:
        _converted(old, path, work, fmt, progress, max_body)
    except StoreError:
        raise
    except _Unwritten as exc:
        raise StoreError(f"cannot write the converted copy of store {path} in {work.parent} ({exc}); free disk space "
                         f"there, then run migrate again; {_UNCHANGED}") from None
    except _BAD as exc:
        raise StoreError(f"store {path} is damaged ({exc.__class__.__name__}: {exc}); restore it from a copy; "
                         "nothing was changed") from None
    finally:
        old.close()


def _converted(old: lmdb.Environment, path: Path, work: Path, fmt: str, progress: Callable[[str], None],
               max_body: int) -> None:
    names = {name: db for name, db, _ in compact.tables(old)}
    values = _Values(dict(_rows(old, names.get(b"dicts"))), max_body)
    meta = {k.decode(): json.loads(v) for k, v in _rows(old, names.get(b"meta"))}
    layout = meta.get("replay_index")
    if layout is not None and (type(layout) is not int or layout not in _LAYOUTS):
        raise StoreError(f"store {path} marks its replay index with a layout no nfproxy wrote (meta replay_index); "
                         f"restore it from a copy; {_UNCHANGED}")
    if "rules" in meta and Rules.described(meta["rules"]) is None:  # replay keys requests by them
        raise StoreError(f"store {path}: its normalization rules (meta rules) are not a rule set nfproxy wrote; "
                         f"restore it from a copy; {_UNCHANGED}")
    with _writing():
        new = lmdb.open(str(work), map_size=max(1 << 30, 4 * (path / "data.mdb").stat().st_size), max_dbs=16)
    try:
        with _writing():  # each table made in a transaction of its own
            dbs = created(new)
        _put(new, dbs["dicts"], iter(sorted(values.ids.items())))
        _put(new, dbs["bodies"], ((k, values.value(v)) for k, v in _rows(old, names.get(b"bodies"))))
        progress("bodies converted")
        if fmt in _JOINED:
            _put(new, dbs["exchanges"], ((k, values.value(v)) for k, v in _rows(old, names.get(b"exchanges"))))
            _put(new, dbs["heads"], _retied(old, names, values))
            for table in store_heads.SETS:
                _put(new, dbs[table], _rows(old, names.get(table.encode())))
        else:
            _put_records(new, dbs, _rows(old, names.get(b"exchanges")), values, path, max_body)
        progress("records converted")
        _put(new, dbs["outcomes"], compact.keyed_outcomes(_rows(old, names.get(b"outcomes")), path))
        if layout in (3, 4):  # layout 3: layout 4 but for the sketch's width
            _put(new, dbs["recorded"], ((k, _entry3_as_4(v)) for k, v in _rows(old, names.get(b"recorded"))))
            _put(new, dbs["index_routes"], _rows(old, names.get(b"index_routes")))
            _put(new, dbs["lookups"], _rows(old, names.get(b"lookups")), append=False)
        kept = {k: v for k, v in meta.items() if k not in ("format", "replay_index", "migrated_from", "dicts")}
        _put(new, dbs["meta"], ((k.encode(), json.dumps(v).encode()) for k, v in
                                {**kept, "format": FORMAT, "replay_index": replay_index.VERSION,
                                 "migrated_from": fmt}.items()), append=False)
        entries = [] if layout in (3, 4) else _old_entries(old, names, layout)
    finally:
        new.close()
    if layout not in (3, 4):
        with Store.open(work, write=True, max_body=max_body) as store:
            with _writing():
                store.index.put_entries(_completed(store, entries))
        progress("replay index rebuilt")


def _clear(p: Path) -> None:
    """Nothing at `p`: a folder removed, a file or a link (never what it points to) unlinked."""
    if p.is_symlink() or p.is_file():
        p.unlink()
    else:
        shutil.rmtree(p, ignore_errors=True)


class _Values:
    """An old store's values as today's codec reads them (`value`), its dictionaries keyed by their
    zstd ids (`ids`; where two share one, the first in key order: the values of the other are
    decompressed and stored without a dictionary)."""

    def __init__(self, dicts: dict[bytes, bytes], max_body: int) -> None:
        self._old, self._max_body = dicts, max_body  # the first 8 bytes of each one's sha256 -> dictionary
        self.ids = {key: d for d in reversed(dicts.values()) if (key := codec.dict_key(d)) != bytes(codec.KEY_SIZE)}
        self.codec = codec.Codec(self.ids.get)

    def value(self, value: bytes) -> bytes:
        if value[:4] == _UNTAGGED:
            return bytes([codec.FRAME]) + value
        if value[:1] == b"\x04":  # a body behind a CRC-32 of its bytes
            if len(value) < 6 or zlib.crc32(value[5:]) != int.from_bytes(value[1:5], "big"):
                raise ValueError("a value whose CRC-32 does not match its bytes (damaged)")
            value = value[5:]
        if value[:1] != b"\x02":  # raw, a frame without a dictionary, or compressed against other bodies: as today's
            return value
        key, frame = bytes(value[1:9]), bytes([codec.FRAME]) + value[9:]
        data = self._old.get(key)
        if data is None or hashlib.sha256(data).digest()[:8] != key:  # decompressed with another: not what was recorded
            raise ValueError(f"compression dictionary {key.hex()} is missing or does not match its hash")
        if self.codec.dictionary_of(frame) != codec.dict_key(data):
            raise ValueError(f"a value whose frame names another dictionary than its key {key.hex()}")
        if self.ids[codec.dict_key(data)] == data:
            return frame
        return self.codec.encode(codec.Codec(lambda k: data).decode(frame, self._max_body))


def _retied(env: lmdb.Environment, names: dict[bytes, Any], values: _Values) -> Iterator[tuple[bytes, bytes]]:
    """The heads rows, each sound one tied to its record as converted (its CRC of the record's bytes);
    a damaged one kept as it is, for today's reader to refuse by name."""
    with env.begin(buffers=False) as txn:
        for k, head in _rows(env, names.get(b"heads")):
            stored = txn.get(k, db=names.get(b"exchanges")) if names.get(b"exchanges") is not None else None
            if stored is not None and store_heads.check(k, head, stored) is None and \
                    (converted := values.value(stored)) != stored:
                rest = _U32.pack(zlib.crc32(converted)) + head[8:]
                head = _U32.pack(zlib.crc32(rest, zlib.crc32(k))) + rest
            yield k, head


def _check_index(work: Path) -> None:
    """The converted replay index names each recorded exchange once, as its record does (its
    request key, session, occurrence and seq), and its answers carried (`deps`) are seqs of its
    session's recorded exchanges: an old index naming anything else is damage, refused by name."""
    with Store.open(work, write=False) as store:
        listed, recorded = 0, {}
        for ex in store.exchanges():  # one at a time: a store of millions is not held whole
            listed += 1
            if ex.mode == "record":
                recorded[ex.id] = (ex.key, ex.session, ex.occurrence, ex.seq)
        if listed != len(store):  # one under id 0, which no reader lists
            raise StoreError(f"store {work} holds an exchange under an id no nfproxy writes; restore it from a copy")
        entries = list(store.index.entries())
        if sorted(e.id for e in entries) != sorted(recorded):
            raise StoreError(f"store {work}: its replay index does not name each recorded exchange once; restore it "
                             "from a copy")
        seqs: dict[str, set[int]] = {}
        for e in entries:
            seqs.setdefault(e.session, set()).add(e.seq)
        for e in entries:
            if recorded[e.id] != (e.key, e.session, e.occurrence, e.seq) or not seqs[e.session].issuperset(e.deps):
                raise StoreError(f"store {work}: the replay index entry of exchange {e.id} does not match its "
                                 "record; restore it from a copy")


def _rows(env: lmdb.Environment, db: Any) -> Iterator[tuple[bytes, bytes]]:
    if db is None:
        return
    with env.begin(db=db, buffers=False) as txn:
        yield from txn.cursor().iternext()


class _Unwritten(Exception):
    """Writing the converted copy failed (a full disk, most often): not the old store's damage."""


@contextmanager
def _writing() -> Iterator[None]:
    try:
        yield
    except lmdb.Error as exc:
        raise _Unwritten(f"{exc.__class__.__name__}: {exc}") from None


def _put(env: lmdb.Environment, db: Any, items: Iterator[tuple[bytes, bytes]], append: bool = True) -> None:
    while batch := list(islice(items, _BATCH)):
        with _writing(), env.begin(write=True, db=db) as txn:
            for k, v in batch:
                txn.put(k, v, append=append)


def _put_records(env: lmdb.Environment, dbs: dict[str, Any], rows: Iterator[tuple[bytes, bytes]],
                 values: _Values, path: Path, max_body: int) -> None:
    """Whole records (formats 1-4) stored as today's: without their head's fields, beside a head row."""
    names = store_heads.Sets(dbs["labels"], dbs["routes"])
    while batch := list(islice(rows, _BATCH)):
        with _writing(), env.begin(write=True) as txn:
            for k, raw in batch:
                exchange_id = _U64.unpack(k)[0]
                try:
                    text = values.codec.decode(values.value(raw), max_body)
                    _digests_named(exchange_record.parse(text))
                    checked = exchange_record.checked_head(text)
                except _BAD as exc:
                    raise StoreError(f"store {path}: exchange {exchange_id} is damaged ({exc.__class__.__name__}: "
                                     f"{exc}); restore it from a copy; nothing was changed") from None
                stored, r = store_records.encoded(values.codec, None, text, checked)
                txn.put(k, stored, db=dbs["exchanges"], append=True)
                txn.put(k, names.sealed(txn, k, r), db=dbs["heads"], append=True)
        names.settle(True)


def _digests_named(ex: exchange_record.Exchange) -> None:
    """A record's bodies named by sha256 hex, as every reader looks them up: anything else may be
    any text (a planted key), which no message may then repeat."""
    for name, part in (("request", ex.request), ("response", ex.response or {})):
        digest = part.get("body")
        if digest is not None and not (type(digest) is str and store_heads.HEX_KEY.fullmatch(digest)):
            raise ValueError(f"its {name} body is not named by a sha256")


def _entry3_as_4(raw: bytes) -> bytes:
    """A layout-3 entry as layout 4 keeps it: its sketch cut to 16 bits a minimum."""
    e = msgspec.msgpack.decode(raw, type=replay_index.StoredEntry)
    if e.version == 3:
        e.version = replay_index.VERSION
        e.sketch = None if e.sketch is None else replay_index.short(e.sketch)
    return msgspec.msgpack.encode(e)


Near = tuple[bytes, tuple[bytes, ...], bytes] | None


def _old_entries(env: lmdb.Environment, names: dict[bytes, Any], layout: Any) -> list[tuple[RecordedEntry, bool]]:
    """Layout 1's, 2's or none's entries, each with its sketch where the store kept one, and
    whether it did (a store without index rows kept none: its sketches are made again)."""
    sketches: dict[int, bytes] = {}
    buckets: dict[int, bytes] = {}
    for k, v in _rows(env, names.get(b"rindex")):  # layout 1's rows: g + id -> sketch, b + bucket + id
        if k[:1] == b"g" and len(k) == 9:
            sketches[_U64.unpack(k[1:])[0]] = v
        elif k[:1] == replay_index.BUCKET and len(k) == 17:
            buckets.setdefault(_U64.unpack(k[9:])[0], k[1:9])
    out = []
    for k, raw in _rows(env, names.get(b"recorded")):
        exchange_id = _U64.unpack(k)[0]
        if raw[:1] == b"{":
            doc = json.loads(raw)
            e = RecordedEntry(exchange_id, doc["key"], doc["session"], doc["occurrence"], doc["seq"], doc["route"],
                              doc.get("start"), doc.get("end"), tuple(doc.get("deps", ())))
            buck, sk = buckets.get(exchange_id), sketches.get(exchange_id)
        else:
            e2 = msgspec.msgpack.decode(raw, type=_Entry2)
            e = RecordedEntry(exchange_id, e2.key.hex(), _text(e2.session), e2.occurrence, e2.seq, _text(e2.route),
                              e2.start, e2.end, e2.deps)
            buck, sk = e2.bucket, e2.sketch
        if buck is not None and len(buck) != _BUCKET:
            raise ValueError(f"a replay-index bucket of {len(buck)} bytes")
        near: Near = None if buck is None or sk is None else (buck, replay_index.bands(buck, sk), sk)
        out.append((replace(e, near=near), layout in (1, 2)))
    return out


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogatepass")


def _completed(store: Store, entries: list[tuple[RecordedEntry, bool]]) -> Iterator[RecordedEntry]:
    """Entries of a store that kept no index rows given what its reader computed in memory: each
    request's sketch made again from its stored request, and the answers it carries (`deps`)."""
    if all(indexed for _, indexed in entries):
        yield from (e for e, _ in entries)
        return
    from noisefloor.proxy.request.dependencies import recompute
    from noisefloor.proxy.store.merge.shard import stored_request_near

    rules = Rules.described(store.meta("rules"))
    plain = [e for e, _ in entries]
    deps = recompute(store, rules, plain) if rules is not None and not any(e.deps for e in plain) else {}
    for e, indexed in entries:
        ex = None if indexed else store.exchange(e.id)
        near = e.near if ex is None else stored_request_near(rules, ex.request, store.bodies.of_part(ex.request, e.id))
        yield replace(e, near=near, deps=deps.get(e.id, e.deps))
