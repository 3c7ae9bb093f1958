"""The mitmproxy side: translate flows to plain data and hand them to the recorder or replayer.

Kept thin on purpose: every decision lives in `recorder.py`, `replayer.py` and `keys.py`, which are
tested without a proxy. One class per job, one hook each, in the order mitmproxy calls them.
"""

from __future__ import annotations

import logging

from mitmproxy import http

from proxy.recorder import Recorder
from proxy.replayer import Replayer
from proxy.traffic import LABEL_HEADERS, Labels, Prepared, RequestData, ResponseData

log = logging.getLogger("nfproxy")
_PENDING = "nf_pending"
_LABELS = "nf_labels"


def request_data(flow: http.HTTPFlow) -> RequestData:
    r = flow.request
    return RequestData(
        method=r.method,
        url=r.url,
        host=r.host,
        path=r.path,
        headers=tuple(r.headers.items(multi=True)),
        raw_body=r.raw_content or b"",
    )


def response_data(resp: http.Response) -> ResponseData:
    return ResponseData(resp.status_code, tuple(resp.headers.items(multi=True)), resp.raw_content or b"")


def to_mitmproxy(resp: ResponseData) -> http.Response:
    # make() would re-encode `content` per Content-Encoding; the recorded bytes are already encoded
    out = http.Response.make(resp.status)
    out.headers = http.Headers([(k.encode(), v.encode()) for k, v in resp.headers])
    out.raw_content = resp.raw_body
    return out


class SessionLabels:
    """Reads the x-nf-* labels and strips them, so they reach neither the provider nor the key."""

    def __init__(self, defaults: Labels) -> None:
        self.defaults = defaults

    def request(self, flow: http.HTTPFlow) -> None:
        headers = flow.request.headers
        found = {k.lower(): v for k, v in headers.items() if k.lower() in LABEL_HEADERS}
        for h in found:
            del headers[h]
        flow.metadata[_LABELS] = self.defaults.overlay(found) if found else self.defaults


class Record:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def request(self, flow: http.HTTPFlow) -> None:
        flow.metadata[_PENDING] = self.recorder.begin(request_data(flow), flow.metadata[_LABELS])

    def response(self, flow: http.HTTPFlow) -> None:
        pending: Prepared | None = flow.metadata.pop(_PENDING, None)
        if pending is None or flow.response is None:
            return
        latency = None
        if flow.response.timestamp_start and flow.request.timestamp_end:
            latency = (flow.response.timestamp_start - flow.request.timestamp_end) * 1000
        self.recorder.finish(pending, response_data(flow.response), latency_ms=latency)

    def error(self, flow: http.HTTPFlow) -> None:
        pending: Prepared | None = flow.metadata.pop(_PENDING, None)
        if pending is None:
            return
        message = flow.error.msg if flow.error else "unknown upstream error"
        log.warning("nfproxy: upstream error recorded for %s: %s", flow.request.url, message)
        self.recorder.finish(pending, None, error=message)


class Replay:
    """Answers in the `request` hook, so mitmproxy never opens an upstream connection."""

    def __init__(self, replayer: Replayer) -> None:
        self.replayer = replayer

    def request(self, flow: http.HTTPFlow) -> None:
        answer = self.replayer.answer(request_data(flow), flow.metadata[_LABELS])
        if answer.result != "hit":
            log.warning("nfproxy: replay %s for %s %s", answer.result, flow.request.method, flow.request.url)
        flow.response = to_mitmproxy(answer.response)
