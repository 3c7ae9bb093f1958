"""Record mode's hook: key each request while the upstream works on it, commit the exchange's
answered row before the client sees the answer and the exchange in full after."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from noisefloor.proxy.mitm._flows import (
    CAPTURE,
    LABELS,
    PENDING,
    STALLED,
    error_response,
    log,
    request_data,
    response_data,
    scrub,
    where,
)
from noisefloor.proxy.mitm.compat import http
from noisefloor.proxy.record.recorder import Pending, Recorder, over_limit
from noisefloor.proxy.record.sse import ChunkCapture, delivered_terminal_event
from noisefloor.proxy.request.traffic import ResponseData

CLIENT_GONE_GRACE_S = 0.5


class Record:
    """Keys each request while the upstream works on it, and commits the exchange's answered row
    before the client sees the answer (so a proxy killed with SIGKILL keeps every exchange it
    answered: `answered_rows`), the exchange in full right after.

    Once the proxy is interrupted (`stopping`), a flow that fails is the shutdown's doing (Ctrl-C
    also ended the client): it is not recorded as an error, so a rerun asks it again."""

    def __init__(self, recorder: Recorder, stopping: Callable[[], bool] = lambda: False) -> None:
        self.recorder = recorder
        self.stopping = stopping
        recorder.on_unwritten = lambda line: log.error(
            "nfproxy: an answered exchange is kept in the store but could not be written in full (%s); "
            "`nfproxy repair STORE` writes it", line)
        recorder.on_refused = lambda line: log.warning("nfproxy: %s", line)
        self._unkeyed: deque[http.HTTPFlow] = deque()

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:  # refused before it got here (BodyLimit): nothing to record
            return
        flow.metadata[PENDING] = (request_data(flow), flow.metadata[LABELS])
        self._unkeyed.append(flow)
        # runs once mitmproxy has sent the request on: keying overlaps the upstream's work
        asyncio.get_running_loop().call_soon(self._key_arrivals)

    def _key_arrivals(self) -> None:
        """Key waiting requests in arrival order (occurrence numbers follow it)."""
        while self._unkeyed:
            flow = self._unkeyed.popleft()
            waiting = flow.metadata.get(PENDING)
            if isinstance(waiting, tuple):
                try:
                    flow.metadata[PENDING] = self.recorder.begin(*waiting)
                except Exception as exc:  # noqa: BLE001 - reported when the answer arrives
                    flow.metadata[PENDING] = exc

    def _take(self, flow: http.HTTPFlow) -> Pending | Exception | None:
        self._key_arrivals()  # normally done already
        return flow.metadata.pop(PENDING, None)

    def response(self, flow: http.HTTPFlow) -> None:
        pending = self._take(flow)
        if pending is None or flow.response is None:
            return
        latency = None
        if flow.response.timestamp_start and flow.request.timestamp_end:
            latency = (flow.response.timestamp_start - flow.request.timestamp_end) * 1000
        notes = ["websocket upgrade: messages are not recorded"] if flow.response.status_code == 101 else []
        capture: ChunkCapture | None = flow.metadata.get(CAPTURE)
        try:
            if isinstance(pending, Exception):
                raise pending
            if capture is not None and capture.over_limit:  # its chunks were not kept: the refusal, as finish words it
                refused = over_limit(capture.size, self.recorder.store.max_body)
                self.recorder.on_refused(refused)
                self.recorder.finish(pending, None, error=refused, latency_ms=latency, notes=notes, defer_tracking=True)
            else:
                self.recorder.finish(pending, response_data(flow.response, capture),
                                     latency_ms=latency, notes=notes, defer_tracking=True)
        except Exception as exc:  # noqa: BLE001 - an answer that is not in the log must not reach the agent
            self._withhold(flow, exc)
        # the exchange written in full and the answer's dependency marks registered after it is
        # released (the client waits only for its answered row), before any request keyed later
        # (`begin` does what is left first)
        asyncio.get_running_loop().call_soon(self.recorder.track_answers)

    def _record_complete(self, flow: http.HTTPFlow, pending: Pending | Exception, response: ResponseData) -> None:
        try:
            if isinstance(pending, Exception):
                raise pending
            self.recorder.finish(pending, response, notes=["the client closed the stream after its closing event"])
        except Exception as exc:  # noqa: BLE001 - the client has its answer; say the record was lost
            self.recorder.stats.lost()
            log.error("nfproxy: could not record %s: %s", where(flow), scrub(flow, exc))

    def _withhold(self, flow: http.HTTPFlow, exc: Exception) -> None:
        self.recorder.stats.lost()
        log.error("nfproxy: could not record %s: %s", where(flow), scrub(flow, exc))
        flow.response = error_response(507, "nfproxy_record_error", "nfproxy could not record this exchange, so it "
                               f"withholds the answer: {scrub(flow, exc)}", {"x-nf-record": "error"})

    async def error(self, flow: http.HTTPFlow) -> None:
        pending = self._take(flow)
        if pending is None:
            return
        message = flow.metadata.get(STALLED) or (flow.error.msg if flow.error else "unknown upstream error")
        capture: ChunkCapture | None = flow.metadata.get(CAPTURE)
        partial = None
        if flow.response is not None and capture is not None and capture.over_limit:  # nothing of it was kept
            message = f"{message}; {over_limit(capture.size, self.recorder.store.max_body)}"
        elif flow.response is not None and capture is not None:  # a stream that broke off: keep what came
            if delivered_terminal_event(capture.body):  # it had ended: the client hung up after the answer
                capture.complete = True  # recorded at once: a shutdown right after must not lose it
                self._record_complete(flow, pending, response_data(flow.response, capture))
                return
            partial = response_data(flow.response, capture)
        if message.startswith("Client disconnected") and not self.stopping():
            # Ctrl-C reaches a wrapped client and nfproxy at once, and the client's hang-up may be
            # seen first: give the interrupt a moment to arrive before calling this an error
            await asyncio.sleep(CLIENT_GONE_GRACE_S)
        if self.stopping():  # the interrupt's doing, not the upstream's: left for a rerun to ask again
            return
        log.warning("nfproxy: error recorded for %s: %s", where(flow), scrub(flow, message))
        try:
            if isinstance(pending, Exception):
                raise pending
            self.recorder.finish(pending, partial, error=message)
        except Exception as exc:  # noqa: BLE001 - the client already gets an error; say this one was lost
            self.recorder.stats.lost()
            log.error("nfproxy: could not record the failed exchange %s: %s", where(flow), scrub(flow, exc))
