"""Streams: capture chunk by chunk while forwarding, and replay with the same chunk boundaries.

Recording: mitmproxy hands every piece of a streamed body to a callable before sending it on;
`ChunkCapture` keeps the bytes with their time offsets and returns them unchanged, so the client
gets the first chunk as soon as the upstream sends it.

Replaying: mitmproxy sends a response set by an addon in one piece, so a streamed answer is
served by `StreamServer`, a small aiohttp server on loopback inside the proxy process (never the
provider). It writes the recorded chunks, optionally with the recorded gaps, and `ChunkSplitter`
cuts whatever arrives back into exactly the recorded chunks before mitmproxy forwards them.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from noisefloor.proxy import providers
from noisefloor.proxy.request.headers import HOP_BY_HOP

if TYPE_CHECKING:
    from aiohttp import web

TICKET_HEADER = "x-nf-stream-ticket"


def is_stream(headers: Sequence[tuple[str, str]]) -> bool:
    """SSE, or a chunked body of unknown length: forward as it arrives."""
    h = {k.lower(): v.lower() for k, v in headers}
    if h.get("content-type", "").startswith("text/event-stream"):
        return True
    return "chunked" in h.get("transfer-encoding", "") and "content-length" not in h



def delivered_terminal_event(body: bytes) -> bool:
    """Whether a stream got as far as its provider's closing event: a client that hangs up after
    it (openai-python does) received the whole answer."""
    tail = body[-4096:]
    return any(marker in tail for marker in providers.terminal_events())  # each provider declares its own


@dataclass
class ChunkCapture:
    """The stream callable for record/passthrough mode."""

    started: float = field(default_factory=time.monotonic)
    chunks: list[bytes] = field(default_factory=list)
    offsets_ms: list[float] = field(default_factory=list)
    complete: bool = False
    last_activity: float = field(default_factory=time.monotonic)
    limit: int | None = None  # bytes kept at most (--max-body-mb): past it the chunks are dropped, still forwarded
    size: int = 0  # bytes seen, kept or not

    def __call__(self, data: bytes) -> bytes:
        now = time.monotonic()
        self.last_activity = now
        if data:
            self.size += len(data)
            if self.limit is not None and self.size > self.limit:
                self.chunks.clear()  # an answer no reader would take is not held either
                self.offsets_ms.clear()
            else:
                self.chunks.append(data)
                self.offsets_ms.append(round((now - self.started) * 1000, 3))
        else:
            self.complete = True
        return data

    @property
    def over_limit(self) -> bool:
        return self.limit is not None and self.size > self.limit

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


class ChunkSplitter:
    """The stream callable for replay: re-cuts incoming bytes into the recorded chunk sizes."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self._sizes = list(sizes)
        self._buf = bytearray()

    def __call__(self, data: bytes) -> list[bytes]:
        self._buf += data
        out = []
        while self._sizes and len(self._buf) >= self._sizes[0]:
            n = self._sizes.pop(0)
            out.append(bytes(self._buf[:n]))
            del self._buf[:n]
        if not data and self._buf:  # end of stream: whatever is left (never expected) goes out as is
            out.append(bytes(self._buf))
            self._buf.clear()
        return out


@dataclass(frozen=True)
class StreamPlan:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    layout: tuple[tuple[float, int], ...]  # (offset_ms, length) per chunk
    timed: bool

    def chunks(self) -> list[tuple[float, bytes]]:
        out, pos = [], 0
        for offset, length in self.layout:
            out.append((offset, self.body[pos : pos + length]))
            pos += length
        if pos < len(self.body):
            out.append((self.layout[-1][0] if self.layout else 0.0, self.body[pos:]))
        return out


class StreamServer:
    """Loopback server that plays recorded streams, one ticket per replayed request."""

    def __init__(self) -> None:
        self._plans: dict[str, StreamPlan] = {}
        self._runner: web.AppRunner | None = None
        self._started: asyncio.Future[None] | None = None
        self.port = 0  # 0 until the first stream is served

    async def ready(self) -> int:
        """The server's port, started on the first replayed stream: a replay whose answers are whole
        bodies (and a recording) never pays for aiohttp. Concurrent first streams share one start."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)
        return self.port

    async def _start(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._started is not None and not self._started.done():
            self._started.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    def register(self, plan: StreamPlan) -> str:
        ticket = secrets.token_hex(16)
        self._plans[ticket] = plan
        return ticket

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        plan = self._plans.pop(request.headers.get(TICKET_HEADER, ""), None)
        if plan is None:
            return web.Response(status=500, text="nfproxy: unknown stream ticket")
        headers = [(k, v) for k, v in plan.headers if k.lower() not in HOP_BY_HOP and k.lower() != "content-length"]
        resp = web.StreamResponse(status=plan.status, headers=headers)
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        start = time.monotonic()
        for offset, chunk in plan.chunks():
            if plan.timed:
                delay = offset / 1000 - (time.monotonic() - start)
                if delay > 0:
                    await asyncio.sleep(delay)
            await resp.write(chunk)
        await resp.write_eof()
        return resp
