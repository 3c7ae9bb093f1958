"""Replay what is recorded, record what is new (VCR's `new_episodes`): a front on loopback that
asks a strict replay first and, only when that answers a miss, the recording proxy behind it.

Both proxies are ordinary `nfproxy run` processes; this front only forwards bytes. A request the
recording holds never reaches upstream, and what reaches upstream is recorded in a store of its
own, which the caller merges into the recording afterwards (`nfproxy merge`).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

from noisefloor.proxy.request.headers import HOP_BY_HOP

_DROPPED = HOP_BY_HOP | {"host", "content-length"}
TIMEOUT_S = 300.0  # one forwarded exchange at most (a long stream included)


class Episodes:
    """`start()` returns the front's URL; `stop()` ends it. Counts what went where."""

    def __init__(self, replay_url: str, record_url: str) -> None:
        self.replay_url = replay_url.rstrip("/")
        self.record_url = record_url.rstrip("/")
        self.replayed = 0
        self.recorded = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None

    def start(self) -> str:
        self._thread.start()
        return asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self) -> str:
        self._session = ClientSession(auto_decompress=False, timeout=ClientTimeout(total=TIMEOUT_S))
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _stop(self) -> None:
        assert self._runner is not None and self._session is not None
        await self._runner.cleanup()
        await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROPPED]
        for base in (self.replay_url, self.record_url):
            upstream = await self._session.request(request.method, base + request.path_qs, headers=headers,
                                                   data=body, allow_redirects=False)
            if base == self.replay_url and upstream.headers.get("x-nf-replay") == "miss":
                await upstream.read()
                upstream.release()
                continue
            if base == self.replay_url:
                self.replayed += 1
            else:
                self.recorded += 1
            return await self._relay(request, upstream)
        raise AssertionError("unreachable: the recorder answers every request")

    @staticmethod
    async def _relay(request: web.Request, upstream: Any) -> web.StreamResponse:
        """The answer as it arrives, chunk by chunk (a stream stays a stream)."""
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for k, v in upstream.headers.items():
            if k.lower() not in _DROPPED:
                resp.headers.add(k, v)
        try:
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
        finally:
            upstream.release()
        return resp
