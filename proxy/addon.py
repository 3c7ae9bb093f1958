"""The mitmproxy side: translate flows to plain data and hand them to the recorder or replayer.

Kept thin on purpose: every decision lives in `recorder.py`, `replayer.py`, `keys.py`,
`overrides.py`, `perturb.py` and `sse.py`, which are tested without a proxy. One class per job, each with the
hooks it needs, added in the order mitmproxy should call them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

from noisefloor.proxy import decoding, perturb, replies, secrets
from noisefloor.proxy import mitm_compat as mitm
from noisefloor.proxy import overrides as ov
from noisefloor.proxy.mitm_compat import ServerHook, http  # mitmproxy's public flow types
from noisefloor.proxy.perturb import Rewrite
from noisefloor.proxy.recorder import Pending, Recorder
from noisefloor.proxy.replayer import Answer, Matched, Replayer
from noisefloor.proxy.sse import (
    TICKET_HEADER,
    ChunkCapture,
    ChunkSplitter,
    StreamPlan,
    StreamServer,
    delivered_terminal_event,
    is_stream,
)
from noisefloor.proxy.traffic import LABEL_HEADERS, Labels, RequestData, ResponseData, Stats, split_label_prefix

log = logging.getLogger("nfproxy")
_PENDING = "nf_pending"
_LABELS = "nf_labels"
_STAMP = "nf_stamp"
_CAPTURE = "nf_capture"
_SPLIT = "nf_split"
_STALLED = "nf_stalled"
_DECODED = "nf_decoded"
CLIENT_GONE_GRACE_S = 0.5


def _where(flow: http.HTTPFlow) -> str:
    """The request for a message on stderr: secret query values and userinfo redacted."""
    return f"{flow.request.method} {secrets.scrub_url(flow.request.url, _secrets(flow))}"


def _secrets(flow: http.HTTPFlow) -> list[str]:
    return secrets.secret_values(flow.request.url, flow.request.headers.items(multi=True))


def _scrub(flow: http.HTTPFlow, what: object) -> str:
    """An error message with the request's secrets (any form) erased."""
    return secrets.erase_text(str(what), _secrets(flow))


def _field(f: tuple[bytes, bytes]) -> tuple[str, str]:
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
        decoded=flow.metadata.get(_DECODED),
        stamp=flow.metadata.get(_STAMP, {}),
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


class Group:
    """nfproxy's addons as one entry of mitmproxy's addon chain.

    mitmproxy offers each flow event to every chain entry through its own coroutine and error
    guard, but only looks up the hook on an entry's children; grouping keeps the small one-job
    classes without paying that per class and per event.
    """

    def __init__(self, *children: object) -> None:
        self.addons = list(children)


def _error(status: int, kind: str, message: str, headers: dict[str, str]) -> http.Response:
    """An answer nfproxy gives itself, in the JSON error shape the SDKs print."""
    return mitm.make_response(status, replies.error_body(kind, message), {"content-type": "application/json", **headers})


def _decoded(flow: http.HTTPFlow) -> bytes:
    """The request body with Content-Encoding undone (by BodyLimit, off the event loop)."""
    found = flow.metadata.get(_DECODED)
    return found if found is not None else flow.request.raw_content or b""


class BodyLimit:
    """Undoes each request body's Content-Encoding with a cap on the decoded size, in a worker
    thread, before anything is keyed or forwarded: a body over the cap (a decompression bomb, or
    just too large) gets 413 and never reaches the provider, and other clients are not held up
    while a large body decodes. The decoded bytes ride along for keying."""

    def __init__(self, limit: int, stats: Stats) -> None:
        self.limit = limit
        self.stats = stats

    async def request(self, flow: http.HTTPFlow) -> None:
        raw = flow.request.raw_content or b""
        encoding = flow.request.headers.get("content-encoding")
        if not encoding and len(raw) <= self.limit:
            return
        try:
            flow.metadata[_DECODED] = await asyncio.to_thread(decoding.decode, raw, encoding, self.limit)
        except decoding.BodyTooLarge as exc:
            self.stats.errors += 1
            log.error("nfproxy: refused %s: %s", _where(flow), exc)
            flow.response = _error(413, "nfproxy_body_too_large", str(exc), {"x-nf-refused": "body-too-large"})
        except Exception:  # noqa: BLE001 - not what it claims to be: keyed on its raw bytes, with a note
            pass


class SessionLabels:
    """Reads the x-nf-* labels and strips them, so they reach neither the provider nor the key."""

    def __init__(self, defaults: Labels) -> None:
        self.defaults = defaults

    def request(self, flow: http.HTTPFlow) -> None:
        headers = flow.request.headers
        # the raw fields, scanned once: Headers.items() looks every name up again (quadratic)
        found = {k: v for k, v in (_field(f) for f in headers.fields if f[0][:5].lower() == b"x-nf-")
                 if k in LABEL_HEADERS}
        for h in found:
            del headers[h]
        from_path, path = split_label_prefix(flow.request.path)
        if from_path:
            flow.request.path = path
            found.update(from_path)
        flow.metadata[_LABELS] = self.defaults.overlay(found) if found else self.defaults


class BodyRewrites:
    """Rewrites JSON request bodies before they are keyed and forwarded: `--set` overrides, then a
    `--perturb` variant of the last user message. Both are stamped on the exchange."""

    def __init__(self, overrides: Sequence[ov.Override], perturbation: tuple[str, Rewrite] | None = None) -> None:
        self.overrides = list(overrides)
        self.perturbation = perturbation

    def request(self, flow: http.HTTPFlow) -> None:
        if not (self.overrides or self.perturbation) or not flow.request.raw_content or flow.response is not None:
            return
        stamp = dict(flow.metadata.get(_STAMP, {}))
        notes = list(stamp.get("notes", ()))
        try:
            doc = json.loads(_decoded(flow))
        except (ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict):
            notes.append("request body is not a JSON object: --set/--perturb not applied")
        else:
            if self.overrides:
                doc = ov.apply(doc, self.overrides)
                stamp["overrides"] = ov.describe(self.overrides)
            if self.perturbation:
                name, rewrite = self.perturbation
                changed = perturb.apply(doc, rewrite)
                if changed is None:
                    notes.append(f"no user message to perturb: {name} not applied")
                else:
                    doc = changed
                    stamp["perturbation"] = name
            content = json.dumps(doc).encode()
            flow.request.content = content  # re-encoded as the client sent it
            flow.metadata[_DECODED] = content
        if notes:
            stamp["notes"] = notes
        flow.metadata[_STAMP] = stamp


class Streams:
    """Forwards streamed responses as they arrive; with a recorder, captures their chunks.

    A stream that stalls for longer than `timeout` seconds has its upstream connection closed, so
    the client sees the stream end and the log gets an error exchange instead of a hung request.
    """

    def __init__(self, timeout: float, capture: bool) -> None:
        self.timeout = timeout
        self.capture = capture
        self._watchers: set[asyncio.Task[None]] = set()

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        assert flow.response is not None
        if flow.metadata.get(_SPLIT) is not None or not is_stream(tuple(flow.response.headers.items(multi=True))):
            return
        capture = ChunkCapture()
        flow.response.stream = capture
        if self.capture:
            flow.metadata[_CAPTURE] = capture
        task = asyncio.get_running_loop().create_task(self._watch(flow, capture))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _watch(self, flow: http.HTTPFlow, capture: ChunkCapture) -> None:
        while not capture.complete and flow.live:
            idle = time.monotonic() - capture.last_activity
            if idle >= self.timeout:
                flow.metadata[_STALLED] = f"upstream stalled: no stream data for {self.timeout:g} s"
                log.warning("nfproxy: %s for %s", flow.metadata[_STALLED], _where(flow))
                mitm.close_server_connection(flow, "upstream stalled")
                return
            await asyncio.sleep(min(1.0, self.timeout - idle))


class Record:
    """Keys each request while the upstream works on it, and commits the exchange before the
    client sees the answer (so a proxy killed with SIGKILL keeps every exchange it answered).

    Once the proxy is interrupted (`stopping`), a flow that fails is the shutdown's doing (Ctrl-C
    also ended the client): it is not recorded as an error, so a rerun asks it again."""

    def __init__(self, recorder: Recorder, stopping: Callable[[], bool] = lambda: False) -> None:
        self.recorder = recorder
        self.stopping = stopping
        self._unkeyed: deque[http.HTTPFlow] = deque()

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:  # refused before it got here (BodyLimit): nothing to record
            return
        flow.metadata[_PENDING] = (request_data(flow), flow.metadata[_LABELS])
        self._unkeyed.append(flow)
        # runs once mitmproxy has sent the request on: keying overlaps the upstream's work
        asyncio.get_running_loop().call_soon(self._key_arrivals)

    def _key_arrivals(self) -> None:
        """Key waiting requests in arrival order (occurrence numbers follow it)."""
        while self._unkeyed:
            flow = self._unkeyed.popleft()
            waiting = flow.metadata.get(_PENDING)
            if isinstance(waiting, tuple):
                try:
                    flow.metadata[_PENDING] = self.recorder.begin(*waiting)
                except Exception as exc:  # noqa: BLE001 - reported when the answer arrives
                    flow.metadata[_PENDING] = exc

    def _take(self, flow: http.HTTPFlow) -> Pending | Exception | None:
        self._key_arrivals()  # normally done already
        return flow.metadata.pop(_PENDING, None)

    def response(self, flow: http.HTTPFlow) -> None:
        pending = self._take(flow)
        if pending is None or flow.response is None:
            return
        latency = None
        if flow.response.timestamp_start and flow.request.timestamp_end:
            latency = (flow.response.timestamp_start - flow.request.timestamp_end) * 1000
        notes = ["websocket upgrade: messages are not recorded"] if flow.response.status_code == 101 else []
        try:
            if isinstance(pending, Exception):
                raise pending
            self.recorder.finish(pending, response_data(flow.response, flow.metadata.get(_CAPTURE)),
                                 latency_ms=latency, notes=notes)
        except Exception as exc:  # noqa: BLE001 - an answer that is not in the log must not reach the agent
            self._withhold(flow, exc)

    def _record_complete(self, flow: http.HTTPFlow, pending: Pending | Exception, response: ResponseData) -> None:
        try:
            if isinstance(pending, Exception):
                raise pending
            self.recorder.finish(pending, response, notes=["the client closed the stream after its closing event"])
        except Exception as exc:  # noqa: BLE001 - the client has its answer; say the record was lost
            self.recorder.stats.lost()
            log.error("nfproxy: could not record %s: %s", _where(flow), _scrub(flow, exc))

    def _withhold(self, flow: http.HTTPFlow, exc: Exception) -> None:
        self.recorder.stats.lost()
        log.error("nfproxy: could not record %s: %s", _where(flow), _scrub(flow, exc))
        flow.response = _error(507, "nfproxy_record_error", "nfproxy could not record this exchange, so it "
                               f"withholds the answer: {_scrub(flow, exc)}", {"x-nf-record": "error"})

    async def error(self, flow: http.HTTPFlow) -> None:
        pending = self._take(flow)
        if pending is None:
            return
        message = flow.metadata.get(_STALLED) or (flow.error.msg if flow.error else "unknown upstream error")
        if message.startswith("Client disconnected") and not self.stopping():
            # Ctrl-C reaches a wrapped client and nfproxy at once, and the client's hang-up may be
            # seen first: give the interrupt a moment to arrive before calling this an error
            await asyncio.sleep(CLIENT_GONE_GRACE_S)
        capture: ChunkCapture | None = flow.metadata.get(_CAPTURE)
        partial = None
        if flow.response is not None and capture is not None:  # a stream that broke off: keep what came
            if delivered_terminal_event(capture.body):  # it had ended: the client hung up after the answer
                capture.complete = True
                self._record_complete(flow, pending, response_data(flow.response, capture))
                return
            partial = response_data(flow.response, capture)
        if self.stopping():  # the interrupt's doing, not the upstream's: left for a rerun to ask again
            return
        log.warning("nfproxy: error recorded for %s: %s", _where(flow), _scrub(flow, message))
        try:
            if isinstance(pending, Exception):
                raise pending
            self.recorder.finish(pending, partial, error=message)
        except Exception as exc:  # noqa: BLE001 - the client already gets an error; say this one was lost
            self.recorder.stats.lost()
            log.error("nfproxy: could not record the failed exchange %s: %s", _where(flow), _scrub(flow, exc))


class Replay:
    """Answers in the `request` hook, so mitmproxy never opens an upstream connection.

    A request whose recorded predecessors (requests of its recorded session that had their answer
    before it was asked) have not all been asked in this replay yet waits for them, up to
    `order_wait` seconds: under a concurrent harness they are usually a moment behind. Streamed
    answers are handed to the loopback `StreamServer` (inside this process) so their chunks can
    be sent one by one; everything else is answered directly.
    """

    def __init__(self, replayer: Replayer, streams: StreamServer, timed: bool, order_wait: float = 5.0) -> None:
        self.replayer = replayer
        self.streams = streams
        self.timed = timed
        self.order_wait = order_wait
        self._asked = asyncio.Event()  # replaced, and the old one set, whenever a request is asked

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:  # refused before it got here (BodyLimit)
            return
        if is_websocket(flow):
            log.warning("nfproxy: refused a WebSocket upgrade in replay mode: %s", _where(flow))
            try:
                flow.response = to_mitmproxy(self.replayer.refuse_websocket(request_data(flow), flow.metadata[_LABELS]))
            except Exception as exc:  # noqa: BLE001 - as below: never forwarded
                flow.response = to_mitmproxy(self.replayer.failure(exc))
            return
        try:
            matched = self.replayer.match(request_data(flow), flow.metadata[_LABELS])
            if isinstance(matched, Answer):
                answer = matched
            else:
                self._announce()
                waited = await self._wait_for_predecessors(matched)
                answer = self.replayer.settle(matched, waited)
        except Exception as exc:  # noqa: BLE001 - unanswered, mitmproxy would forward the request upstream
            log.error("nfproxy: replay failed for %s: %s", _where(flow), _scrub(flow, repr(exc)))
            flow.response = to_mitmproxy(self.replayer.failure(exc))
            return
        if answer.result not in ("hit", "miss"):  # a miss has its own line, from the replayer
            log.warning("nfproxy: replay %s for %s", answer.result, _where(flow))
        resp = answer.response
        if resp.layout is None:
            flow.response = to_mitmproxy(resp)
            return
        plan = StreamPlan(resp.status, resp.headers, resp.raw_body, resp.layout, self.timed)
        flow.request.headers[TICKET_HEADER] = self.streams.register(plan)
        flow.request.scheme, flow.request.host, flow.request.port = "http", "127.0.0.1", self.streams.port
        flow.metadata[_SPLIT] = [n for _, n in resp.layout]

    def _announce(self) -> None:
        old, self._asked = self._asked, asyncio.Event()
        old.set()

    async def _wait_for_predecessors(self, matched: Matched) -> float:
        """Seconds waited until every recorded predecessor was asked, or the wait ran out."""
        if self.replayer.blocker(matched) is None:
            return 0.0
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.order_wait
        while self.replayer.blocker(matched) is not None:
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(self._asked.wait(), left)
            except TimeoutError:
                break
        return round(loop.time() - start, 3)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        sizes = flow.metadata.get(_SPLIT)
        if sizes is not None and flow.response is not None:
            flow.response.stream = ChunkSplitter(sizes)


class NoUpstream:
    """Replay's safety net: refuses every upstream connection but the one to the in-process
    `StreamServer`. Replay answers in the request hook, so this never fires unless something
    went wrong before an answer was set; then the client gets an error, not a live answer."""

    def __init__(self, streams: StreamServer, stats: Stats) -> None:
        self.streams = streams
        self.stats = stats

    def server_connect(self, data: ServerHook) -> None:
        if tuple(data.server.address or ())[:2] == ("127.0.0.1", self.streams.port):
            return
        data.server.error = "nfproxy replay never connects upstream"
        self.stats.errors += 1
        log.error("nfproxy: refused an upstream connection to %s in replay mode", data.server.address)


class TlsFailures:
    """Counts clients that refused nfproxy's certificate, so the summary can say how to fix it."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def tls_failed_client(self, data: object) -> None:
        self.stats.tls_failures += 1
