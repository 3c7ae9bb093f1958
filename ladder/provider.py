"""The built-in provider: an OpenAI- and Anthropic-compatible server whose answers are drawn from
per-task candidate pools with known pass probabilities, so the ladder's truth is known.

Task i has a pass probability q_i at "live" temperatures (T >= 0.7) and p0_i at T = 0: the
greedy answer (right when q_i >= 0.5) flips with a small residual probability r_i on some tasks,
as hosted models do. Between the two, p_i(T) moves linearly. The true within-task variance of a
condition is then mean_i p_i(T)(1 - p_i(T)).

Two more endpoints have known truth of their own. A judge (a chat request holding the judge
prompt of `judge_study.py`): task i accepts a right candidate with probability a_i and a wrong one
with b_i; at T=0 it gives its more likely verdict every time, above it draws, and a share of its
T>0 replies is cut off before the verdict (unparseable). Tool calling (a chat request with `tools`
asking a BFCL question): at T=0 each question has a greedy outcome that a rerun flips with
probability f_i; a reworded question (any text other than the original: a perturbation) has its
own greedy outcome, a different one with probability s_i; wrong answers are malformed with a
known share.

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
JUDGE_MARK = "Reply with VERDICT: PASS or VERDICT: FAIL"  # what makes a chat request a judge request
CANDIDATE_MARK = "Keep the answer short."  # a prompt holding it is answered by the gate demo's candidate model


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


def candidate_models(models: dict[str, TaskModel]) -> dict[str, TaskModel]:
    """The gate demo's candidate: the baseline with four settled-right tasks broken, two fully
    (pass rate 0: regressed at k=8) and two to 0.5 at live temperature (usually inconclusive at
    k=8, so the gate re-runs them to k=16)."""
    out = dict(models)
    settled = [tid for tid, m in models.items() if m.q == 1.0 and m.residual == 0.0]
    for tid in settled[:2]:
        out[tid] = TaskModel(0.0, 0.0)
    for tid in settled[2:4]:
        out[tid] = TaskModel(0.5, 0.0)
    return out


def true_w(models: dict[str, TaskModel], temperature: float, task_ids: list[str] | None = None) -> float:
    ids = task_ids or list(models)
    return sum(models[i].p(temperature) * (1 - models[i].p(temperature)) for i in ids) / len(ids)


@dataclass(frozen=True)
class JudgeModel:
    accept_right: float  # P(accept) for a candidate that passes its tests
    accept_wrong: float  # P(accept) for one that fails

    def p_accept(self, right: bool, temperature: float) -> float:
        p = self.accept_right if right else self.accept_wrong
        return float(p >= 0.5) if temperature <= 0 else p


JUDGE_UNPARSEABLE = 0.08  # share of T>0 judge replies cut off before the verdict


def judge_models(tasks: list[SuiteTask], seed: int) -> dict[str, JudgeModel]:
    """Mostly a good judge; on some tasks it leans the wrong way whatever the candidate (the known
    disagreement set: at T=0 it always disagrees there), on some it is unsure but leans right."""
    rng = random.Random(seed * 7919 + 13)
    out = {}
    for t in tasks:
        u = rng.random()
        if u < 0.6:
            out[t.task_id] = JudgeModel(0.92, 0.08)
        elif u < 0.85:
            out[t.task_id] = JudgeModel(round(rng.uniform(0.2, 0.4), 3), round(rng.uniform(0.6, 0.8), 3))
        else:
            out[t.task_id] = JudgeModel(0.68, 0.32)
    if tasks and not any(m.accept_right < 0.5 for m in out.values()):  # keep the set non-empty
        out[tasks[-1].task_id] = JudgeModel(0.3, 0.7)
    return out


TOOL_WRONG = {"wrong_arguments": 0.5, "malformed_output": 0.3, "wrong_function": 0.2}  # wrong answers' mix


@dataclass(frozen=True)
class ToolModel:
    greedy_right: bool  # the T=0 answer to the original question
    rerun_flip: float  # f_i: a rerun answers the other way
    reword_switch: float  # s_i: a reworded question's greedy answer is the other way


def tool_models(task_ids: list[str], seed: int) -> dict[str, ToolModel]:
    rng = random.Random(seed * 104729 + 7)
    out = {}
    for tid in task_ids:
        right = rng.random() < 0.75
        flip = round(rng.uniform(0.05, 0.25), 3) if rng.random() < 0.35 else 0.0
        switch = round(rng.uniform(0.3, 0.7), 3) if rng.random() < 0.7 else 0.05
        out[tid] = ToolModel(right, flip, switch)
    return out


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
    tool_tasks: list[Any] = field(default_factory=list)  # BFCL ToolTasks answered with native tool calls

    def __post_init__(self) -> None:
        self.models = task_models(self.tasks, self.seed)
        self.candidate_models = candidate_models(self.models)
        self.judges = judge_models(self.tasks, self.seed)
        self.tool_models = tool_models([t.task_id for t in self.tool_tasks], self.seed)
        self._by_question = {_squash(t.question[-1][-1]["content"]): t for t in self.tool_tasks}
        self.running = False
        self._by_name = {t.entry_point: t for t in self.tasks}
        self._counts: dict[tuple[Any, ...], int] = defaultdict(int)
        self._lock = threading.Lock()
        self.requests = 0

    def restore(self, counts: dict[tuple[Any, ...], int]) -> None:
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
        models = self.candidate_models if CANDIDATE_MARK in prompt else self.models
        right = self._u("pass", *draw) < models[task.task_id].p(temperature)
        pool = task.right if right else task.wrong
        body = pool[int(self._u("pick", *draw) * len(pool))]
        if not chat:
            return body, None
        return f"Here is the implementation:\n\n```python\n{task.program(body)}```\n", None

    def judge_reply(self, prompt: str, temperature: float) -> str | None:
        """The judge's reply to a judge prompt, None when the prompt is not one."""
        if JUDGE_MARK not in prompt:
            return None
        task = self._find(prompt)
        if task is None:
            return "I cannot tell which task this is."
        right = self.candidate_is_right(task, prompt)
        with self._lock:
            k = self._counts[("judge", task.task_id, temperature)]
            self._counts[("judge", task.task_id, temperature)] += 1
        draw = ("judge", task.task_id, temperature, k)
        if temperature > 0 and self._u("cut", *draw) < JUDGE_UNPARSEABLE:
            return "Looking at the candidate carefully, the"  # cut off before any verdict
        p = self.judges[task.task_id].p_accept(bool(right), temperature)
        accept = self._u("verdict", *draw) < p
        conf = 0.55 + 0.4 * self._u("conf", *draw) if temperature > 0 else 0.8
        return f"VERDICT: {'PASS' if accept else 'FAIL'}\nCONFIDENCE: {conf:.2f}\nThe candidate was reviewed."

    def candidate_is_right(self, task: SuiteTask, prompt: str) -> bool | None:
        """Whether the candidate in a judge prompt is one of the task's right bodies (the longest
        body whose whole program appears wins, so a right body inside a wrong one does not)."""
        found = [(len(b), ok) for ok, pool in ((True, task.right), (False, task.wrong)) for b in pool
                 if task.program(b) in prompt]
        return max(found)[1] if found else None

    def tool_right_probability(self, tool_task: Any, prompt: str, temperature: float) -> float:
        """P(a call answering `prompt` for this task is correct): the known truth of the audit."""
        m = self.tool_models[tool_task.task_id]
        original = prompt.strip() == tool_task.question[-1][-1]["content"].strip()
        wording = "" if original else hashlib.sha256(prompt.encode()).hexdigest()[:16]
        greedy = m.greedy_right if original else (
            m.greedy_right != (self._u("switch", tool_task.task_id, wording) < m.reword_switch))
        flip = m.rerun_flip if temperature <= 0 else max(m.rerun_flip, 0.3)
        return 1 - flip if greedy else flip

    def tool_answer(self, prompt: str, temperature: float) -> tuple[str, list[dict[str, Any]]] | None:
        """(drawn outcome, tool calls) for a BFCL question, or None when the prompt holds none."""
        squashed = _squash(prompt)
        hit = next(((q, t) for q, t in self._by_question.items() if q in squashed), None)
        if hit is None:
            return None
        tool_task = hit[1]
        m = self.tool_models[tool_task.task_id]
        original = prompt.strip() == tool_task.question[-1][-1]["content"].strip()
        wording = "" if original else hashlib.sha256(prompt.encode()).hexdigest()[:16]
        with self._lock:
            key = ("tool", tool_task.task_id, temperature, wording)
            k = self._counts[key]
            self._counts[key] += 1
        greedy = m.greedy_right if original else (
            m.greedy_right != (self._u("switch", tool_task.task_id, wording) < m.reword_switch))
        flip = m.rerun_flip if temperature <= 0 else max(m.rerun_flip, 0.3)
        right = greedy != (self._u("flip", tool_task.task_id, temperature, wording, k) < flip)
        outcome = "correct"
        if not right:
            u, acc = self._u("kind", tool_task.task_id, temperature, wording, k), 0.0
            outcome = "wrong_arguments"
            for name, share in TOOL_WRONG.items():
                acc += share
                if u < acc:
                    outcome = name
                    break
        return outcome, tool_calls_for(tool_task, outcome)

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
        app.router.add_get("/v1/models", self._models)
        return app

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": "nf-builtin-1", "object": "model",
                                                              "owned_by": "noisefloor"}]})

    async def _common(self, request: web.Request, doc: dict[str, Any] | None = None,
                      ) -> tuple[dict[str, Any], str, str | None]:
        self.requests += 1
        doc = doc if doc is not None else await request.json()
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
        doc = await request.json()
        temperature = float(doc.get("temperature", 1.0))
        drawn = self.tool_answer(_prompt(doc), temperature) if doc.get("tools") and self.tool_tasks else None
        if drawn is not None:
            self.requests += 1
            message = {"role": "assistant", "content": None, "tool_calls": drawn[1]}
            out_tokens = len(json.dumps(drawn[1])) // 4
            return web.json_response({"id": f"chatcmpl-nf{self.requests}", "object": "chat.completion",
                                      "created": 1_700_000_000, "model": "nf-builtin-1",
                                      "system_fingerprint": "fp_nf_builtin",
                                      "usage": {"prompt_tokens": 120, "completion_tokens": out_tokens,
                                                "total_tokens": 120 + out_tokens},
                                      "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})
        judged = self.judge_reply(_prompt(doc), temperature)
        if judged is not None:
            self.requests += 1
            return web.json_response({"id": f"chatcmpl-nf{self.requests}", "object": "chat.completion",
                                      "created": 1_700_000_000, "model": "nf-builtin-1",
                                      "system_fingerprint": "fp_nf_builtin",
                                      "usage": {"prompt_tokens": 200, "completion_tokens": len(judged) // 4,
                                                "total_tokens": 200 + len(judged) // 4}, "choices": [
                                          {"index": 0, "message": {"role": "assistant", "content": judged},
                                           "finish_reason": "stop"}]})
        doc, text, fault = await self._common(request, doc)
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
        self.running = True
        return self

    def stop(self) -> None:
        if not self.running:
            return
        self.running = False
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(15)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def tool_calls_for(task: Any, outcome: str) -> list[dict[str, Any]]:
    """OpenAI tool calls for a BFCL task that grade as `outcome`, built from its ground truth."""
    from noisefloor.verifier.bfcl import ground_truth_calls

    calls = [{"name": c.name, "arguments": json.dumps(c.arguments)} for c in ground_truth_calls(task)]
    if outcome == "wrong_function":
        calls[0]["name"] = "no_such_function"
    elif outcome == "wrong_arguments":
        args = json.loads(calls[0]["arguments"])
        args[next(iter(args), "unexpected_argument")] = "__not_an_allowed_value__"
        calls[0]["arguments"] = json.dumps(args)
    elif outcome == "malformed_output":
        calls[0]["arguments"] = calls[0]["arguments"][: max(1, len(calls[0]["arguments"]) // 2)]
    elif outcome == "other":
        calls.append(dict(calls[0]))
    return [{"id": f"call_{i}", "type": "function", "function": c} for i, c in enumerate(calls)]


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
