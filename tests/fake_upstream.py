"""A real aiohttp server on loopback that speaks enough of the OpenAI and Anthropic JSON APIs.

Every answer differs (a counter is part of it), so a replay that reached it by mistake, or that
served the wrong occurrence, is visible. It counts TCP connections, so a test can prove replay made
none. Special models: "status-429" and "status-500" answer with that error status.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeUpstream:
    host: str = "127.0.0.1"
    gzip_responses: bool = False
    ssl_context: Any = None  # an ssl.SSLContext: serve HTTPS
    responder: Any = None  # optional fn(request doc, n) -> assistant text for chat completions
    served: Any = None  # optional fn(request doc, n) -> the model a chat completion names (default: asked + date)
    requests: list[Seen] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    _counter: itertools.count = field(default_factory=lambda: itertools.count(1))

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> FakeUpstream:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake upstream did not start within 10 s")
        return self

    def stop(self) -> None:
        if getattr(self, "_loop", None) is None:
            return
        self._loop.call_soon_threadsafe(self._server.close)
        fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        fut.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://{self.host}:{self.port}"

    def _routes(self, app: web.Application) -> None:
        """The APIs it speaks (a subclass adds its own before the echo route)."""
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/v1/messages", self._anthropic)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post(r"/v1beta/models/{model:[^/:]+}:generateContent", self._gemini)
        app.router.add_post(r"/v1/models/{model:[^/:]+}:generateContent", self._gemini)  # google-genai 2+

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        self._routes(app)
        app.router.add_route("*", "/{tail:.*}", self._echo)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, handler_cancellation=True)
        self._loop.run_until_complete(self._runner.setup())
        handler_factory = self._runner.server

        def counting_factory() -> Any:  # every accepted TCP connection passes through here
            self.connections += 1
            return handler_factory()

        server = self._loop.run_until_complete(
            self._loop.create_server(counting_factory, self.host, self.port, ssl=self.ssl_context)
        )
        self._server = server
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()

    # -- handlers --------------------------------------------------------------------------------

    async def _record(self, request: web.Request) -> tuple[int, dict[str, Any]]:
        body = await request.read()
        self.requests.append(Seen(request.path_qs, dict(request.headers), body))
        try:
            doc = json.loads(body) if body else {}
        except (ValueError, RecursionError):  # hostile bodies are the proxy's problem, not this server's
            doc = {}
        return next(self._counter), doc if isinstance(doc, dict) else {}

    def _reply(self, payload: dict[str, Any], status: int = 200) -> web.Response:
        data = json.dumps(payload).encode()
        headers = {"content-type": "application/json", "set-cookie": "upstream-session=cookie-secret"}
        if self.gzip_responses:
            data = gzip.compress(data)
            headers["content-encoding"] = "gzip"
        return web.Response(body=data, status=status, headers=headers)

    def _maybe_error(self, doc: dict[str, Any]) -> web.Response | None:
        model = str(doc.get("model", ""))
        if model.startswith("status-"):
            status = int(model.split("-", 1)[1])
            return self._reply({"error": {"message": f"injected {status}", "type": "injected"}}, status)
        return None

    async def _events(self, request: web.Request, doc: dict[str, Any], events: list[bytes]) -> web.StreamResponse:
        """Send SSE events with a pause between them; `x_stall` stops sending after two (bounded)."""
        resp = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
        await resp.prepare(request)
        pause = float(doc.get("x_pause_ms", 20)) / 1000
        for i, ev in enumerate(events):
            if i:
                await asyncio.sleep(pause)
            await resp.write(ev)
            if doc.get("x_stall") and i == 1:
                await asyncio.sleep(30)  # the proxy's stall timeout must cut this short
                return resp
        await resp.write_eof()
        return resp

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        n, doc = await self._record(request)
        if (err := self._maybe_error(doc)) is not None:
            return err
        model = self.served(doc, n) if self.served else doc.get("model", "gpt-test") + "-2024-07-18"
        if doc.get("stream"):
            base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 1700000000 + n,
                    "model": model, "system_fingerprint": f"fp_{n % 3}"}
            count = int(doc.get("x_events", 5))
            if self.responder:  # the responder's text, cut into `count` deltas
                text = self.responder(doc, n)
                step = -(-len(text) // count)
                pieces = [text[i:i + step] for i in range(0, len(text), step)]
            else:
                pieces = [f"tok{i}-{n} " for i in range(count)]
            events = [_sse(dict(base, choices=[{"index": 0, "delta": {"content": p}, "finish_reason": None}]))
                      for p in pieces]
            events.append(_sse(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])))
            if (doc.get("stream_options") or {}).get("include_usage"):
                events.append(_sse(dict(base, choices=[], usage={"prompt_tokens": 10 + n, "completion_tokens": count,
                                                                "total_tokens": 10 + n + count})))
            events.append(b"data: [DONE]\n\n")
            return await self._events(request, doc, events)
        return self._reply(
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "created": 1700000000 + n,
                "model": model,
                "system_fingerprint": f"fp_{n % 3}",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant",
                                    "content": self.responder(doc, n) if self.responder else f"answer number {n}"},
                        "finish_reason": "length" if doc.get("max_tokens") == 1 else "stop",
                    }
                ],
                "usage": {"prompt_tokens": 10 + n, "completion_tokens": n, "total_tokens": 10 + 2 * n},
            }
        )

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        n, doc = await self._record(request)
        if (err := self._maybe_error(doc)) is not None:
            return err
        if doc.get("stream"):
            model = doc.get("model", "claude-test")
            count = int(doc.get("x_events", 5))
            events = [
                _sse({"type": "message_start", "message": {"id": f"msg_{n}", "type": "message", "role": "assistant",
                      "model": model, "content": [], "stop_reason": None, "stop_sequence": None,
                      "usage": {"input_tokens": 5 + n, "output_tokens": 1}}}, "message_start"),
                _sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                     "content_block_start"),
                *[_sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta",
                        "text": f"part{i}-{n} "}}, "content_block_delta") for i in range(count)],
                _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
                _sse({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                      "usage": {"output_tokens": count}}, "message_delta"),
                _sse({"type": "message_stop"}, "message_stop"),
            ]
            return await self._events(request, doc, events)
        return self._reply(
            {
                "id": f"msg_{n}",
                "type": "message",
                "role": "assistant",
                "model": doc.get("model", "claude-test"),
                "content": [{"type": "text", "text": f"anthropic answer {n}"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 5 + n, "output_tokens": n},
            }
        )

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        """The OpenAI Responses API (what inspect_ai and newer SDK code call by default)."""
        n, doc = await self._record(request)
        if (err := self._maybe_error(doc)) is not None:
            return err
        model = doc.get("model", "gpt-test") + "-2025-08-07"
        text = self.responder(doc, n) if self.responder else f"response number {n}"
        message = {"type": "message", "id": f"msg_{n}", "status": "completed", "role": "assistant",
                   "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}
        usage = {"input_tokens": 10 + n, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": n,
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 10 + 2 * n}
        response = {"id": f"resp_{n}", "object": "response", "created_at": 1700000000 + n, "status": "completed",
                    "model": model, "output": [message], "usage": usage, "parallel_tool_calls": True,
                    "tool_choice": "auto", "tools": [], "error": None, "incomplete_details": None,
                    "instructions": None, "metadata": {}, "temperature": doc.get("temperature", 1.0), "top_p": 1.0}
        if not doc.get("stream"):
            return self._reply(response)
        events = [_sse({"type": "response.created", "sequence_number": 0,
                        "response": dict(response, status="in_progress", output=[])}, "response.created")]
        events += [_sse({"type": "response.output_text.delta", "sequence_number": i + 1, "item_id": f"msg_{n}",
                         "output_index": 0, "content_index": 0, "delta": part}, "response.output_text.delta")
                   for i, part in enumerate(text.split(" "))]
        events.append(_sse({"type": "response.completed", "sequence_number": len(events) + 1, "response": response},
                           "response.completed"))
        return await self._events(request, doc, events)

    async def _gemini(self, request: web.Request) -> web.Response:
        n, doc = await self._record(request)
        return self._reply({
            "candidates": [{"content": {"parts": [{"text": f"gemini answer {n}"}], "role": "model"},
                            "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 5 + n, "candidatesTokenCount": 3, "totalTokenCount": 8 + n},
            "modelVersion": request.match_info["model"],
        })

    async def _echo(self, request: web.Request) -> web.Response:
        n, _ = await self._record(request)
        return web.Response(body=f"echo {n} {request.method} {request.path_qs}".encode(), content_type="text/plain")


def _sse(doc: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(doc)}\n\n".encode()
