"""Plain data for one request/response, shared by the recorder and the replayer.

The mitmproxy addon converts flows into these types, so everything behind it (keys, occurrence
counting, the store) runs and is tested without a proxy.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any
from urllib.parse import unquote, urlsplit

from noisefloor.proxy import headers as headers_mod
from noisefloor.proxy import secrets
from noisefloor.proxy.keys import CanonicalRequest, Rules, canonicalize, decode_body, sha256_hex

LABEL_HEADERS = {
    "x-nf-session": "session",
    "x-nf-task": "task",
    "x-nf-replicate": "replicate",
    "x-nf-condition": "condition",
    "x-nf-replay-from": "replay_from",
}
# Labels can also ride in a path prefix, for agents whose headers cannot be set but whose base URL
# can: /_nf/session=s1,task=HumanEval%2F0,replicate=2/v1/chat/completions
LABEL_PREFIX = "/_nf/"
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te"})


@dataclass(frozen=True)
class Labels:
    """Who a request belongs to: one session is one agent run (task x replicate x condition)."""

    session: str
    task: str | None = None
    replicate: str | None = None
    condition: str | None = None
    replay_from: str | None = None  # replay: answer only from this recorded session

    def overlay(self, headers: Mapping[str, str]) -> Labels:
        """Per-request label headers win over the proxy-wide defaults."""
        found = {attr: headers[h] for h, attr in LABEL_HEADERS.items() if headers.get(h)}
        return replace(self, **found) if found else self


def split_label_prefix(path: str) -> tuple[dict[str, str], str]:
    """Labels from a `/_nf/k=v,k=v` path prefix, and the path without it."""
    if not path.startswith(LABEL_PREFIX):
        return {}, path
    head, _, rest = path[len(LABEL_PREFIX):].partition("/")
    labels = {}
    for part in head.split(","):
        k, sep, v = part.partition("=")
        if sep and f"x-nf-{k.replace('_', '-')}" in LABEL_HEADERS:
            labels[f"x-nf-{k.replace('_', '-')}"] = unquote(v)
    return labels, "/" + rest


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
        canon = canonicalize(self.method, self.host, self.path, self.headers, body, rules)
        return replace(canon, notes=canon.notes + (note,)) if note else canon

    @cached_property
    def secret_values(self) -> list[str]:
        body = self.decoded if self.decoded is not None else self.raw_body  # form fields named like a secret
        return secrets.secret_values(self.url, self.headers, body if self.header("content-type") else b"")

    @cached_property
    def _stored(self) -> tuple[bytes, bool]:
        """The body as written to the log, and whether it had to be stored decoded: a secret found
        only after undoing Content-Encoding is erased from the decoded bytes."""
        values = self.secret_values
        if not values or not self.raw_body:
            return self.raw_body, False
        encoding = self.header("content-encoding")
        if encoding:
            decoded, note = (self.decoded, None) if self.decoded is not None else decode_body(self.raw_body, encoding)
            if note is None and secrets.contains(decoded, values):
                return secrets.erase(decoded, values), True
        if not secrets.contains(self.raw_body, values):  # the common case: one scan, no copy
            return self.raw_body, False
        return secrets.erase(self.raw_body, values), False

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
            "method": self.method,
            "url": secrets.scrub_url(self.url, self.secret_values),
            "headers": headers,
            "body": self.stored_digest if self.raw_body else None,
            "body_size": len(self.raw_body),
        }


@dataclass(frozen=True)
class ResponseData:
    status: int
    headers: tuple[tuple[str, str], ...]
    raw_body: bytes  # as sent on the wire (still content-encoded), so replay is byte-identical
    layout: tuple[tuple[float, int], ...] | None = None  # streamed: (offset_ms, length) per chunk
    partial: bool = False  # the stream ended early (client gone, upstream stalled)

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

    def without(self, values: list[str]) -> ResponseData:
        """A copy safe to store: caller secrets echoed back (error messages do) are erased from
        every header value and from the body, in every encoded form, after undoing
        Content-Encoding, and in a stream also where the value is split across events.

        Only when a secret is found is the body stored decoded, with Content-Encoding dropped;
        otherwise the wire bytes are kept as they are, so replay stays byte-identical. A stream
        whose body had to change is stored as one chunk.
        """
        if not values:
            return self
        headers = secrets.erase_header_values(self.headers, values)
        if not self.raw_body:
            return self if headers is self.headers else replace(self, headers=headers)
        decoded = self.decoded_body
        whole = secrets.contains(decoded, values)
        if not whole and self.layout is None:  # the common case, on every exchange: one scan
            return self if headers is self.headers else replace(self, headers=headers)
        body = secrets.erase(decoded, values) if whole else decoded
        if self.layout is not None:
            body = secrets.erase_events(body, values) or body
        if body is decoded:
            return self if headers is self.headers else replace(self, headers=headers)
        headers = tuple(headers_mod.without(headers, "content-encoding", "content-length"))
        layout = self.layout
        if layout is not None:
            layout = ((layout[-1][0] if layout else 0.0, len(body)),)
        if layout is None:
            headers += (("content-length", str(len(body))),)
        return ResponseData(self.status, headers, body, layout, self.partial)

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
            return cls(rec["status"], kept, body, tuple((float(t), int(n)) for t, n in layout), rec.get("partial", False))
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
    of a session is the n-th one to arrive.
    """

    def __init__(self) -> None:
        self._occ: dict[tuple[str, str], int] = defaultdict(int)
        self._seq: dict[str, int] = defaultdict(int)

    def seed(self, entries: Iterable[tuple[str, str, int, int]]) -> None:
        """Continue numbering after what a store already holds: (session, key, occurrence, seq)."""
        for session, key, occurrence, seq in entries:
            self._occ[(session, key)] = max(self._occ[(session, key)], occurrence + 1)
            self._seq[session] = max(self._seq[session], seq + 1)

    def next(self, session: str, key: str) -> tuple[int, int]:
        occ = self._occ[(session, key)]
        seq = self._seq[session]
        self._occ[(session, key)] = occ + 1
        self._seq[session] = seq + 1
        return occ, seq


def prepare(request: RequestData, labels: Labels, rules: Rules, counters: Counters) -> Prepared:
    canon = request.canonical(rules)
    key = canon.key
    occurrence, seq = counters.next(labels.session, key)
    return Prepared(request, labels, canon, key, occurrence, seq, request.arrived)
