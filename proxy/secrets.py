"""What counts as a secret, and how it is removed before anything is written or printed.

Secrets are removed from the stored copy only; the forwarded request keeps them (the provider
needs the key). They are also never part of the content address, so rotating a key keeps a
recording valid.

A secret value is searched for in every form it could take in a body: as sent, URL-encoded
(`%2B` and `+` spellings), with `+` read as a space (a decoded query string), and JSON-escaped;
always in the decoded body (Content-Encoding undone), and in a stream also in the text its
events assemble to, where a value may be split across events. Values shorter than
`MIN_SECRET` characters are not searched for (they occur by chance).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache
from urllib.parse import parse_qsl, quote, quote_plus, urlencode, urlsplit, urlunsplit

# Credential headers of the major providers' SDKs: OpenAI, Anthropic, Gemini / Vertex (Google),
# Azure OpenAI (and API Management), AWS Bedrock (SigV4 and session tokens), and common gateways.
SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "x-goog-iam-authorization-token",
        "x-amz-security-token",
        "ocp-apim-subscription-key",
        "cf-aig-authorization",
        "x-portkey-api-key",
        "helicone-auth",
        "cookie",
        "set-cookie",
        "openai-organization",
        "openai-project",
    }
)
SECRET_QUERY_PARAMS = frozenset({"key", "api_key", "apikey", "api-key", "access_token", "token"})
REDACTED = "[redacted]"
MIN_SECRET = 8  # shorter values are too likely to occur by chance to be worth erasing


def _text(b: bytes | str) -> str:
    return b if isinstance(b, str) else b.decode("utf-8", "surrogateescape")


def scrub_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Header pairs with secret values replaced (the name stays, so a reader sees one was sent)."""
    return [(k, REDACTED if k.lower() in SECRET_HEADERS else v) for k, v in headers]


def scrub_url(url: str) -> str:
    """The URL without userinfo and with secret query values redacted (for the log and stderr)."""
    if "?" not in url and "@" not in url:  # nothing to scrub: the common case, on every request
        return url
    parts = urlsplit(url)
    parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1])
    pairs = [
        (k, REDACTED if k.lower() in SECRET_QUERY_PARAMS else v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    ]
    return urlunsplit(parts._replace(query=urlencode(pairs) if pairs else parts.query))


def secret_values(url: str, headers: Iterable[tuple[str, str]]) -> list[str]:
    """The secret strings a request carried, in every form they could be echoed in, longest first."""
    values = []
    for k, v in headers:
        if k.lower() in SECRET_HEADERS:
            v = _text(v)
            values.append(v)
            values.extend(part for part in v.replace(";", " ").replace("=", " ").replace(",", " ").split() if part)
    if "?" in url:
        query = urlsplit(url).query
        for pair in query.split("&"):
            k, _, raw = pair.partition("=")
            if k.lower() in SECRET_QUERY_PARAMS:
                values.append(raw)  # as it was written in the URL
        for k, v in parse_qsl(query, keep_blank_values=True):
            if k.lower() in SECRET_QUERY_PARAMS:
                values.append(v)  # decoded: '+' already read as a space
    forms = {f for v in values if len(v) >= MIN_SECRET for f in _forms(v)}
    return sorted((f for f in forms if len(f) >= MIN_SECRET), key=len, reverse=True)


_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


@lru_cache(maxsize=1024)  # the same key arrives with every request: spell it out once
def _forms(v: str) -> frozenset[str]:
    if _PLAIN.issuperset(v):  # most API keys: every spelling is the value itself
        return frozenset((v,))
    b = v.encode("utf-8", "surrogateescape")  # header values are bytes: any byte may be in a key
    out = {v, v.replace(" ", "+"), v.replace("+", " "), quote(b, safe=""), quote_plus(b), quote(b, safe="/+=")}
    out |= {json.dumps(f)[1:-1] for f in list(out)}
    return frozenset(out)


def _bytes(values: Iterable[str]) -> list[bytes]:
    return [v.encode("utf-8", "surrogateescape") for v in values]


def contains(data: bytes, values: Iterable[str]) -> bool:
    return any(v in data for v in _bytes(values))


def erase(data: bytes, values: Iterable[str]) -> bytes:
    """`data` with every occurrence of each secret value replaced by the redaction mark."""
    mark = REDACTED.encode()
    for v in _bytes(values):
        data = data.replace(v, mark)
    return data


def erase_text(text: str, values: Iterable[str]) -> str:
    """For messages: the same as `erase`, on text."""
    for v in values:
        text = text.replace(v, REDACTED)
    return text


def erase_events(body: bytes, values: Iterable[str]) -> bytes | None:
    """An event stream with secret values erased from the text its events assemble to.

    A model echoing a key token by token spreads it over several `data:` events, none of which
    holds it whole. The string fields of all JSON events are read in order as one text; where a
    secret spans fields, the first keeps the redaction mark and the rest lose their part. Returns
    None when nothing was found."""
    lines = body.split(b"\n")
    docs: dict[int, object] = {}
    leaves: list[tuple[int, tuple[object, ...], str]] = []
    for i, line in enumerate(lines):
        if not line.startswith(b"data:"):
            continue
        try:
            doc = json.loads(line[5:])
        except ValueError:
            continue
        docs[i] = doc
        leaves.extend((i, path, s) for path, s in _strings(doc, ()))
    text = "".join(s for _, _, s in leaves)
    spans = _spans(text, [v for v in values if v in text])
    if not spans:
        return None
    changed: set[int] = set()
    pos = 0
    for i, path, s in leaves:
        new = _cut(s, pos, spans)
        if new != s:
            docs[i] = _set(docs[i], path, new)
            changed.add(i)
        pos += len(s)
    for i in changed:
        lines[i] = b"data: " + json.dumps(docs[i], ensure_ascii=False).encode("utf-8", "surrogateescape")
    return b"\n".join(lines)


def _strings(doc: object, path: tuple[object, ...]) -> Iterable[tuple[tuple[object, ...], str]]:
    if isinstance(doc, str):
        yield path, doc
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield from _strings(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _strings(v, (*path, i))


def _spans(text: str, values: list[str]) -> list[tuple[int, int]]:
    """Non-overlapping (start, end) of every occurrence, longest values first."""
    taken: list[tuple[int, int]] = []
    for v in sorted(set(values), key=len, reverse=True):
        start = text.find(v)
        while start >= 0:
            end = start + len(v)
            if not any(a < end and start < b for a, b in taken):
                taken.append((start, end))
            start = text.find(v, start + 1)
    return sorted(taken)


def _cut(s: str, offset: int, spans: list[tuple[int, int]]) -> str:
    """`s` (starting at `offset` of the assembled text) with the spans' characters removed and the
    mark put where a span starts."""
    out, i = [], 0
    for a, b in spans:
        lo, hi = max(a - offset, 0), min(b - offset, len(s))
        if lo >= hi:
            continue
        out.append(s[i:lo])
        if a - offset >= 0:
            out.append(REDACTED)
        i = hi
    out.append(s[i:])
    return "".join(out)


def _set(doc: object, path: tuple[object, ...], value: str) -> object:
    if not path:
        return value
    head, rest = path[0], path[1:]
    doc[head] = _set(doc[head], rest, value)  # type: ignore[index]
    return doc
