"""The built-in provider: an OpenAI- and Anthropic-compatible server whose answers are drawn from
per-task candidate pools with known pass probabilities, so the ladder's truth is known.

Task i has a pass probability q_i at "live" temperatures (T >= 0.7) and p0_i at T = 0: the
greedy answer (right when q_i >= 0.5) flips with a small residual probability r_i on some tasks,
as hosted models do. Between the two, p_i(T) moves linearly. The true within-task variance of a
condition is then mean_i p_i(T)(1 - p_i(T)).

Every random choice is a hash of (seed, task, temperature, k) where k counts this provider's
requests for that task and temperature, so a rerun with the same seed draws the same answers,
whatever order concurrent agents arrive in (per task, the multiset of draws is fixed).
Faults (429s, latency, dropped connections) are drawn the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from noisefloor.ladder.suite import SuiteTask

LIVE_T = 0.7


@dataclass(frozen=True)
class TaskModel:
    q: float  # pass probability at live temperature
    residual: float  # probability that the T=0 greedy answer flips

    @property
    def p0(self) -> float:
        greedy_right = self.q >= 0.5
        return 1 - self.residual if greedy_right else self.residual

    def p(self, temperature: float) -> float:
        mix = min(1.0, max(0.0, temperature) / LIVE_T)
        return self.p0 + (self.q - self.p0) * mix


def task_models(tasks: list[SuiteTask], seed: int) -> dict[str, TaskModel]:
    """Per-task parameters: most tasks settled (always right or wrong), some genuinely uncertain."""
    rng = random.Random(seed)
    out = {}
    for t in tasks:
        u = rng.random()
        if u < 0.5:
            q, r = 1.0, 0.0
        elif u < 0.65:
            q, r = 0.0, 0.0
        else:
            q = round(rng.uniform(0.2, 0.9), 3)
            r = round(rng.uniform(0.05, 0.3), 3) if rng.random() < 0.45 else 0.0
        out[t.task_id] = TaskModel(q, r)
    return out


def true_w(models: dict[str, TaskModel], temperature: float, task_ids: list[str] | None = None) -> float:
    ids = task_ids or list(models)
    return sum(models[i].p(temperature) * (1 - models[i].p(temperature)) for i in ids) / len(ids)


@dataclass
class Faults:
    rate_limit: float = 0.0  # probability of a 429
    drop: float = 0.0  # probability of closing the connection without an answer
    latency_ms: float = 0.0


@dataclass
class BuiltinProvider:
    tasks: list[SuiteTask]
    seed: int = 0
    faults: Faults = field(default_factory=Faults)
    host: str = "127.0.0.1"
    port: int = 0

    def __post_init__(self) -> None:
        self.models = task_models(self.tasks, self.seed)
        self._by_name = {t.entry_point: t for t in self.tasks}
        self._counts: dict[tuple[str, float], int] = defaultdict(int)
        self._lock = threading.Lock()
        self.requests = 0

    def restore(self, counts: dict[tuple[str, float], int]) -> None:
        """Continue the draw counters after requests an earlier run already made (resume)."""
        with self._lock:
            for key, n in counts.items():
                self._counts[key] = max(self._counts[key], n)

    # -- the model ---------------------------------------------------------------------------

    def _u(self, *parts: object) -> float:
        h = hashlib.sha256(json.dumps([self.seed, *parts]).encode()).digest()
        return int.from_bytes(h[:8], "big") / 2**64

    def answer(self, prompt: str, temperature: float, chat: bool = True) -> tuple[str, str | None]:
        """(assistant text, fault) for a prompt; fault is None, '429' or 'drop'. A chat answer is the whole
        function in a fenced block; a completion (`chat=False`) continues the prompt with the body."""
        task = self._find(prompt)
        if task is None:
            return "I do not recognize this task.", None
        with self._lock:
            k = self._counts[(task.task_id, temperature)]
            self._counts[(task.task_id, temperature)] += 1
        draw = (task.task_id, temperature, k)
        if self._u("429", *draw) < self.faults.rate_limit:
            return "", "429"
        if self._u("drop", *draw) < self.faults.drop:
            return "", "drop"
        right = self._u("pass", *draw) < self.models[task.task_id].p(temperature)
        pool = task.right if right else task.wrong
        body = pool[int(self._u("pick", *draw) * len(pool))]
        if not chat:
            return body, None
        return f"Here is the implementation:\n\n```python\n{task.program(body)}```\n", None

    def _find(self, prompt: str) -> SuiteTask | None:
        for name in re.findall(r"def\s+([A-Za-z_]\w*)\s*\(", prompt):
            if name in self._by_name:
                return self._by_name[name]
        return None

    # -- HTTP --------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/messages", self._anthropic)
        return app

    async def _common(self, request: web.Request) -> tuple[dict[str, Any], str, str | None]:
        self.requests += 1
        doc = await request.json()
        if self.faults.latency_ms:
            await asyncio.sleep(self.faults.latency_ms / 1000)
        chat = "prompt" not in doc
        prompt = _prompt(doc) if chat else _text(doc["prompt"])
        text, fault = self.answer(prompt, float(doc.get("temperature", 1.0)), chat)
        return doc, text, fault

    async def _fault(self, request: web.Request, fault: str) -> web.StreamResponse:
        if fault == "429":
            return web.json_response({"error": {"type": "rate_limit_error", "message": "injected rate limit"}},
                                     status=429, headers={"retry-after": "0"})
        transport = request.transport
        if transport is not None:
            transport.close()
        return web.Response(status=500)

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        doc, text, fault = await self._common(request)
        if fault:
            return await self._fault(request, fault)
        base = {"id": f"chatcmpl-nf{self.requests}", "created": 1_700_000_000, "model": "nf-builtin-1",
                "system_fingerprint": "fp_nf_builtin"}
        usage = {"prompt_tokens": 50, "completion_tokens": len(text) // 4, "total_tokens": 50 + len(text) // 4}
        if not doc.get("stream"):
            return web.json_response(base | {"object": "chat.completion", "usage": usage, "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})
        events = [base | {"object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"content": piece}, "finish_reason": None}]} for piece in _pieces(text)]
        events.append(base | {"object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {}, "finish_reason": "stop"}]})
        if (doc.get("stream_options") or {}).get("include_usage"):
            events.append(base | {"object": "chat.completion.chunk", "choices": [], "usage": usage})
        return await _sse(request, [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"])

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        """The legacy completions endpoint base models are served on (llama.cpp, vLLM, TGI)."""
        _, text, fault = await self._common(request)
        if fault:
            return await self._fault(request, fault)
        return web.json_response({"id": f"cmpl-nf{self.requests}", "object": "text_completion",
                                  "created": 1_700_000_000, "model": "nf-builtin-1", "choices": [
                                      {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
                                  "usage": {"prompt_tokens": 50, "completion_tokens": len(text) // 4,
                                            "total_tokens": 50 + len(text) // 4}})

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        doc, text, fault = await self._common(request)
        if fault:
            return await self._fault(request, fault)
        usage = {"input_tokens": 50, "output_tokens": len(text) // 4}
        message = {"id": f"msg_nf{self.requests}", "type": "message", "role": "assistant", "model": "nf-builtin-1",
                   "stop_reason": "end_turn", "stop_sequence": None, "usage": usage}
        if not doc.get("stream"):
            return web.json_response(message | {"content": [{"type": "text", "text": text}]})
        events = [("message_start", {"type": "message_start", "message": message | {"content": [], "stop_reason": None}}),
                  ("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}})]
        events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": p}}) for p in _pieces(text)]
        events += [("content_block_stop", {"type": "content_block_stop", "index": 0}),
                   ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage}),
                   ("message_stop", {"type": "message_stop"})]
        return await _sse(request, [f"event: {k}\ndata: {json.dumps(v)}\n\n" for k, v in events])

    # -- running -----------------------------------------------------------------------------

    def start(self) -> BuiltinProvider:
        """Serve on a background thread (loopback); `url` is valid once this returns."""
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self.host, self.port)
            self._loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True, name="nf-builtin-provider")
        self._thread.start()
        if not ready.wait(15):
            raise RuntimeError("the built-in provider did not start")
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(15)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def _squash(text: str) -> str:
    return " ".join(text.split())


def _prompt(doc: dict[str, Any]) -> str:
    messages = doc.get("messages") or []
    return "\n".join(_text(m.get("content")) for m in messages if m.get("role") == "user")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _pieces(text: str, size: int = 24) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


async def _sse(request: web.Request, events: list[str]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
    await resp.prepare(request)
    for e in events:
        await resp.write(e.encode())
    await resp.write_eof()
    return resp
