"""Replay mode's hook: answer in the `request` hook, so mitmproxy never opens an upstream connection."""

from __future__ import annotations

import asyncio

from noisefloor.proxy.mitm import compat as mitm
from noisefloor.proxy.mitm._flows import LABELS, is_websocket, log, request_data, scrub, to_mitmproxy, where
from noisefloor.proxy.mitm.compat import http
from noisefloor.proxy.record.sse import stream_pieces
from noisefloor.proxy.replay.replayer import Answer, Matched, Replayer

WAIT_HEADER = "x-nf-wait-ms"  # on every replayed answer: milliseconds the proxy held the request


class Replay:
    """Answers in the `request` hook, so mitmproxy never opens an upstream connection.

    A request whose recorded predecessors (requests of its recorded session that had their answer
    before it was asked) have not all been asked in this replay yet waits for them, up to
    `order_wait` seconds: under a concurrent harness they are usually a moment behind. A streamed
    answer is sent by mitmproxy itself, chunk by chunk as recorded (`compat.stream_answer`), at
    once or (`timed`) each at its recorded offset.
    """

    def __init__(self, replayer: Replayer, timed: bool, order_wait: float = 5.0) -> None:
        self.replayer = replayer
        self.timed = timed
        self._untimed_said = False  # the warning for a stream without recorded offsets, given once
        self.order_wait = order_wait
        self._asked = asyncio.Event()  # replaced, and the old one set, whenever a request is asked

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:  # refused before it got here (BodyLimit)
            return
        if is_websocket(flow):
            log.warning("nfproxy: refused a WebSocket upgrade in replay mode: %s", where(flow))
            try:
                flow.response = to_mitmproxy(self.replayer.refuse_websocket(request_data(flow), flow.metadata[LABELS]))
            except Exception as exc:  # noqa: BLE001 - as below: never forwarded
                flow.response = to_mitmproxy(self.replayer.failure(exc))
            return
        loop = asyncio.get_running_loop()
        taken_up = loop.time()
        try:
            matched = self.replayer.match(request_data(flow), flow.metadata[LABELS])
            if isinstance(matched, Answer):
                answer = matched
            else:
                self._announce()
                await self._wait_for_predecessors(matched)
                answer = self.replayer.settle(matched, loop.time() - taken_up)
        except Exception as exc:  # noqa: BLE001 - unanswered, mitmproxy would forward the request upstream
            log.error("nfproxy: replay failed for %s: %s", where(flow), scrub(flow, repr(exc)))
            flow.response = to_mitmproxy(self.replayer.failure(exc))
            return
        if answer.result not in ("hit", "miss"):  # a miss has its own line, from the replayer
            log.warning("nfproxy: replay %s for %s", answer.result, where(flow))
        resp = answer.response
        # how long the proxy held this request before its answer was chosen (pairing included)
        held = (WAIT_HEADER, f"{(loop.time() - taken_up) * 1000:.3f}")
        if resp.layout is None:
            flow.response = to_mitmproxy(resp)
            flow.response.headers[held[0]] = held[1]
            return
        if self.timed and not resp.timed and not self._untimed_said:
            self._untimed_said = True
            log.warning("nfproxy: a stream recorded without --record-timing is replayed at once (%s)", where(flow))
        chunks, due_s = stream_pieces(resp.raw_body, resp.layout, self.timed and resp.timed)
        head = mitm.build_response(resp.status, resp.wire_headers, b"")
        mitm.stream_answer(flow, head, chunks, due_s)
        head.headers[held[0]] = held[1]

    def _announce(self) -> None:
        old, self._asked = self._asked, asyncio.Event()
        old.set()

    async def _wait_for_predecessors(self, matched: Matched) -> None:
        """Wait until every recorded predecessor was asked, or the wait ran out."""
        if self.replayer.blocker(matched) is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.order_wait
        while self.replayer.blocker(matched) is not None:
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(self._asked.wait(), left)
            except TimeoutError:
                break
