"""The store's body table, read verified: every body a reader gets is present, decompresses
within its recorded size and the store's bound, and hashes to the digest it is stored under
(bodies compressed against others are resolved the same way, a short chain at most)."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from noisefloor.proxy.request.decoding import decode_body
from noisefloor.proxy.request.headers import header
from noisefloor.proxy.store import _codec as codec
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
    """Reading the `bodies` table (a part of Store: it brings the environment, codec and checks)."""

    _env: Any
    _bodies: Any
    _codec: codec.Codec
    _refs: Any
    path: Any
    max_body: int
    _reading: Any

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
        if size is not None and size > self.max_body:  # recorded under a higher limit: not damage, a setting
            raise BodyOverLimit(f"store {self.path}: {where} is {size / (1 << 20):.1f} MiB, over --max-body-mb "
                             f"{self.max_body >> 20}; read it with --max-body-mb {-(-size >> 20)}")
        limit = self.max_body if size is None else size
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
                data = self.body(digest.hex(), exchange_id=exchange_id, part="referenced", _depth=depth + 1)
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
                try:
                    data = self._codec.decode(raw, self.max_body, self._resolver(0, None))
                except codec.TooLarge as exc:
                    if exc.declared is None:
                        raise
                    raise self._over_limit(f"body {digest.hex()[:16]}", exc.declared) from None
                if hashlib.sha256(data).digest() != digest:
                    raise StoreError(f"store {self.path}: body {digest.hex()[:16]} does not match its sha256 "
                                     "(tampered or damaged); restore the store from a copy")
                yield (digest, data, raw) if encoded else (digest, data)

    def body_count(self) -> int:
        with self._reading(), self._env.begin(db=self._bodies) as txn:
            return txn.stat(self._bodies)["entries"]

    def raw_bodies(self, digests: list[bytes]) -> list[bytes | None]:
        """`raw_body` of several (their 32-byte digests), in one read."""
        with self._reading(), self._env.begin(db=self._bodies, buffers=False) as txn:
            return [txn.get(d) for d in digests]

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
