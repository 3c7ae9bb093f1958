"""The copy of a request or response that may be written to the log: caller secrets erased from
its body in every form they may take there, its bytes otherwise left as they came.

Only when a secret is found is a body stored decoded (Content-Encoding dropped), because a value
may hide inside the compressed bytes; otherwise the wire bytes are kept, so replay stays
byte-identical. The one scan per body that finds nothing is the common case on every exchange.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from noisefloor.proxy.request import headers as headers_mod
from noisefloor.proxy.request import secrets, stream_events
from noisefloor.proxy.request.decoding import decode_body

if TYPE_CHECKING:
    from noisefloor.proxy.providers.base import Provider
    from noisefloor.proxy.request.traffic import ResponseData


def request_body(raw: bytes, decoded: bytes | None, encoding: str | None, values: list[str]) -> tuple[bytes, bool]:
    """The request body as written, and whether it had to be stored decoded (a secret found only
    after undoing Content-Encoding is erased from the decoded bytes)."""
    if not values or not raw:
        return raw, False
    if encoding:
        body, note = (decoded, None) if decoded is not None else decode_body(raw, encoding)
        if note is None and secrets.contains(body, values):
            return secrets.erase(body, values), True
    if not secrets.contains(raw, values):  # the common case: one scan, no copy
        return raw, False
    return secrets.erase(raw, values), False


def response(resp: ResponseData, values: list[str], provider: Provider | None = None) -> ResponseData:
    """`resp` with caller secrets (error messages echo them) erased from every header value and
    from the body, after undoing Content-Encoding, and in a stream also from the texts its events
    assemble to (`secrets.erase_events`, as `provider` defines them). A stream whose body had to
    change is stored as one chunk."""
    if not values:
        return resp
    headers = secrets.erase_header_values(resp.headers, values)
    unchanged = resp if headers is resp.headers else replace(resp, headers=headers)
    if not resp.raw_body:
        return unchanged
    decoded = resp.decoded_body
    content_type = resp.header("content-type")
    framed = bool(content_type) and content_type.lower().startswith(stream_events.AWS_CONTENT_TYPE)
    whole = not framed and secrets.contains(decoded, values)  # AWS frames: erased event by event, framed again
    if not whole and resp.layout is None and not framed:  # the common case, on every exchange: one scan
        return unchanged
    body = secrets.erase(decoded, values) if whole else decoded
    if resp.layout is not None or framed:
        body = secrets.erase_events(body, values, provider, content_type) or body
    if framed and secrets.contains(body, values):  # frames it could not read (or a frame's header): the secret first
        body = secrets.erase(body, values)
    if body is decoded:
        return unchanged
    headers = tuple(headers_mod.without(headers, "content-encoding", "content-length"))
    layout = resp.layout
    if layout is not None:
        layout = ((layout[-1][0] if layout else 0.0, len(body)),)
    else:
        headers += (("content-length", str(len(body))),)
    return type(resp)(resp.status, headers, body, layout, resp.partial)
