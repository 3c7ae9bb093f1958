"""Between mitmproxy's flows and nfproxy's plain data: requests and responses translated, the
flow metadata keys the hooks share, nfproxy's own error answers, and request text safe for stderr."""

from __future__ import annotations

import logging

from noisefloor.proxy.mitm import compat as mitm
from noisefloor.proxy.mitm.compat import http  # mitmproxy's public flow types
from noisefloor.proxy.record.sse import ChunkCapture
from noisefloor.proxy.replay import replies
from noisefloor.proxy.request import secrets
from noisefloor.proxy.request.traffic import RequestData, ResponseData

log = logging.getLogger("nfproxy")
PENDING = "nf_pending"
LABELS = "nf_labels"
STAMP = "nf_stamp"
CAPTURE = "nf_capture"
STALLED = "nf_stalled"
DECODED = "nf_decoded"


def where(flow: http.HTTPFlow) -> str:
    """The request for a message on stderr: secret query values and userinfo redacted."""
    return f"{flow.request.method} {secrets.scrub_url(flow.request.url, request_secrets(flow))}"


def request_secrets(flow: http.HTTPFlow) -> list[str]:
    return secrets.secret_values(flow.request.url, flow.request.headers.items(multi=True))


def scrub(flow: http.HTTPFlow, what: object) -> str:
    """An error message with the request's secrets (any form) erased."""
    return secrets.erase_text(str(what), request_secrets(flow))


def label_field(f: tuple[bytes, bytes]) -> tuple[str, str]:
    return f[0].decode("utf-8", "surrogateescape").lower(), f[1].decode("utf-8", "surrogateescape")


def request_data(flow: http.HTTPFlow) -> RequestData:
    r = flow.request
    return RequestData(
        method=r.method,
        url=r.url,
        host=r.host,
        path=r.path,
        headers=tuple(r.headers.items(multi=True)),
        raw_body=r.raw_content or b"",
        decoded=flow.metadata.get(DECODED),
        stamp=flow.metadata.get(STAMP, {}),
        arrived=flow.request.timestamp_start,
    )


def response_data(resp: http.Response, capture: ChunkCapture | None = None) -> ResponseData:
    headers = tuple(resp.headers.items(multi=True))
    if capture is None:
        return ResponseData(resp.status_code, headers, resp.raw_content or b"")
    layout = tuple((t, len(c)) for t, c in zip(capture.offsets_ms, capture.chunks))
    return ResponseData(resp.status_code, headers, capture.body, layout, partial=not capture.complete)


def to_mitmproxy(resp: ResponseData) -> http.Response:
    """The recorded bytes as they are (already encoded per their Content-Encoding)."""
    return mitm.build_response(resp.status, resp.wire_headers, resp.raw_body)


def is_websocket(flow: http.HTTPFlow) -> bool:
    return flow.request.headers.get("upgrade", "").lower() == "websocket"


def error_response(status: int, kind: str, message: str, headers: dict[str, str]) -> http.Response:
    """An answer nfproxy gives itself, in the JSON error shape the SDKs print."""
    return mitm.make_response(status, replies.error_body(kind, message), {"content-type": "application/json", **headers})


def decoded_body(flow: http.HTTPFlow) -> bytes:
    """The request body with Content-Encoding undone (by BodyLimit, off the event loop)."""
    found = flow.metadata.get(DECODED)
    return found if found is not None else flow.request.raw_content or b""
