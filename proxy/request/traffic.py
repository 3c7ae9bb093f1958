"""Plain data for one request/response, shared by the recorder and the replayer.

The mitmproxy addon converts flows into these types, so everything behind it (keys, occurrence
counting, the store) runs and is tested without a proxy.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from noisefloor.proxy import providers
from noisefloor.proxy.request import _stored_copy as stored_copy
from noisefloor.proxy.request import headers as headers_mod
from noisefloor.proxy.request import secrets
from noisefloor.proxy.request.decoding import decode_body
from noisefloor.proxy.request.headers import HOP_BY_HOP
from noisefloor.proxy.request.keys import CanonicalRequest, Rules, canonicalize, sha256_hex
from noisefloor.proxy.request.labels import Labels

if TYPE_CHECKING:
    from noisefloor.proxy.providers.base import Provider


@dataclass(frozen=True)
class RequestData:
    method: str
    url: str  # full URL as the client asked for it (after reverse-proxy rewriting)
    host: str
    path: str  # path with query
    headers: tuple[tuple[str, str], ...]
    raw_body: bytes
    decoded: bytes | None = None  # the body with Content-Encoding undone, when BodyLimit did it already
    # what nfproxy itself changed before keying: {"overrides": {...}, "perturbation": name, "notes": [...]}
    stamp: Mapping[str, Any] = field(default_factory=dict)
    arrived: float = field(default_factory=time.time)

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], body: bytes | None) -> RequestData:
        """A stored request read back (secrets already gone), e.g. to recompute its canonical form."""
        parts = urlsplit(rec["url"])
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        return cls(rec["method"], rec["url"], parts.hostname or "", path, tuple(map(tuple, rec["headers"])), body or b"")

    def header(self, name: str) -> str | None:
        return headers_mod.header(self.headers, name)

    def canonical(self, rules: Rules) -> CanonicalRequest:
        if self.decoded is not None:
            body, note = self.decoded, None
        else:
            body, note = decode_body(self.raw_body, self.header("content-encoding"))
        args = (self.method, self.host, self.path, self.headers, body, rules)
        try:
            canon = _canonical(*args, providers.generation()) if len(body) <= _REMEMBERED_BODY else canonicalize(*args)
        except TypeError:  # headers given as lists: not a cache key
            canon = canonicalize(*args)
        return replace(canon, notes=canon.notes + (note,)) if note else canon

    @cached_property
    def secret_values(self) -> list[str]:
        body = self.decoded if self.decoded is not None else self.raw_body  # form fields named like a secret
        return secrets.secret_values(self.url, self.headers, body if self.header("content-type") else b"")

    @cached_property
    def _stored(self) -> tuple[bytes, bool]:
        return stored_copy.request_body(self.raw_body, self.decoded, self.header("content-encoding"),
                                        self.secret_values)

    @property
    def stored_body(self) -> bytes:
        """The request body as written to the log (secret values erased; usually unchanged)."""
        return self._stored[0]

    @cached_property
    def stored_digest(self) -> str:
        return sha256_hex(self.stored_body)

    def record(self) -> dict[str, Any]:
        """The stored request: secrets gone, body by hash."""
        headers = secrets.scrub_headers(self.headers, self.secret_values)
        if self._stored[1]:  # stored decoded: the encoding no longer describes it
            headers = headers_mod.without(headers, "content-encoding", "content-length")
        return {
            "method": secrets.erase_label(self.method, self.secret_values),
            "url": secrets.scrub_url(self.url, self.secret_values),
            "headers": headers,
            "body": self.stored_digest if self.raw_body else None,
            "body_size": len(self.raw_body),
        }


_REMEMBERED_BODY = 32 << 10  # larger bodies are keyed afresh (the cache holds them as its keys)


@lru_cache(maxsize=512)
def _canonical(method: str, host: str, path: str, headers: tuple[tuple[str, str], ...], body: bytes, rules: Rules,
               generation: tuple[int, int]) -> CanonicalRequest:
    """A request asked again (a rerun's replicates, a retry) is keyed from its remembered canonical
    form: `canonicalize` is a pure function of these arguments and of the registered providers
    (`generation`), and what it returns is only read."""
    return canonicalize(method, host, path, headers, body, rules)


@dataclass(frozen=True)
class ResponseData:
    status: int
    headers: tuple[tuple[str, str], ...]
    raw_body: bytes  # as sent on the wire (still content-encoded), so replay is byte-identical
    # streamed: (offset_ms, length) per chunk; an offset is None where timing was not recorded
    layout: tuple[tuple[float | None, int], ...] | None = None
    partial: bool = False  # the stream ended early (client gone, upstream stalled)

    @property
    def timed(self) -> bool:
        """A stream whose every chunk has its recorded offset (`--record-timing`)."""
        return self.layout is not None and all(t is not None for t, _ in self.layout)

    def header(self, name: str) -> str | None:
        return headers_mod.header(self.headers, name)

    @cached_property
    def decoded_body(self) -> bytes:
        return decode_body(self.raw_body, self.header("content-encoding"))[0]

    @cached_property
    def digest(self) -> str:
        return sha256_hex(self.raw_body)

    @cached_property
    def wire_headers(self) -> tuple[tuple[bytes, bytes], ...]:
        """Header fields as a proxy sends them; cached with a replayed answer that is served again."""
        return tuple((k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape")) for k, v in self.headers)

    def without(self, values: list[str], provider: Provider | None = None) -> ResponseData:
        """A copy safe to store: caller secrets echoed back are erased (`stored_copy.response`; a
        stream's texts as `provider` assembles them)."""
        return stored_copy.response(self, values, provider)

    def record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "status": self.status,
            "headers": secrets.scrub_headers(self.headers),
            "body": self.digest if self.raw_body else None,
            "body_size": len(self.raw_body),
        }
        if self.layout is not None:
            rec["chunks"] = [list(c) for c in self.layout]
            rec["partial"] = self.partial
        return rec

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], body: bytes | None) -> ResponseData:
        """Rebuild a replayable response: redacted and hop-by-hop headers dropped, length fixed."""
        kept = tuple(
            (k, v)
            for k, v in rec["headers"]
            if v != secrets.REDACTED and k.lower() not in HOP_BY_HOP and k.lower() != "content-length"
        )
        body = body or b""
        layout = rec.get("chunks")
        if layout is not None:
            return cls(rec["status"], kept, body, tuple((None if t is None else float(t), int(n)) for t, n in layout),
                       rec.get("partial", False))
        return cls(rec["status"], kept + (("content-length", str(len(body))),), body)


@dataclass
class Prepared:
    """A request after keying, waiting for its response."""

    request: RequestData
    labels: Labels
    canonical: CanonicalRequest
    key: str
    occurrence: int
    seq: int
    started: float


class Counters:
    """Per-session occurrence of each key and arrival sequence, assigned at request arrival.

    Arrival order (not completion order) is what replay reproduces, so the n-th identical request
    of a session is the n-th one to arrive. A session the store already holds continues its
    numbering: `earlier(session)` gives its recorded (key, occurrence, seq), asked once, when the
    session's first request of this run arrives, so start-up does not read the whole store.
    """

    def __init__(self, earlier: Callable[[str], Iterable[tuple[str, int, int]]] | None = None) -> None:
        self._occ: dict[tuple[str, str], int] = defaultdict(int)
        self._seq: dict[str, int] = defaultdict(int)
        self._earlier = earlier
        self._known: set[str] = set()

    def seed(self, entries: Iterable[tuple[str, str, int, int]]) -> None:
        """Continue numbering after what a store already holds: (session, key, occurrence, seq)."""
        for session, key, occurrence, seq in entries:
            self._occ[(session, key)] = max(self._occ[(session, key)], occurrence + 1)
            self._seq[session] = max(self._seq[session], seq + 1)

    def next(self, session: str, key: str) -> tuple[int, int]:
        if self._earlier is not None and session not in self._known:
            self._known.add(session)
            self.seed((session, k, occ, seq) for k, occ, seq in self._earlier(session))
        occ = self._occ[(session, key)]
        seq = self._seq[session]
        self._occ[(session, key)] = occ + 1
        self._seq[session] = seq + 1
        return occ, seq


def prepare(request: RequestData, labels: Labels, rules: Rules, counters: Counters) -> Prepared:
    """Key and number a request. Its labels and keying notes (a client writes both: an x-nf-task
    header, a Content-Encoding a note quotes) lose the request's secret values here, so every
    record, index row and listing of it, in record and in replay alike, holds them erased."""
    canon = request.canonical(rules)
    values = request.secret_values
    if values:
        labels = secrets.erase_labels(labels, values)
        if canon.notes:
            canon = replace(canon, notes=tuple(secrets.erase_text(n, values) for n in canon.notes))
    key = canon.key
    occurrence, seq = counters.next(labels.session, key)
    return Prepared(request, labels, canon, key, occurrence, seq, request.arrived)
