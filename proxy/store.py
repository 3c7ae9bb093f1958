"""The log: one LMDB environment holding exchanges, bodies and the replay index.

Layout (named databases; values encoded as `codec` says: tagged, zstd with a trained dictionary):
  meta      name -> JSON           format version, normalization rules and their id, dictionaries
  bodies    sha256 -> value        every request/response body, stored once
  exchanges u64 id -> value(JSON)  one record per request the proxy saw, in write order
  dicts     key -> bytes           zstd dictionaries trained on this store's bodies and records
  recorded  u64 id -> JSON         the compact replay index of record-mode exchanges
  outcomes  condition, task, replicate -> JSON   graded outcome rows (nfverify, nfladder), so
                                   that the log is the one artifact a user keeps
  rindex    prefixed keys -> small values: the replay index's lookups (see `replay_index.py`),
                                   so that replay reads what a request needs instead of loading
                                   the whole index (stores made before it have none)

Each exchange is written in one transaction together with its bodies, so a reader (or a proxy
killed with SIGKILL) sees either the whole exchange or none of it. This module is the only way any
part of noisefloor reads the log, and every read is verified: a body must hash to the digest it is
stored under and decompress within its recorded size (and the --max-body-mb bound), a record must
parse as the exchange record; anything else is a StoreError naming the store and the exchange.

Format versions: noisefloor-log/1 (main before the versioned format: plain zstd values, no
dictionaries) is read as it is; opening it for writing marks it noisefloor-log/2, whose readers
read both encodings. `nfproxy migrate` / `nfproxy compact` rewrite a store whole in today's encoding.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import re
import stat
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb
import msgspec
import zstandard

from noisefloor.errors import StateError
from noisefloor.outcome_rows import row_key
from noisefloor.proxy import codec, exchange_record, replay_index
from noisefloor.proxy.headers import header
from noisefloor.proxy.keys import decode_body

FORMAT = "noisefloor-log/2"
LEGACY_FORMATS = ("noisefloor-log/1",)  # read as they are; marked FORMAT when opened for writing
_INITIAL_MAP = 32 << 20  # with writemap the whole map is reserved on disk
_GROWTH = 8  # a full map grows by 1/8 (at least _MIN_STEP): the file stays close to what is used
_MIN_STEP = 64 << 20
DEFAULT_MAX_BODY = 64 << 20  # --max-body-mb's default: the most a stored body may decompress to
TRAIN_AFTER = 1000  # values of a kind (body, record) seen before its dictionary is trained
_SAMPLE_MAX = 64 << 10  # longer values are not sampled for training
_U64 = struct.Struct(">Q")
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_MAX_REF_DEPTH = 32  # a body compressed against others is refused past this many levels (a cycle)
CHAIN_DEPTH = 6  # a request is compressed against its session's previous exchange at most this deep
_REF_CACHE = 256  # referenced bodies kept decoded
_CHAINS = 4096  # sessions whose last exchange's bodies are kept for that (an LRU)
_FIRST_BODY = re.compile(r'"body": (?:null|"([0-9a-f]{64})")')  # the first is the request's (request_part)


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
_DAMAGE = (lmdb.Error, zstandard.ZstdError, ValueError, TypeError, KeyError, UnicodeDecodeError, struct.error,
           IndexError, AttributeError, msgspec.MsgspecError)
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
    usage: dict[str, Any] | None = field(default_factory=dict)
    finish_reason: str | None = None
    truncated: bool | None = False
    replay: dict[str, Any] | None = None
    overrides: dict[str, Any] | None = None
    perturbation: str | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    end: float | None = None  # the answer was complete (recorded exchanges)

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object. Shallow: the nested request / response / usage objects are
        the exchange's own (dataclasses.asdict deep-copied them, and dominated listing a store)."""
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    def json_bytes(self) -> bytes:
        """The record as compact JSON (UTF-8, every field): what `nfproxy log --json` prints."""
        try:
            return _ENCODER.encode(self.to_json())  # a dict: every field, in order
        except (UnicodeEncodeError, msgspec.EncodeError):  # a lone surrogate (bytes no header should hold)
            return json.dumps(self.to_json(), ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Exchange:
        """The record, or TypeError naming the first field that is not what the record type says."""
        if not isinstance(doc, dict):
            raise TypeError(f"a JSON {type(doc).__name__}, not an object")
        _check(doc, _RECORD_TYPES, "")
        for name in ("request", "response"):
            if doc.get(name) is not None:
                _check(doc[name], _PART_TYPES[name], name + ".")
        return cls(**{k: v for k, v in doc.items() if k in _KNOWN})

    @property
    def replay_result(self) -> str | None:
        return (self.replay or {}).get("result")


_FIELD_NAMES = tuple(Exchange.__dataclass_fields__)
_KNOWN = frozenset(_FIELD_NAMES)
_NUM = (int, float)
_OPT_STR = (str, type(None))
_RECORD_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {  # field -> (types, required)
    "id": ((int,), True), "time": (_NUM, True), "mode": ((str,), True), "session": ((str,), True),
    "key": ((str,), True), "occurrence": ((int,), True), "seq": ((int,), True), "rules_id": ((str,), True),
    "request": ((dict,), True), "response": ((dict, type(None)), True), "task": (_OPT_STR, False),
    "replicate": (_OPT_STR, False), "condition": (_OPT_STR, False), "latency_ms": ((*_NUM, type(None)), False),
    "model": (_OPT_STR, False), "fingerprint": (_OPT_STR, False), "usage": ((dict, type(None)), False),
    "finish_reason": (_OPT_STR, False), "truncated": ((bool, type(None)), False), "replay": ((dict, type(None)), False),
    "overrides": ((dict, type(None)), False), "perturbation": (_OPT_STR, False), "error": (_OPT_STR, False),
    "notes": ((list,), False), "end": ((*_NUM, type(None)), False),
}
_PART_TYPES: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "request": {"method": ((str,), True), "url": ((str,), True), "headers": ((list,), True),
                "body": (_OPT_STR, False), "body_size": ((int, type(None)), False)},
    "response": {"status": ((int,), True), "headers": ((list,), True), "body": (_OPT_STR, False),
                 "body_size": ((int, type(None)), False), "chunks": ((list, type(None)), False)},
}


class _Part(msgspec.Struct):
    """A part of a head, read like the record's dict (`part["status"]`, `part.get("url")`)."""

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)


class _RequestHead(_Part):
    method: str
    url: str


class _ResponseHead(_Part):
    status: int


class Head(msgspec.Struct):
    """What listings and summaries read of an exchange record (`Store.heads`): its labels, route,
    status and identity, decoded and type-checked without the headers and the rest."""

    id: int
    time: float
    mode: str
    session: str
    key: str
    occurrence: int
    request: _RequestHead
    response: _ResponseHead | None
    task: str | None = None
    replicate: str | None = None
    condition: str | None = None
    model: str | None = None
    fingerprint: str | None = None
    usage: dict[str, Any] | None = None
    truncated: bool | None = False
    replay: dict[str, Any] | None = None
    error: str | None = None
    notes: list[str] = msgspec.field(default_factory=list)

    @property
    def status(self) -> int | None:
        return None if self.response is None else self.response.status

    @property
    def replay_result(self) -> str | None:
        return (self.replay or {}).get("result")


_DECODER = msgspec.json.Decoder(Exchange)
_HEAD_DECODER = msgspec.json.Decoder(Head)
_ENCODER = msgspec.json.Encoder()


def parse_record(data: bytes) -> Exchange:
    """One stored record, typed: msgspec checks every field against Exchange's annotations in C
    (json.loads plus checks in Python cost five times as much and dominated listing a store);
    TypeError / ValueError name what is wrong."""
    try:
        ex = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise TypeError(str(exc)) from None
    except msgspec.DecodeError:  # JSON that msgspec refuses and json reads (a lone surrogate): the slow path
        return Exchange.from_json(json.loads(data))
    for name in ("request", "response"):
        part = getattr(ex, name)
        if part is not None:
            _check(part, _PART_TYPES[name], name + ".")
    return ex


def _check(doc: Any, types: Mapping[str, tuple[tuple[type, ...], bool]], where: str) -> None:
    if not isinstance(doc, dict):
        raise TypeError(f"{where[:-1]} is a JSON {type(doc).__name__}, not an object")
    for name, (allowed, required) in types.items():
        if name not in doc:
            if required:
                raise TypeError(f"field {where}{name} is missing")
            continue
        value = doc[name]
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise TypeError(f"field {where}{name} is a {type(value).__name__}")


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
    deps: tuple[int, ...] = ()  # seqs (same session) of the recorded answers this request carries
    # the nearest-request index's entry, written with the exchange (not part of the JSON entry)
    near: tuple[bytes, tuple[bytes, ...], bytes] | None = None  # (bucket, bands, signature)


_ENTRY_FIELDS = tuple(RecordedEntry.__dataclass_fields__)
_ENTRY_REQUIRED = ("id", "key", "session", "occurrence", "seq", "route")


def _entry(doc: dict[str, Any]) -> RecordedEntry:
    return RecordedEntry(**{k: doc[k] for k in _ENTRY_REQUIRED}, start=doc.get("start"), end=doc.get("end"),
                         deps=tuple(doc.get("deps", ())))


class Store:
    """An open log. Use `Store.open(path, write=...)`; close it (or use `with`) when done."""

    def __init__(self, env: lmdb.Environment, path: Path, writable: bool, needed: int = 0,
                 max_body: int = DEFAULT_MAX_BODY) -> None:
        self._env = env
        self.path = path
        self.writable = writable
        self.max_body = max_body  # no stored body decompresses to more (a bomb costs what it would on the wire)
        self._fd = os.open(path / "data.mdb", os.O_RDONLY)
        self._needed = needed  # bytes the data file must keep: reading past its end is a SIGBUS
        self._record_lock: Any = None
        self._meta = env.open_db(b"meta", create=writable)
        self._bodies = env.open_db(b"bodies", create=writable)
        self._exchanges = env.open_db(b"exchanges", create=writable)
        self._recorded = env.open_db(b"recorded", create=writable)
        self._outcomes: Any = self._optional_db(b"outcomes")  # stores written before outcome rows were kept
        self._dicts: Any = self._optional_db(b"dicts")  # and before dictionaries
        self._rindex: Any = self._optional_db(b"rindex")  # and before the replay index had its lookups
        self._codec = codec.Codec(self._load_dict)
        self._keys: dict[str, bytes] = {}  # kind (body, record) -> the dictionary new values use
        self._samples: dict[str, list[bytes]] = {"body": [], "record": []}
        # session -> (request sha256, request, response sha256, response, depth) of its last exchange
        self._chains: OrderedDict[str, tuple[bytes, bytes, bytes, bytes, int]] = OrderedDict()
        self._chain_next: tuple[str, tuple[bytes, bytes, bytes, bytes, int]] | None = None
        self._refs: OrderedDict[bytes, bytes] = OrderedDict()  # verified bodies others refer to (an LRU)
        self._training: dict[str, tuple[threading.Thread, list[bytes | None]]] = {}
        self._batch: list[tuple[str, Mapping[str, bytes], RecordedEntry | None]] | None = None
        self._batch_size = self._batch_base = 0

    def _optional_db(self, name: bytes) -> Any:
        try:
            return self._env.open_db(name, create=self.writable)
        except lmdb.NotFoundError:
            return None

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, write: bool, create: bool = False,
             max_body: int = DEFAULT_MAX_BODY) -> Store:
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
                map_size=max(_INITIAL_MAP, data.stat().st_size if data.exists() else 0),
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
            store = cls(env, p, write, needed, max_body)
        except lmdb.Error as exc:
            env.close()
            raise StoreError(f"{p} is an LMDB environment but not an nfproxy store ({exc})") from exc
        try:
            fmt = store.meta("format")
            if fmt is None and write:
                store.set_meta("format", FORMAT)
                store.set_meta("replay_index", replay_index.VERSION)  # complete from the first exchange on
            elif fmt in LEGACY_FORMATS and write:  # its values stay readable as they are: only the mark changes
                store.set_meta("format", FORMAT)
                store.set_meta("migrated_from", fmt)
            elif fmt != FORMAT and fmt not in LEGACY_FORMATS:
                newer = isinstance(fmt, str) and fmt.startswith("noisefloor-log/")
                raise StoreError(f"{p} is not an nfproxy store (format {fmt!r}); point --store at one made by nfproxy"
                                 if not newer else f"{p} is a store of format {fmt}, newer than this nfproxy reads "
                                 f"({FORMAT}); upgrade noisefloor")
            store._keys = {k: bytes.fromhex(v) for k, v in (store.meta("dicts") or {}).items()}
        except BaseException:
            store.close()
            raise
        return store

    @property
    def format(self) -> str | None:
        return self.meta("format")

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
        if self._batch:
            self._flush()
        if self._training:  # a dictionary trained on this run's traffic is kept for the next one
            try:
                self._trained(wait=True)
            except StoreError:
                pass  # a store that cannot take it now is reported by the writes that follow
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
    def _reading(self, what: str = "") -> Iterator[None]:
        """Every read: refuse a file cut short under us (reading past its end would be a SIGBUS),
        and turn damage into one StoreError that names the store, what was read, and what to do."""
        self._check_intact()
        try:
            yield
        except StoreError:
            raise
        except _DAMAGE as exc:
            raise StoreError(f"store {self.path} is damaged{' (' + what + ')' if what else ''}: "
                             f"{exc.__class__.__name__}: {exc}; restore it from a copy or record it again") from None

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

    def bind_rules(self, rules_id: str, described: dict[str, Any], also: tuple[str, ...] = ()) -> None:
        """Store the rule set on first use; refuse a different one afterwards (`also`: earlier ids
        of the same keying, which a store recorded before may carry)."""
        have = self.meta("rules_id")
        if have is None:
            if not self.writable:
                return
            self.set_meta("rules_id", rules_id)
            self.set_meta("rules", described)
            return
        if have != rules_id and have not in also:
            raise StoreError(
                f"store {self.path} was recorded with normalization rules {have} "
                f"({json.dumps(self.meta('rules'), sort_keys=True)}) but this run uses {rules_id}; "
                "pass the same --ignore-field flags as the recording, or use a new --store"
            )

    # -- bodies --------------------------------------------------------------------------------

    def body(self, digest: str | None, *, size: int | None = None, exchange_id: int | None = None,
             part: str = "", _depth: int = 0) -> bytes | None:
        """A stored body, verified: present, within its recorded `size` and the store's max_body,
        and hashing to `digest`. Anything else is a StoreError naming the store and the exchange."""
        if digest is None:
            return None
        if _depth > _MAX_REF_DEPTH:
            raise StoreError(f"store {self.path}: body {digest[:16]} is compressed against a chain of more than "
                             f"{_MAX_REF_DEPTH} bodies (damaged: a cycle?); restore the store from a copy")
        where = " ".join(x for x in (f"exchange {exchange_id}" if exchange_id is not None else "",
                                     f"{part} body" if part else "body", digest[:16]) if x)
        limit = self.max_body if size is None else min(size, self.max_body)
        with self._reading(where), self._env.begin(db=self._bodies) as txn:
            raw = txn.get(bytes.fromhex(digest))
            if raw is None:
                if digest == _EMPTY_SHA256:
                    return b""
                raise StoreError(f"store {self.path}: {where} is missing; restore the store from a copy or "
                                 "record it again")
            try:
                data = self._codec.decode(raw, limit, self._resolver(_depth, exchange_id))
            except codec.TooLarge as exc:
                bound = ("its recorded size" if size is not None and size <= self.max_body
                         else f"--max-body-mb {self.max_body >> 20}")
                raise StoreError(f"store {self.path}: {where} decompresses past {bound} ({exc}): damaged or "
                                 "planted; restore the store from a copy") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise StoreError(f"store {self.path}: {where} does not match its sha256 (tampered or damaged); "
                             "restore the store from a copy or record it again")
        return data

    def _resolver(self, depth: int, exchange_id: int | None) -> Callable[[bytes], bytes]:
        """Referenced bodies, verified; the last few are kept, since a session's next request
        refers to what its previous one did (a chain is then decoded once, not once per link)."""
        def resolve(digest: bytes) -> bytes:
            data = self._refs.get(digest)
            if data is not None:
                self._refs.move_to_end(digest)
                return data
            data = self.body(digest.hex(), exchange_id=exchange_id, part="referenced", _depth=depth + 1)
            assert data is not None
            self._refs[digest] = data
            if len(self._refs) > _REF_CACHE:
                self._refs.popitem(last=False)
            return data

        return resolve

    def part_body(self, part: Mapping[str, Any] | None, exchange_id: int | None = None, name: str = "") -> bytes | None:
        """The verified body of a stored request or response (its digest and recorded size)."""
        if not part:
            return None
        return self.body(part.get("body"), size=part.get("body_size"), exchange_id=exchange_id, part=name)

    def bodies(self) -> Iterator[bytes]:
        """Every stored body, decompressed and verified (for audits: what exactly is on disk)."""
        for _, data in self.stored_bodies():
            yield data

    def stored_bodies(self, encoded: bool = False) -> Iterator[Any]:
        """(sha256, bytes) of every stored body in digest order, verified; with `encoded`, also the
        value as stored (compact rewrites them)."""
        with self._reading("bodies"), self._env.begin(db=self._bodies, buffers=False) as txn:
            for digest, raw in txn.cursor():
                data = self._codec.decode(raw, self.max_body, self._resolver(0, None))
                if hashlib.sha256(data).digest() != digest:
                    raise StoreError(f"store {self.path}: body {digest.hex()[:16]} does not match its sha256 "
                                     "(tampered or damaged); restore the store from a copy")
                yield (digest, data, raw) if encoded else (digest, data)

    def body_count(self) -> int:
        with self._reading(), self._env.begin(db=self._bodies) as txn:
            return txn.stat(self._bodies)["entries"]

    def raw_table(self, name: str) -> Iterator[tuple[bytes, bytes]]:
        """A table's keys and values as stored (meta, recorded, outcomes: compact copies them)."""
        db = {"meta": self._meta, "recorded": self._recorded, "outcomes": self._outcomes}[name]
        if db is None:
            return
        with self._reading(name), self._env.begin(db=db, buffers=False) as txn:
            yield from txn.cursor()

    def raw_bodies(self, digests: list[str]) -> list[bytes | None]:
        """`raw_body` of several, in one read."""
        with self._reading(), self._env.begin(db=self._bodies, buffers=False) as txn:
            return [txn.get(bytes.fromhex(d)) for d in digests]

    def raw_body(self, digest: str) -> bytes | None:
        """A body as stored (encoded): merging copies it without recompressing (with `dictionary_of`)."""
        with self._reading(), self._env.begin(db=self._bodies, buffers=False) as txn:
            return txn.get(bytes.fromhex(digest))

    def decoded_body(self, part: Mapping[str, Any], exchange_id: int | None = None, name: str = "") -> bytes | None:
        """A stored request or response body, verified, with its Content-Encoding undone."""
        raw = self.part_body(part, exchange_id, name)
        if raw is None:
            return None
        encoding = header(part["headers"], "content-encoding")
        return decode_body(raw, encoding)[0]

    def readable_body(self, part: Mapping[str, Any], exchange_id: int | None = None, name: str = "") -> Any:
        """A body for people (show, log --json, export): verified, decoded, parsed when it is JSON,
        text when it is UTF-8, else {"base64": ...}; None when there is none."""
        data = self.decoded_body(part, exchange_id, name)
        if not data:
            return None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(data).decode()}
        try:
            return json.loads(text)
        except ValueError:
            return text

    # -- dictionaries --------------------------------------------------------------------------

    def _load_dict(self, key: bytes) -> bytes | None:
        if self._dicts is None:
            return None
        with self._env.begin(db=self._dicts, buffers=False) as txn:
            data = txn.get(key)
        if data is not None and codec.dict_key(data) != key:
            raise ValueError(f"compression dictionary {key.hex()} does not match its hash")
        return data

    def dictionary(self, key: bytes) -> bytes | None:
        with self._reading("dictionaries"):
            return self._load_dict(key)

    def add_dictionary(self, data: bytes, kind: str | None = None) -> bytes:
        """Store a dictionary (content-addressed); with `kind`, new values of that kind use it."""
        key = codec.dict_key(data)

        def put(txn: lmdb.Transaction) -> None:
            txn.put(key, data, db=self._dicts, overwrite=False)
            if kind is not None:
                chosen = {**{k: v.hex() for k, v in self._keys.items()}, kind: key.hex()}
                txn.put(b"dicts", json.dumps(chosen).encode(), db=self._meta)

        self._write(put)
        if kind is not None:
            self._keys[kind] = key
        return key

    def _sample(self, kind: str, data: bytes) -> None:
        """Keep the first values of a kind; once there are enough, train its dictionary in a thread
        (zstd releases the GIL: the requests going on meanwhile are not held up; `nfproxy compact`
        retrains on the whole store). It is used from the first write after it is ready."""
        samples = self._samples[kind]
        if kind in self._keys or kind in self._training or not self.writable or len(data) > _SAMPLE_MAX or not data:
            return
        samples.append(bytes(data))
        if len(samples) >= TRAIN_AFTER:
            self._samples[kind] = []
            result: list[bytes | None] = []
            thread = threading.Thread(target=lambda: result.append(codec.train(samples)), daemon=True,
                                      name=f"nfproxy-train-{kind}")
            self._training[kind] = (thread, result)
            thread.start()

    def _trained(self, wait: bool = False) -> None:
        """Install the dictionaries whose training has finished (all of them, with `wait`)."""
        for kind, (thread, result) in list(self._training.items()):
            if wait:
                thread.join()
            if thread.is_alive():
                continue
            del self._training[kind]
            trained = result[0] if result else None
            if trained is None:
                self._keys.setdefault(kind, b"")  # untrainable: plain zstd from here on
            else:
                self.add_dictionary(trained, kind)

    # -- exchanges -----------------------------------------------------------------------------

    def append(
        self,
        record: dict[str, Any] | str,
        bodies: Mapping[str, bytes],
        recorded: RecordedEntry | None,
    ) -> int:
        """Write one exchange atomically; returns the new id.

        `record` is a dict or its JSON text (a non-empty object, without "id"); `bodies` maps sha256
        hex to bytes. Inside `batch()`, the exchange is committed with the batch (the id is known now).
        """
        text = record if isinstance(record, str) else json.dumps(record)
        self._learn(text, bodies)
        if self._batch is None:
            return self._commit([(text, bodies, recorded)])[0]
        self._batch.append((text, bodies, recorded))
        new_id = self._batch_base + len(self._batch)
        if len(self._batch) >= self._batch_size:
            self._flush()
        return new_id

    @contextmanager
    def batch(self, size: int = 100) -> Iterator[None]:
        """Appends inside commit `size` at a time, in one transaction each, rather than one each:
        for bulk writers (import, benchmarks), never for a proxy, which commits an exchange before
        its answer is released. What was appended is committed when the block ends, even by an error."""
        if self._batch is not None:
            yield
            return
        self._batch, self._batch_size = [], size
        self._batch_base = self.last_id()
        try:
            yield
        finally:
            try:
                self._flush()
            finally:
                self._batch = None

    def _flush(self) -> None:
        if self._batch:
            items, self._batch = self._batch, []
            ids = self._commit(items)
            if ids[0] != self._batch_base + 1:
                raise StoreError(f"store {self.path} was written by another process during a batch; record it again")
            self._batch_base = ids[-1]

    def _commit(self, items: list[tuple[str, Mapping[str, bytes], RecordedEntry | None]]) -> list[int]:
        """Exchanges in one transaction. A session's next request is compressed against bodies
        committed before it, so the chain links this transaction set are undone if it is not."""
        undo: list[tuple[str, Any]] = []

        def rollback() -> None:
            for session, old in reversed(undo):
                if old is None:
                    self._chains.pop(session, None)
                else:
                    self._chains[session] = old
            undo.clear()

        def write(txn: lmdb.Transaction) -> list[int]:
            rollback()  # a retry after the map grew starts again
            ids = []
            for text, bodies, recorded in items:
                self._chain_next = None
                ids.append(self._append(txn, text, bodies, recorded, chain=True))
                if self._chain_next is not None:
                    session, link = self._chain_next
                    undo.append((session, self._chains.get(session)))
                    self._chains[session] = link
                    self._chains.move_to_end(session)
                    if len(self._chains) > _CHAINS:
                        self._chains.popitem(last=False)  # a lost link costs compression only
            return ids

        try:
            return self._write(write)
        except BaseException:
            rollback()
            raise

    def append_many(self, items: list[tuple[dict[str, Any], Mapping[str, bytes], RecordedEntry | None]]) -> None:
        """Several exchanges in one transaction."""
        texts = [(r if isinstance(r, str) else json.dumps(r), b, e) for r, b, e in items]
        for text, bodies, _ in texts:
            self._learn(text, bodies)
        self._write(lambda txn: [self._append(txn, *item) for item in texts])

    def _learn(self, text: str, bodies: Mapping[str, bytes]) -> None:
        if self._training:
            self._trained()
        if len(self._keys) < 2 and self.writable:
            self._sample("record", text.encode())
            for data in bodies.values():
                self._sample("body", data)

    def absorb(self, raw_bodies: Mapping[str, bytes | None],
               items: list[tuple[dict[str, Any] | str, RecordedEntry | None]],
               source: Store | None = None) -> tuple[list[int], int]:
        """Merge: exchanges from another store with its encoded bodies (and the dictionaries they
        need, from `source`), in one transaction. Returns the new ids and how many bodies were new here."""
        needed = {k for raw in raw_bodies.values() if raw and (k := self._codec.dictionary_of(raw))}
        dicts = {}
        for key in needed:
            data = source.dictionary(key) if source is not None else None
            if data is None:
                raise StoreError(f"store {source.path if source else '?'}: compression dictionary {key.hex()} "
                                 "is missing; restore the store from a copy")
            dicts[key] = data
        texts = [(record if isinstance(record, str) else json.dumps(record), entry) for record, entry in items]
        for text, _ in texts:
            self._learn(text, {})

        def write(txn: lmdb.Transaction) -> tuple[list[int], int]:
            for key, data in dicts.items():
                txn.put(key, data, db=self._dicts, overwrite=False)
            fresh = 0
            todo = [(bytes.fromhex(h), raw) for h, raw in raw_bodies.items()]
            while todo:
                digest, raw = todo.pop()
                if raw and txn.get(digest, db=self._bodies) is None:
                    txn.put(digest, raw, db=self._bodies)
                    fresh += 1
                    # a body compressed against others needs them here too (another session's, maybe)
                    for ref in codec.Codec.refs_of(raw):
                        if txn.get(ref, db=self._bodies) is None and ref.hex() not in raw_bodies:
                            if source is None or (ref_raw := source.raw_body(ref.hex())) is None:
                                raise StoreError(f"store {source.path if source else '?'}: body {ref.hex()[:16]}, "
                                                 "which another body is compressed against, is missing")
                            for key in filter(None, [self._codec.dictionary_of(ref_raw)]):
                                if txn.get(key, db=self._dicts) is None and source.dictionary(key):
                                    txn.put(key, source.dictionary(key), db=self._dicts)
                            todo.append((ref, ref_raw))
            return [self._append(txn, text, {}, entry) for text, entry in texts], fresh

        return self._write(write)

    def _append(
        self,
        txn: lmdb.Transaction,
        record: dict[str, Any] | str,
        bodies: Mapping[str, bytes],
        recorded: RecordedEntry | None,
        chain: bool = False,
    ) -> int:
        body_key = self._keys.get("body") or None
        request = None
        if chain and recorded is not None and bodies:
            m = _FIRST_BODY.search(record if isinstance(record, str) else json.dumps(record))
            request = m.group(1) if m else None
        link = self._chains.get(recorded.session) if request is not None and recorded is not None else None
        depth = -1  # the request's depth in its chain; -1: already stored, depth unknown
        for hexdigest, data in bodies.items():
            if not data:
                continue
            digest = bytes.fromhex(hexdigest)
            if txn.get(digest, db=self._bodies) is not None:  # stored once: skip compressing a known body
                continue
            if hexdigest == request and link is not None and link[4] < CHAIN_DEPTH:
                # most of a request is the previous request and answer of its session
                value = self._codec.encode_against(data, [(link[0], link[1]), (link[2], link[3])])
                depth = link[4] + 1
            else:
                value = self._codec.encode(data, body_key)
                depth = 0 if hexdigest == request else depth
            txn.put(digest, value, db=self._bodies)
        if request is not None and recorded is not None:
            response = next((h for h in bodies if h != request), None)
            if response is not None and bodies[response]:
                self._chain_next = (recorded.session, (bytes.fromhex(request), bytes(bodies[request]),
                                                       bytes.fromhex(response), bytes(bodies[response]),
                                                       depth if depth >= 0 else CHAIN_DEPTH))
        with txn.cursor(db=self._exchanges) as cur:
            new_id = _U64.unpack(cur.key())[0] + 1 if cur.last() else 1
        doc = exchange_record.with_id(record if isinstance(record, str) else json.dumps(record), new_id)
        txn.put(_U64.pack(new_id), self._codec.encode(doc.encode(), self._keys.get("record") or None),
                db=self._exchanges, append=True)
        if recorded is not None:
            entry = {"id": new_id, "key": recorded.key, "session": recorded.session, "occurrence": recorded.occurrence,
                     "seq": recorded.seq, "route": recorded.route, "start": recorded.start, "end": recorded.end}
            if recorded.deps:
                entry["deps"] = list(recorded.deps)
            txn.put(_U64.pack(new_id), json.dumps(entry).encode(), db=self._recorded, append=True)
            if self._rindex is not None:
                for k, v in replay_index.rows(new_id, recorded):
                    txn.put(k, v, db=self._rindex)
        return new_id

    def _decode_record(self, exchange_id: int, raw: bytes) -> Exchange:
        """A stored record, or StoreError naming the store and the exchange: a record that does not
        decode or does not have the record type's fields and types is never used."""
        try:
            ex = parse_record(self._codec.decode(raw, self.max_body))
        except StoreError:
            raise
        except _DAMAGE as exc:
            raise StoreError(f"store {self.path}: exchange {exchange_id} is damaged ({exc.__class__.__name__}: "
                             f"{exc}); restore the store from a copy or record it again") from None
        if ex.id != exchange_id:
            raise StoreError(f"store {self.path}: exchange {exchange_id} is damaged (its record says id {ex.id}); "
                             "restore the store from a copy or record it again")
        return ex

    def exchange(self, exchange_id: int) -> Exchange | None:
        with self._reading(f"exchange {exchange_id}"), self._env.begin(db=self._exchanges) as txn:
            raw = txn.get(_U64.pack(exchange_id))
            return None if raw is None else self._decode_record(exchange_id, raw)

    def exchanges(self, start: int = 1) -> Iterator[Exchange]:
        """Every exchange in write order (a consistent snapshot), from id `start` on."""
        with self._reading("exchanges"), self._env.begin(db=self._exchanges, buffers=True) as txn:
            cur = txn.cursor()
            if not cur.set_range(_U64.pack(start)):
                return
            for k, raw in cur:
                yield self._decode_record(_U64.unpack(k)[0], raw)

    def heads(self) -> Iterator[Head]:
        """Every exchange's head in write order: what `nfproxy log` and nfanalyze read, at a
        fraction of the cost of whole records (still checked: a record whose head does not have
        the record type's fields is a StoreError naming the exchange)."""
        with self._reading("exchanges"), self._env.begin(db=self._exchanges, buffers=True) as txn:
            for k, raw in txn.cursor():
                try:
                    yield _HEAD_DECODER.decode(self._codec.decode(raw, self.max_body))
                except msgspec.DecodeError:  # JSON msgspec refuses and json reads (a lone surrogate)
                    ex = self._decode_record(_U64.unpack(k)[0], raw)
                    yield msgspec.convert(ex.to_json(), Head)
                except (msgspec.ValidationError, *_DAMAGE) as exc:
                    raise StoreError(f"store {self.path}: exchange {_U64.unpack(k)[0]} is damaged "
                                     f"({exc.__class__.__name__}: {exc}); restore the store from a copy or record "
                                     "it again") from None

    def record_texts_of(self, ids: list[int]) -> list[bytes]:
        """The stored records' JSON bytes of these exchanges, decoded but not parsed, in one read."""
        with self._reading("exchanges"), self._env.begin(db=self._exchanges) as txn:
            out = []
            for i in ids:
                raw = txn.get(_U64.pack(i))
                if raw is None:
                    raise StoreError(f"store {self.path}: exchange {i} is missing; restore it from a copy")
                out.append(self._codec.decode(raw, self.max_body))
            return out

    def record_texts(self, start: int = 1) -> Iterator[tuple[int, bytes]]:
        """(id, the stored record's JSON bytes) in write order, decoded but not parsed: for copying."""
        with self._reading("exchanges"), self._env.begin(db=self._exchanges, buffers=True) as txn:
            cur = txn.cursor()
            if not cur.set_range(_U64.pack(start)):
                return
            for k, raw in cur:
                yield _U64.unpack(k)[0], self._codec.decode(raw, self.max_body)

    def exchanges_after(self, after: int = 0) -> Iterator[Exchange]:
        """Exchanges with an id above `after`, in id order: a cursor, so a reader takes one page of
        a large store without touching the rest (nfview). Stop iterating to end the read."""
        yield from self.exchanges(start=after + 1)

    def recorded_entries(self) -> Iterator[RecordedEntry]:
        with self._reading("replay index"), self._env.begin(db=self._recorded) as txn:
            for _, raw in txn.cursor():
                yield _entry(json.loads(raw))

    # -- replay index lookups (replay_index.py owns their layout) ------------------------------

    def has_replay_index(self) -> bool:
        """Whether every recorded exchange has its lookup rows (stores made since they exist)."""
        return self._rindex is not None and self.meta("replay_index") == replay_index.VERSION

    def recorded_count(self) -> int:
        with self._reading(), self._env.begin(db=self._recorded) as txn:
            return txn.stat(self._recorded)["entries"]

    def recorded_entry(self, exchange_id: int) -> RecordedEntry | None:
        with self._reading(), self._env.begin(db=self._recorded) as txn:
            raw = txn.get(_U64.pack(exchange_id))
            return None if raw is None else _entry(json.loads(raw))

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

    def index_get(self, key: bytes) -> bytes | None:
        with self._reading(), self._env.begin(db=self._rindex, buffers=False) as txn:
            return txn.get(key)

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
                    out.append(_entry(json.loads(raw)))
            return out

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
        with self._reading("outcome rows"), self._env.begin(db=self._outcomes) as txn:
            return [json.loads(v) for _, v in txn.cursor()]

    def copy_to(self, folder: Path) -> None:
        """A compact copy of this store (a consistent snapshot) in an empty folder: a shard to ship."""
        with self._reading():
            self._env.copy(str(folder), compact=True)

    def __len__(self) -> int:
        with self._reading(), self._env.begin(db=self._exchanges) as txn:
            return txn.stat(self._exchanges)["entries"]

    def last_id(self) -> int:
        with self._reading(), self._env.begin(db=self._exchanges) as txn, txn.cursor() as cur:
            return _U64.unpack(cur.key())[0] if cur.last() else 0

    def usage(self) -> dict[str, int]:
        """Bytes: `used` by pages holding data, `file` on disk (the reserved map)."""
        info, st = self._env.info(), self._env.stat()
        return {"used": (info["last_pgno"] + 1) * st["psize"], "file": os.fstat(self._fd).st_size,
                "map": info["map_size"]}

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
                size = self._env.info()["map_size"]
                size += max(_MIN_STEP, size // _GROWTH)
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
