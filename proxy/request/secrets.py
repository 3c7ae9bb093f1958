"""What counts as a secret, and how it is removed before anything is written or printed.

Secrets are removed from the stored copy only; the forwarded request keeps them (the provider
needs the key). They are also never part of the content address, so rotating a key keeps a
recording valid.

The secret values of a request are those of its credential headers (and their parts: a Basic
credential decoded, a Digest header's private parameters), of its secret query parameters, and of
secret-named fields of a form or multipart body. Each is erased (`erasure`) wherever the exchange
puts text: bodies, every header value and query value whatever its name, the URL, error messages,
replay's own answers. Searched in every form a value could take: as sent, URL-encoded (`%2B` and
`+` spellings), with `+` read as a space, JSON-escaped, `\\u`-escaped, base64 and base64url (at
each offset), in the decoded body (Content-Encoding undone), in a stream also in each text its
events assemble to (`erase_events`), and as any run of `RUN` characters of it (docs/secrets.md). Values shorter than `MIN_SECRET` characters are not searched for (they
occur by chance).
"""

from __future__ import annotations

import base64
import bisect
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields, replace
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, urlencode, urlsplit, urlunsplit

from noisefloor.proxy import providers
from noisefloor.proxy.providers.base import Provider, strings, texts_by_path
from noisefloor.proxy.request import erasure, stream_events
from noisefloor.proxy.request.erasure import REDACTED as REDACTED
from noisefloor.proxy.request.erasure import RUN as RUN
from noisefloor.proxy.request.labels import Labels

# Credential headers that belong to no provider module: proxies, cookies, Vertex's IAM token,
# Azure OpenAI (and API Management) and common gateways. Each provider module declares its own.
_OTHER_SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "api-key",
        "x-goog-iam-authorization-token",
        "ocp-apim-subscription-key",
        "cf-aig-authorization",
        "x-portkey-api-key",
        "helicone-auth",
        "cookie",
        "set-cookie",
    }
)


def is_secret_header(name: str) -> bool:
    """`name` (lowercase) carries a credential."""
    return name in _OTHER_SECRET_HEADERS or name in providers.credential_headers()
SECRET_QUERY_PARAMS = frozenset({"key", "api_key", "apikey", "api-key", "access_token", "token"})
MIN_SECRET = 8  # shorter values are too likely to occur by chance to be worth erasing


def _text(b: bytes | str) -> str:
    return b if isinstance(b, str) else b.decode("utf-8", "surrogateescape")


def scrub_headers(headers: Iterable[tuple[str, str]], values: Sequence[str] = ()) -> list[tuple[str, str]]:
    """Header pairs with secret values replaced (the name stays, so a reader sees one was sent),
    and the known secret `values` erased from every other header, whatever its name."""
    pairs = [(k, REDACTED if is_secret_header(k.lower()) else v) for k, v in headers]
    return list(erase_header_values(pairs, values))


def erase_header_values(headers: Sequence[tuple[str, str]], values: Sequence[str]) -> Sequence[tuple[str, str]]:
    """`headers` with the secret `values` erased from each name and value (the same object when
    none holds one): a client or an upstream can write a key into a header's name too."""
    if not values:
        return headers
    vals = tuple(values)
    texts = [(_text(k), _text(v)) for k, v in headers]
    erased = [(_erased(k, vals), _erased(v, vals)) for k, v in texts]
    return tuple(erased) if erased != texts else headers


_CACHED = 1024  # longer values are searched every time (a cache of them could hold megabytes)


def _erased(text: str, values: tuple[str, ...]) -> str:
    """`text` with `values` erased (equal to it when none is in it). Short ones are remembered:
    every exchange of a session sends and is answered with the same header values (a cookie
    echoed back, the URL), and the search for each costs more than the exchange's other work."""
    return _erased_short(text, values) if len(text) <= _CACHED else _erase_or_same(text, values)


@lru_cache(maxsize=4096)
def _erased_short(text: str, values: tuple[str, ...]) -> str:
    return _erase_or_same(text, values)


def _erase_or_same(text: str, values: tuple[str, ...]) -> str:
    found = erasure.spans(text, values)
    return erasure.cut(text, found) if found else text


def erase_label(text: str | None, values: Sequence[str]) -> str | None:
    """A short text a client chose (a label, a method) with the secret `values` erased."""
    return _erased(text, tuple(values)) if text and values else text


def erase_labels(labels: Labels, values: Sequence[str]) -> Labels:
    """`labels` (session, task, replicate, condition, replay-from) with the secret `values` erased."""
    erased: dict[str, Any] = {f.name: erase_label(getattr(labels, f.name), values) for f in fields(labels)}
    return labels if all(erased[k] is getattr(labels, k) for k in erased) else replace(labels, **erased)


def scrub_url(url: str, values: Sequence[str] = ()) -> str:
    """The URL without userinfo, with secret query values redacted, and the known secret `values`
    erased from the rest (a key sent under a parameter of another name, or in the path)."""
    if "?" in url or "@" in url:
        parts = urlsplit(url)
        parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1])
        pairs = [
            (k, REDACTED if k.lower() in SECRET_QUERY_PARAMS else v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        ]
        url = urlunsplit(parts._replace(query=urlencode(pairs) if pairs else parts.query))
    return _erased(url, tuple(values)) if values else url


_QUOTED = re.compile(r'([A-Za-z0-9_-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,]+)')
_DIGEST_PUBLIC = frozenset({"realm", "uri", "algorithm", "qop", "nc", "charset", "userhash"})


def _header_parts(v: str) -> list[str]:
    """The secret parts of a credential header's value: its tokens, a Basic credential decoded
    (user:password and the password), a Digest header's private parameters."""
    scheme, _, rest = v.strip().partition(" ")
    if scheme.lower() == "digest":
        return [m.group(2).strip('"') for m in _QUOTED.finditer(rest) if m.group(1).lower() not in _DIGEST_PUBLIC]
    parts = [p.strip('"') for p in v.replace(";", " ").replace("=", " ").replace(",", " ").split() if p]
    if scheme.lower() == "basic" and rest.strip():
        try:
            plain = base64.b64decode(rest.strip(), validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return parts
        parts += [plain, plain.partition(":")[2]]
    return parts


def secret_values(url: str, headers: Iterable[tuple[str, str]], body: bytes = b"") -> list[str]:
    """The secret strings a request carried, in every form they could be echoed in, longest first:
    credential headers, secret query parameters, and (for form and multipart bodies) form fields
    under a secret parameter's name."""
    values = []
    content_type = ""
    for k, v in headers:
        name = k.lower()
        if name == "content-type":
            content_type = _text(v).lower()
        if is_secret_header(name):
            v = _text(v)
            values.append(v)
            values.extend(_header_parts(v))
    if "?" in url:
        query = urlsplit(url).query
        for pair in query.split("&"):
            k, _, raw = pair.partition("=")
            if k.lower() in SECRET_QUERY_PARAMS:
                values.append(raw)  # as it was written in the URL
        for k, v in parse_qsl(query, keep_blank_values=True):
            if k.lower() in SECRET_QUERY_PARAMS:
                values.append(v)  # decoded: '+' already read as a space
    if body and ("form" in content_type):
        values.extend(_form_values(content_type, body))
    forms = {f for v in values if len(v) >= MIN_SECRET for f in _forms(v)}
    return sorted((f for f in forms if len(f) >= MIN_SECRET), key=len, reverse=True)


_FORM_BODY_MAX = 1 << 20  # form bodies larger than this are not parsed for secret fields
_PART = re.compile(rb'name="?([^";\r\n]+)"?[^\r\n]*\r?\n(?:[^\r\n]+\r?\n)*\r?\n([^\r\n]*)')


def _form_values(content_type: str, body: bytes) -> list[str]:
    if len(body) > _FORM_BODY_MAX:
        return []
    if "x-www-form-urlencoded" in content_type:
        text = _text(body)
        return [v for k, v in parse_qsl(text, keep_blank_values=True) if k.lower() in SECRET_QUERY_PARAMS] + [
            raw for k, _, raw in (p.partition("=") for p in text.split("&")) if k.lower() in SECRET_QUERY_PARAMS]
    if "multipart/" in content_type:
        return [_text(m.group(2)) for m in _PART.finditer(body) if _text(m.group(1)).lower() in SECRET_QUERY_PARAMS]
    return []


_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


@lru_cache(maxsize=1024)  # the same key arrives with every request: spell it out once
def _forms(v: str) -> frozenset[str]:
    b = v.encode("utf-8", "surrogateescape")  # header values are bytes: any byte may be in a key
    if _PLAIN.issuperset(v):  # most API keys: every URL and JSON spelling is the value itself
        return frozenset((v, *_base64_forms(b)))
    out = {v, v.replace(" ", "+"), v.replace("+", " "), quote(b, safe=""), quote_plus(b), quote(b, safe="/+=")}
    out |= {json.dumps(f)[1:-1] for f in list(out)}
    out |= {json.dumps(f, ensure_ascii=False)[1:-1] for f in list(out)}
    return frozenset(out | _base64_forms(b))


def _base64_forms(b: bytes) -> set[str]:
    """The value as base64 and base64url, wherever it starts in the encoded bytes: at each of the
    three offsets a byte string can start at within base64's 3-byte groups, the characters that
    encode its bytes alone (those shared with a neighbour's bits left off), so a key inside a
    longer base64 text (a Basic credential, an echoed blob) is found too."""
    out = set()
    for shift in range(3):
        encoded = base64.b64encode(bytes(shift) + b).decode()
        core = encoded[-(-8 * shift // 6):(8 * (shift + len(b))) // 6]  # chars of the value's bits only
        out |= {core, core.replace("+", "-").replace("/", "_")}
    return {f for f in out if len(f) >= MIN_SECRET}


@lru_cache(maxsize=1)
def _environment(items: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    vals = {v for k, v in items if _SECRET_NAME.search(k) and len(v) >= MIN_SECRET}
    return tuple(sorted({f for v in vals for f in _forms(v)}, key=len, reverse=True))


_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.I)


def environment_values(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Values of this process's environment variables named like credentials (OPENAI_API_KEY,
    HF_TOKEN, ...): what a report or a message must never print, whatever file it came from."""
    env = os.environ if environ is None else environ
    return _environment(tuple(sorted(env.items())))


def contains(data: bytes, values: Iterable[str]) -> bool:
    return erasure.contains(data, values)


def erase(data: bytes, values: Iterable[str]) -> bytes:
    """`data` with every occurrence of each secret value, and each run of `RUN` characters of
    one, replaced by the redaction mark."""
    return erasure.erase(data, values)


def erase_text(text: str, values: Iterable[str]) -> str:
    """For messages: the same as `erase`, on text."""
    return erasure.erase(text, values)


def erase_events(body: bytes, values: Iterable[str], provider: Provider | None = None,
                 content_type: str | None = None) -> bytes | None:
    """A streamed answer with secret values erased from the texts its events assemble to, as
    `provider` defines them (`Provider.stream_texts`: a choice's content deltas, a tool call's
    argument deltas; the generic provider's when None).

    A model echoing a key token by token spreads it over several events, none of which holds it
    whole, with other strings (ids, model names) between its pieces. Where a secret spans pieces,
    the first keeps the redaction mark and the rest lose their part. AWS event-stream frames
    (whose lengths and CRCs a cut in place would break) get every string of every event erased
    too, and are framed again. Returns None when nothing was found."""
    vals = tuple(values)
    events = stream_events.read(body, content_type)
    if events is None or not vals:
        return None
    if events.kind == "aws":
        for i, doc in enumerate(events.docs):
            for path, s in list(strings(doc)):
                new = erasure.erase(s, vals)
                if new != s:
                    events.set(i, path, new)
    try:
        threads = (provider or providers.PROVIDERS["generic"]).stream_texts(events.docs)
    except (TypeError, ValueError, AttributeError, KeyError):  # an upstream's odd event (an unhashable index)
        threads = texts_by_path(events.docs)
    for thread in threads:
        leaves = [(i, path, stream_events.get(events.docs[i], path)) for i, path in thread]
        found = erasure.spans("".join(s for _, _, s in leaves), vals)
        ends = [b for _, b in found]
        pos = 0
        for i, path, s in leaves if found else ():
            new = _cut(s, pos, found, ends)
            if new != s:
                events.set(i, path, new)
            pos += len(s)
    return events.rebuilt() if events.changed else None


def _cut(s: str, offset: int, spans: list[tuple[int, int]], ends: list[int]) -> str:
    """`s` (starting at `offset` of the assembled text) with the spans' characters removed and the
    mark put where a span starts. `spans` are merged and sorted (`ends`: their ends): only those
    reaching into `s` are visited, so a stream echoing a key at every turn costs linear time."""
    out, i = [], 0
    k, stop = bisect.bisect_right(ends, offset), offset + len(s)
    while k < len(spans) and spans[k][0] < stop:
        a, b = spans[k]
        k += 1
        lo, hi = max(a - offset, 0), min(b - offset, len(s))
        if lo >= hi:
            continue
        out.append(s[i:lo])
        if a - offset >= 0:
            out.append(REDACTED)
        i = hi
    out.append(s[i:])
    return "".join(out)
