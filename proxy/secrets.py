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
    parts = urlsplit(url)
    parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1])
    pairs = [
        (k, REDACTED if k.lower() in SECRET_QUERY_PARAMS else v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    ]
    return urlunsplit(parts._replace(query=urlencode(pairs) if pairs else parts.query))
