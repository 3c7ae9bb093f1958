"""The store's body table, read verified: every body a reader gets is present, decompresses
within its recorded size and the store's bound, and hashes to the digest it is stored under
(bodies compressed against others are resolved the same way, a short chain at most).

Written (`Ahead`): the compressor a session's next request body is stored with, made ahead of that
request. What a body is stored as depends on three things besides its bytes: whether it is stored already,
the previous exchange of its session it is compressed against (the chain link, `Store.append`), and
the body dictionary in use. The compressor against a session's last exchange is made once that
exchange is committed and its answer released (`prepare_chain`): the link is known then, the body
it will compress is not, and creating the compressor is most of the work. Whether one was prepared
changes when the work is done, never the bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from noisefloor.proxy.request.decoding import decode_body
from noisefloor.proxy.request.headers import header
from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store._tables import Tables
from noisefloor.proxy.store.env import StoreError

_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_MAX_REF_DEPTH = 32  # a body compressed against others is refused past this many levels (a cycle)
_REF_CACHE = 256  # referenced bodies kept decoded
_REF_CACHE_ITEM = 1 << 20  # a larger one is not kept: the cache's memory stays bounded
# one body is compressed against at most this many --max-body-mb of others (a recorder: its
# session's previous request and answer); past it a planted value is refused before the
# references are joined into one buffer
_REF_BODIES = 2


class BodyOverLimit(StoreError):
    """A stored body larger than this reader's --max-body-mb (a recorder with a higher limit kept
    it): a setting to raise, not damage."""


class Bodies:
    """Reading the `bodies` table (a part of Store), every body verified."""

    def __init__(self, tables: Tables, codec: codec.Codec, max_body: int) -> None:
        self.tables, self.codec, self.path, self.max_body = tables, codec, tables.path, max_body
        self._db = tables.db["bodies"]
        self._refs: OrderedDict[bytes, bytes] = OrderedDict()  # verified bodies others refer to (an LRU)

    def get(self, digest: str | None, *, size: int | None = None, exchange_id: int | None = None,
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
        if size is not None and size > self.max_body:  # recorded under a higher limit: not damage, a setting
            raise BodyOverLimit(f"store {self.path}: {where} is {size / (1 << 20):.1f} MiB, over --max-body-mb "
                             f"{self.max_body >> 20}; read it with --max-body-mb {-(-size >> 20)}")
        limit = self.max_body if size is None else size
        with self.tables.reading(where), self.tables.begin(db=self._db) as txn:
            raw = txn.get(bytes.fromhex(digest))
            if raw is None:
                if digest == _EMPTY_SHA256:
                    return b""
                raise StoreError(f"store {self.path}: {where} is missing; restore the store from a copy or "
                                 "record it again")
            try:
                data = self.codec.decode(raw, limit, self._resolver(_depth, exchange_id))
            except codec.TooLarge as exc:
                if size is None and exc.declared is not None:  # no recorded size (a referenced body): its frame's
                    raise self._over_limit(where, exc.declared) from None
                bound = "its recorded size" if size is not None else f"--max-body-mb {self.max_body >> 20}"
                raise StoreError(f"store {self.path}: {where} decompresses past {bound} ({exc}): damaged or "
                                 "planted; restore the store from a copy") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise StoreError(f"store {self.path}: {where} does not match its sha256 (tampered or damaged); "
                             "restore the store from a copy or record it again")
        return data

    def _over_limit(self, where: str, declared: int) -> BodyOverLimit:
        """A body whose frame declares more than --max-body-mb: the limit it was recorded under,
        or damage (a planted bomb declares what it likes)."""
        return BodyOverLimit(f"store {self.path}: {where} decompresses past --max-body-mb {self.max_body >> 20} "
                             f"(declares {declared / (1 << 20):.1f} MiB): read it with --max-body-mb "
                             f"{-(-declared >> 20)} if the store was recorded under that limit, else it is damaged "
                             "or planted; restore it from a copy")

    def _resolver(self, depth: int, exchange_id: int | None) -> Callable[[bytes], bytes]:
        """Referenced bodies, verified; the last few are kept, since a session's next request
        refers to what its previous one did (a chain is then decoded once, not once per link)."""
        left = [_REF_BODIES * self.max_body]  # bytes of referenced bodies this value may still join

        def resolve(digest: bytes) -> bytes:
            data = self._refs.get(digest)
            if data is not None:
                self._refs.move_to_end(digest)
            else:
                data = self.get(digest.hex(), exchange_id=exchange_id, part="referenced", _depth=depth + 1)
                assert data is not None
                if len(data) <= _REF_CACHE_ITEM:
                    self._refs[digest] = data
                    if len(self._refs) > _REF_CACHE:
                        self._refs.popitem(last=False)
            left[0] -= len(data)
            if left[0] < 0:
                raise StoreError(f"store {self.path}: a body is compressed against more than {_REF_BODIES} x "
                                 f"--max-body-mb {self.max_body >> 20} of other bodies (damaged or planted); "
                                 "restore the store from a copy")
            return data

        return resolve

    def of_part(self, part: Mapping[str, Any] | None, exchange_id: int | None = None, name: str = "") -> bytes | None:
        """The verified body of a stored request or response (its digest and recorded size)."""
        if not part:
            return None
        return self.get(part.get("body"), size=part.get("body_size"), exchange_id=exchange_id, part=name)

    def all(self) -> Iterator[bytes]:
        """Every stored body, decompressed and verified (for audits: what exactly is on disk)."""
        for _, data in self.stored():
            yield data

    def stored(self, encoded: bool = False) -> Iterator[Any]:
        """(sha256, bytes) of every stored body in digest order, verified; with `encoded`, also the
        value as stored (compact rewrites them)."""
        with self.tables.reading("bodies"), self.tables.begin(db=self._db, buffers=False) as txn:
            for digest, raw in txn.cursor():
                try:
                    data = self.codec.decode(raw, self.max_body, self._resolver(0, None))
                except codec.TooLarge as exc:
                    if exc.declared is None:
                        raise
                    raise self._over_limit(f"body {digest.hex()[:16]}", exc.declared) from None
                if hashlib.sha256(data).digest() != digest:
                    raise StoreError(f"store {self.path}: body {digest.hex()[:16]} does not match its sha256 "
                                     "(tampered or damaged); restore the store from a copy")
                yield (digest, data, raw) if encoded else (digest, data)

    def raw_many(self, digests: list[bytes]) -> list[bytes | None]:
        """`raw` of several (their 32-byte digests), in one read."""
        with self.tables.reading(), self.tables.begin(db=self._db, buffers=False) as txn:
            return [txn.get(d) for d in digests]

    def raw(self, digest: str) -> bytes | None:
        """A body as stored (encoded): merging copies it without recompressing (with `dictionary_of`)."""
        with self.tables.reading(), self.tables.begin(db=self._db, buffers=False) as txn:
            return txn.get(bytes.fromhex(digest))

    def decoded(self, part: Mapping[str, Any], exchange_id: int | None = None, name: str = "") -> bytes | None:
        """A stored request or response body, verified, with its Content-Encoding undone."""
        raw = self.of_part(part, exchange_id, name)
        if raw is None:
            return None
        encoding = header(part["headers"], "content-encoding")
        return decode_body(raw, encoding)[0]

    def readable(self, part: Mapping[str, Any], exchange_id: int | None = None, name: str = "") -> Any:
        """A body for people (show, log --json, export): verified, decoded, parsed when it is JSON,
        text when it is UTF-8, else {"base64": ...}; None when there is none."""
        data = self.decoded(part, exchange_id, name)
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


CHAIN_DEPTH = 6  # a request is compressed against its session's previous exchange at most this deep
# compressors made for sessions' next requests (an LRU: one holds a zstd context, ~65 kB for a
# chat turn, ~150 kB at the size bound: 10 MB at most); with more sessions interleaved than this,
# one is evicted before its request comes
_PREPARED = 64
_PREPARED_BYTES = 128 << 10  # a larger link is left to the write: compressing against it costs more than the set-up

Link = tuple[bytes, bytes, bytes, bytes, int]  # a session's last (request sha256, request, answer sha256, answer, depth)


class Ahead:
    """Sessions' chain links and the compressors prepared for their next request bodies (a part of Store)."""

    def __init__(self, coder: codec.Codec, tables: Tables) -> None:
        self.codec, self.tables = coder, tables
        self.chains: OrderedDict[str, Link] = OrderedDict()  # session -> its last exchange's link (an LRU)
        self._prepared: OrderedDict[str, tuple[Link, codec.Against]] = OrderedDict()  # session -> a compressor

    def prepare_chain(self, session: str) -> None:
        """Make the compressor a request of `session` would be compressed with against its last
        exchange, before that request arrives (a proxy calls this once the answer is released).
        Never fails: it only saves the work of a write, which makes its own if none is here."""
        link = self.chains.get(session)
        got = self._prepared.pop(session, None)
        if link is None or link[4] >= CHAIN_DEPTH or not self.tables.writable or len(link[1]) + len(link[3]) > _PREPARED_BYTES:
            return
        if got is not None and got[0] is link:  # its last exchange set no new link: still the one
            self._prepared[session] = got
            return
        try:
            against = codec.Against(_refs(link)).warmed()
        except Exception:  # noqa: BLE001 - the write compresses it, and reports what fails where it fails
            return
        self._prepared[session] = (link, against)
        self._prepared.move_to_end(session)
        if len(self._prepared) > _PREPARED:
            self._prepared.popitem(last=False)

    def encoded(self, data: bytes, link: Link | None, key: bytes | None) -> bytes:
        """A request body's value: against its session's previous request and answer while the
        chain is short enough (with the compressor `prepare_chain` made, if it made one for this
        link), else with the body dictionary."""
        if link is None or link[4] >= CHAIN_DEPTH:
            return self.codec.encode(data, key)
        # most of a request is the previous request and answer of its session
        against = next((a for known, a in self._prepared.values() if known is link), None)
        return (against or codec.Against(_refs(link))).encode(data)


def _refs(link: Link) -> list[tuple[bytes, bytes]]:
    return [(link[0], link[1]), (link[2], link[3])]
