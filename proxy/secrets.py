"""What counts as a secret, and how it is removed before anything is written.

Secrets are removed from the stored copy only; the forwarded request keeps them (the provider
needs the key). They are also never part of the content address, so rotating a key keeps a
recording valid.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "set-cookie",
        "openai-organization",
        "openai-project",
    }
)
SECRET_QUERY_PARAMS = frozenset({"key", "api_key", "apikey", "api-key", "access_token", "token"})
REDACTED = "[redacted]"


def scrub_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Header pairs with secret values replaced (the name stays, so a reader sees one was sent)."""
    return [(k, REDACTED if k.lower() in SECRET_HEADERS else v) for k, v in headers]


def scrub_url(url: str) -> str:
    if "?" not in url and "@" not in url:  # nothing to scrub: the common case, on every request
        return url
    parts = urlsplit(url)
    parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1])
    pairs = [
        (k, REDACTED if k.lower() in SECRET_QUERY_PARAMS else v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    ]
    return urlunsplit(parts._replace(query=urlencode(pairs) if pairs else parts.query))


_MIN_SECRET = 8  # shorter values are too likely to occur by chance to be worth erasing


def secret_values(url: str, headers: Iterable[tuple[str, str]]) -> list[str]:
    """The secret strings a request carried, so they can be erased wherever else they turn up."""
    values = []
    for k, v in headers:
        if k.lower() in SECRET_HEADERS:
            values.append(v)
            values.extend(part for part in v.replace(";", " ").replace("=", " ").split() if part)
    for k, v in parse_qsl(urlsplit(url).query, keep_blank_values=True) if "?" in url else ():
        if k.lower() in SECRET_QUERY_PARAMS:
            values.append(v)
    return sorted({v for v in values if len(v) >= _MIN_SECRET}, key=len, reverse=True)


def erase(data: bytes, values: Iterable[str]) -> bytes:
    """`data` with every occurrence of each secret value replaced by the redaction mark."""
    for v in values:
        data = data.replace(v.encode(), REDACTED.encode())
    return data
