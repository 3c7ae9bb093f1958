"""The log: one LMDB environment holding exchanges, bodies and the replay index.

Layout (named databases):
  meta      name -> JSON           format version, normalization rules and their id
  bodies    sha256 -> zstd(bytes)  every request/response body, stored once
  exchanges u64 id -> zstd(JSON)   one record per request the proxy saw, in write order
  recorded  u64 id -> JSON         the compact replay index of record-mode exchanges
  outcomes  condition, task, replicate -> JSON   graded outcome rows (nfverify, nfladder), so
                                   that the log is the one artifact a user keeps

Each exchange is written in one transaction together with its bodies, so a reader (or a proxy
killed with SIGKILL) sees either the whole exchange or none of it. This module is the only way any
part of noisefloor reads the log.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import struct
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lmdb
import zstandard

from noisefloor.errors import StateError
from noisefloor.outcome_rows import row_key
from noisefloor.proxy import exchange_record
from noisefloor.proxy.headers import header
from noisefloor.proxy.keys import decode_body

FORMAT = "noisefloor-log/1"
_INITIAL_MAP = 32 << 20  # doubled when full; with writemap the whole map is reserved on disk
_ZSTD_LEVEL = 3
_U64 = struct.Struct(">Q")


def _read_only(path: Path) -> bool:
    """Read-only by permission bits too: root may write anyway, but the owner said not to."""
    if not path.exists():
        return False
    if os.statvfs(path).f_flag & os.ST_RDONLY:
        return True
    return not os.access(path, os.W_OK) or not path.stat().st_mode & stat.S_IWUSR


def is_read_only(path: str | os.PathLike[str]) -> bool:
    """A store that can be read but not written: checked out read-only, or on a read-only mount."""
    p = Path(path)
    return _read_only(p) or _read_only(p / "data.mdb")


# What reading a damaged store raises, from LMDB, zstd, JSON or the record types.
_DAMAGE = (lmdb.Error, zstandard.ZstdError, ValueError, TypeError, KeyError, UnicodeDecodeError, struct.error)
_MIN_FILE = 2 * 4096  # LMDB's two meta pages

class StoreError(StateError):
    """A store that cannot be used as asked; the message says what to do."""


@dataclass(frozen=True)
class Exchange:
    """One request the proxy saw and what it answered (see DESIGN.md, exchange record)."""

    id: int
    time: float  # the request arrived
    mode: str
    session: str
    key: str
    occurrence: int
    seq: int
    rules_id: str
    request: dict[str, Any]
    response: dict[str, Any] | None
    task: str | None = None
    replicate: str | None = None
    condition: str | None = None
    latency_ms: float | None = None
    model: str | None = None
    fingerprint: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    truncated: bool = False
    replay: dict[str, Any] | None = None
    overrides: dict[str, Any] | None = None
    perturbation: str | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    end: float | None = None  # the answer was complete (recorded exchanges)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Exchange:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in doc.items() if k in known})

    @property
    def replay_result(self) -> str | None:
        return (self.replay or {}).get("result")


@dataclass(frozen=True)
class RecordedEntry:
    """What replay needs to know about one recorded exchange, without loading it."""

    id: int
    key: str
    session: str
    occurrence: int
    seq: int
    route: str  # "METHOD host path": narrows the nearest-request search on a miss
    start: float | None = None  # when the request arrived and when its answer was complete: the
    end: float | None = None  # recorded happens-before order (None in stores recorded before it)


_ENTRY_FIELDS = tuple(RecordedEntry.__dataclass_fields__)
_ENTRY_REQUIRED = ("id", "key", "session", "occurrence", "seq", "route")


class Store:
    """An open log. Use `Store.open(path, write=...)`; close it (or use `with`) when done."""

    def __init__(self, env: lmdb.Environment, path: Path, writable: bool, needed: int = 0) -> None:
        self._env = env
        self.path = path
        self.writable = writable
        self._fd = os.open(path / "data.mdb", os.O_RDONLY)
        self._needed = needed  # bytes the data file must keep: reading past its end is a SIGBUS
        self._record_lock: Any = None
        self._meta = env.open_db(b"meta", create=writable)
        self._bodies = env.open_db(b"bodies", create=writable)
        self._exchanges = env.open_db(b"exchanges", create=writable)
        self._recorded = env.open_db(b"recorded", create=writable)
        try:  # stores written before outcome rows were kept have no such table
            self._outcomes: Any = env.open_db(b"outcomes", create=writable)
        except lmdb.NotFoundError:
            self._outcomes = None
        self._cctx = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)
        self._dctx = zstandard.ZstdDecompressor()

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, write: bool, create: bool = False) -> Store:
        p = Path(path)
        if p.exists() and not p.is_dir():
            raise StoreError(f"{p} is a file, not an nfproxy store; give a directory path such as recordings/log.lmdb")
        data = p / "data.mdb"
        if not data.exists():
            if not create:
                raise StoreError(f"no nfproxy store at {p}; record one first with `nfproxy --mode record --store {p}`")
            if p.exists() and any(p.iterdir()):
                raise StoreError(f"{p} is a non-empty directory without an LMDB store; choose a new path for --store")
        if write and (_read_only(p) or _read_only(data)):
            raise StoreError(f"store {p} is read-only; make it writable or record into a new --store path")
        if data.exists() and data.stat().st_size < _MIN_FILE:
            raise StoreError(f"{p} is not a readable LMDB store: {data} has {data.stat().st_size} bytes (truncated or "
                             "not a store); restore it from a copy, or point --store at an nfproxy store")
        try:
            if write:
                p.mkdir(parents=True, exist_ok=True)
            env = lmdb.open(
                str(p),
                map_size=_INITIAL_MAP,
                max_dbs=8,
                subdir=True,
                readonly=not write,
                lock=write or not is_read_only(p),  # a read-only store gets no reader-table writes
                # Process-crash safe without fsync per exchange: LMDB writes the meta page last, so a
                # SIGKILL leaves the last committed transaction intact. `sync()` on close.
                sync=False,
                metasync=False,
                # writes go straight into the shared map: no pwrite per dirty page on the request path
                writemap=write,
                create=write,
            )
        except lmdb.Error as exc:
            raise StoreError(f"{p} is not a readable LMDB store ({exc}); point --store at an nfproxy store") from exc
        if write:
            try:
                _reserve(data, env.info()["map_size"])
            except StoreError:
                env.close()
                raise
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        if data.stat().st_size < needed:
            env.close()
            raise StoreError(f"store {p} is damaged: {data} is truncated ({data.stat().st_size} of {needed} bytes); "
                             "restore it from a copy or record it again")
        try:
            store = cls(env, p, write, needed)
        except lmdb.Error as exc:
            env.close()
            raise StoreError(f"{p} is an LMDB environment but not an nfproxy store ({exc})") from exc
        fmt = store.meta("format")
        if fmt is None and write:
            store.set_meta("format", FORMAT)
        elif fmt != FORMAT:
            store.close()
            raise StoreError(f"{p} is not an nfproxy store (format {fmt!r}); point --store at one made by nfproxy")
        return store

    def lock_for_recording(self) -> None:
        """One recording proxy per store: two would number the same sessions twice and make the
        replay order ambiguous. The lock lives as long as this handle (or the process)."""
        fh = open(self.path / "nfproxy-record.lock", "a+")  # noqa: SIM115 - kept open: the lock lives with it
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise StoreError(f"store {self.path} is being recorded by another nfproxy ({holder}); stop it, or "
                             "record into another --store and combine them later") from None
        fh.truncate(0)
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        self._record_lock = fh

    def close(self) -> None:
        if self.writable:
            self._env.sync(True)
        self._env.close()
        os.close(self._fd)
        if self._record_lock is not None:
            self._record_lock.close()

    def _check_intact(self) -> None:
        size = os.fstat(self._fd).st_size
        if size < self._needed:
            raise StoreError(f"store {self.path} was truncated while in use ({size} of {self._needed} bytes); "
                             "restore it from a copy or record it again")

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """Every read: refuse a file cut short under us (reading past its end would be a SIGBUS),
        and turn damage into one StoreError that names the store and what to do."""
        self._check_intact()
        try:
            yield
        except StoreError:
            raise
        except _DAMAGE as exc:
            raise StoreError(f"store {self.path} is damaged ({exc.__class__.__name__}: {exc}); "
                             "restore it from a copy or record it again") from None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- meta ----------------------------------------------------------------------------------

    def meta(self, name: str) -> Any:
        with self._reading(), self._env.begin(db=self._meta) as txn:
            raw = txn.get(name.encode())
            return None if raw is None else json.loads(raw)

    def set_meta(self, name: str, value: Any) -> None:
        self._write(lambda txn: txn.put(name.encode(), json.dumps(value).encode(), db=self._meta))

    def bind_rules(self, rules_id: str, described: dict[str, Any]) -> None:
        """Store the rule set on first use; refuse a different one afterwards."""
        have = self.meta("rules_id")
        if have is None:
            if not self.writable:
                return
            self.set_meta("rules_id", rules_id)
            self.set_meta("rules", described)
            return
        if have != rules_id:
            raise StoreError(
                f"store {self.path} was recorded with normalization rules {have} "
                f"({json.dumps(self.meta('rules'), sort_keys=True)}) but this run uses {rules_id}; "
                "pass the same --ignore-field flags as the recording, or use a new --store"
            )

    # -- bodies --------------------------------------------------------------------------------

    def body(self, digest: str | None) -> bytes | None:
        if digest is None:
            return None
        with self._reading(), self._env.begin(db=self._bodies) as txn:
            raw = txn.get(bytes.fromhex(digest))
            return None if raw is None else self._dctx.decompress(raw)

    def bodies(self) -> Iterator[bytes]:
        """Every stored body, decompressed (for audits: what exactly is on disk)."""
        with self._reading(), self._env.begin(db=self._bodies, buffers=False) as txn:
            for _, raw in txn.cursor():
                yield self._dctx.decompress(raw)

    def raw_body(self, digest: str) -> bytes | None:
        """A body as stored (compressed): merging copies it without recompressing."""
        with self._reading(), self._env.begin(db=self._bodies, buffers=False) as txn:
            return txn.get(bytes.fromhex(digest))

    def decoded_body(self, part: Mapping[str, Any]) -> bytes | None:
        """A stored request or response body with its Content-Encoding undone."""
        raw = self.body(part.get("body"))
        if raw is None:
            return None
        encoding = header(part["headers"], "content-encoding")
        return decode_body(raw, encoding)[0]

    # -- exchanges -----------------------------------------------------------------------------

    def append(
        self,
        record: dict[str, Any] | str,
        bodies: Mapping[str, bytes],
        recorded: RecordedEntry | None,
    ) -> int:
        """Write one exchange atomically; returns the new id.

        `record` is a dict or its JSON text (a non-empty object, without "id"); `bodies` maps sha256
        hex to bytes.
        """
        return self._write(lambda txn: self._append(txn, record, bodies, recorded))

    def append_many(self, items: list[tuple[dict[str, Any], Mapping[str, bytes], RecordedEntry | None]]) -> None:
        """Several exchanges in one transaction."""
        self._write(lambda txn: [self._append(txn, *item) for item in items])

    def absorb(self, raw_bodies: Mapping[str, bytes | None], items: list[tuple[dict[str, Any], RecordedEntry | None]],
               ) -> tuple[list[int], int]:
        """Merge: exchanges from another store with its compressed bodies, in one transaction.
        Returns the new ids and how many bodies were new here."""
        def write(txn: lmdb.Transaction) -> tuple[list[int], int]:
            fresh = 0
            for hexdigest, raw in raw_bodies.items():
                digest = bytes.fromhex(hexdigest)
                if raw and txn.get(digest, db=self._bodies) is None:
                    txn.put(digest, raw, db=self._bodies)
                    fresh += 1
            return [self._append(txn, record, {}, entry) for record, entry in items], fresh

        return self._write(write)

    def _append(
        self,
        txn: lmdb.Transaction,
        record: dict[str, Any] | str,
        bodies: Mapping[str, bytes],
        recorded: RecordedEntry | None,
    ) -> int:
        for hexdigest, data in bodies.items():
            if not data:
                continue
            digest = bytes.fromhex(hexdigest)
            if txn.get(digest, db=self._bodies) is None:  # stored once: skip compressing a known body
                txn.put(digest, self._cctx.compress(data), db=self._bodies)
        with txn.cursor(db=self._exchanges) as cur:
            new_id = _U64.unpack(cur.key())[0] + 1 if cur.last() else 1
        doc = exchange_record.with_id(record if isinstance(record, str) else json.dumps(record), new_id)
        txn.put(_U64.pack(new_id), self._cctx.compress(doc.encode()), db=self._exchanges)
        if recorded is not None:
            entry = {"id": new_id, "key": recorded.key, "session": recorded.session, "occurrence": recorded.occurrence,
                     "seq": recorded.seq, "route": recorded.route, "start": recorded.start, "end": recorded.end}
            txn.put(_U64.pack(new_id), json.dumps(entry).encode(), db=self._recorded)
        return new_id

    def exchange(self, exchange_id: int) -> Exchange | None:
        with self._reading(), self._env.begin(db=self._exchanges) as txn:
            raw = txn.get(_U64.pack(exchange_id))
            return None if raw is None else Exchange.from_json(json.loads(self._dctx.decompress(raw)))

    def exchanges(self) -> Iterator[Exchange]:
        """Every exchange in write order (a consistent snapshot)."""
        with self._reading(), self._env.begin(db=self._exchanges, buffers=False) as txn:
            for _, raw in txn.cursor():
                yield Exchange.from_json(json.loads(self._dctx.decompress(raw)))

    def exchanges_after(self, after: int = 0) -> Iterator[Exchange]:
        """Exchanges with an id above `after`, in id order: a cursor, so a reader takes one page of
        a large store without touching the rest (nfview). Stop iterating to end the read."""
        with self._reading(), self._env.begin(db=self._exchanges, buffers=False) as txn:
            cur = txn.cursor()
            if not cur.set_range(_U64.pack(after + 1)):
                return
            for _, raw in cur:
                yield Exchange.from_json(json.loads(self._dctx.decompress(raw)))

    def recorded_entries(self) -> Iterator[RecordedEntry]:
        with self._reading(), self._env.begin(db=self._recorded) as txn:
            for _, raw in txn.cursor():
                doc = json.loads(raw)
                yield RecordedEntry(**{k: doc[k] for k in _ENTRY_REQUIRED}, start=doc.get("start"), end=doc.get("end"))

    # -- outcome rows --------------------------------------------------------------------------

    def put_outcomes(self, rows: list[Mapping[str, Any]]) -> None:
        """Graded rows, one per (condition, task, replicate); grading again replaces a row."""
        def put(txn: lmdb.Transaction) -> None:
            for r in rows:
                key = json.dumps(row_key(r)).encode()
                txn.put(key, json.dumps(dict(r)).encode(), db=self._outcomes)

        self._write(put)

    def outcome_rows(self) -> list[dict[str, Any]]:
        if self._outcomes is None:
            return []
        with self._reading(), self._env.begin(db=self._outcomes) as txn:
            return [json.loads(v) for _, v in txn.cursor()]

    def copy_to(self, folder: Path) -> None:
        """A compact copy of this store (a consistent snapshot) in an empty folder: a shard to ship."""
        with self._reading():
            self._env.copy(str(folder), compact=True)

    def __len__(self) -> int:
        with self._reading(), self._env.begin(db=self._exchanges) as txn:
            return txn.stat(self._exchanges)["entries"]

    # -- internals -----------------------------------------------------------------------------

    def _write(self, fn: Any) -> Any:
        if not self.writable:
            raise StoreError(f"store {self.path} was opened read-only")
        while True:
            self._check_intact()
            try:
                with self._env.begin(write=True) as txn:
                    return fn(txn)
            except lmdb.MapFullError:
                size = self._env.info()["map_size"] * 2
                _reserve(self.path / "data.mdb", size)  # first: the map may only cover reserved disk
                self._env.set_mapsize(size)
            except lmdb.Error as exc:
                raise StoreError(f"writing store {self.path} failed ({exc}); nothing of this exchange was kept") from exc


def _reserve(data: Path, size: int) -> None:
    """Allocate the store file's disk blocks for the whole map.

    With writemap, LMDB writes through a shared mapping of a sparse file: a page the disk cannot
    back kills the process with SIGBUS (measured on a full tmpfs) instead of failing one write.
    With the blocks allocated up front, a full disk is a clean error when the store is opened or
    its map grows, and everything committed before stays readable.
    """
    fd = os.open(data, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        raise StoreError(
            f"cannot reserve {size >> 20} MB of disk for store {data.parent} ({exc.strerror}); "
            "free some space or record into a --store on another disk"
        ) from None
    finally:
        os.close(fd)
