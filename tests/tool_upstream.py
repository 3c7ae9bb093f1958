"""A fake tool-calling model on loopback (a real aiohttp server) for third-party agents: OpenAI chat
completions (plain and streamed) and the Responses API.

Until the conversation holds a tool's result (text containing `forecast:`) it asks for the one
tool the agent offers (`get_weather`, or smolagents' `final_answer` once the result is in) with a
city it draws at random; then it answers with a sentence built around that result and a random
word, so repeated runs at temperature > 0 take different trajectories, as a sampled model does.
"""

from __future__ import annotations

import json
import random
from typing import Any

from aiohttp import web

from tests.fake_upstream import FakeUpstream, _sse

CITIES = ("Paris", "Lima", "Oslo", "Quito", "Hanoi", "Accra", "Perth", "Tunis")
WORDS = ("bring an umbrella", "wear boots", "stay inside", "take the tram", "pack a scarf", "expect puddles")


def _texts(value: Any) -> list[str]:
    """Every string inside a message list or input list (content parts, tool outputs)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


def _tool_names(doc: dict[str, Any]) -> list[str]:
    names = []
    for t in doc.get("tools") or []:
        if isinstance(t, dict):
            fn = t.get("function") if isinstance(t.get("function"), dict) else t
            if isinstance(fn.get("name"), str):
                names.append(fn["name"])
    return names


class ToolUpstream(FakeUpstream):
    def __init__(self, seed: int | None = None) -> None:
        super().__init__()
        self.rng = random.Random(seed)

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses_api)

    def decide(self, doc: dict[str, Any], history: Any) -> tuple[str, str | None, dict[str, Any] | None]:
        """(text, tool name, arguments): a tool call until a result is in, then the answer."""
        seen = [t for t in _texts(history) if "forecast:" in t]
        names = _tool_names(doc)
        if not seen:
            return "", "get_weather", {"city": self.rng.choice(CITIES)}
        answer = f"The {seen[-1].split('forecast:', 1)[1].strip()[:60]}, so {self.rng.choice(WORDS)}."
        if "final_answer" in names:
            return "", "final_answer", {"answer": answer}
        return answer, None, None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        n, doc = await self._record(request)
        text, tool, args = self.decide(doc, doc.get("messages"))
        call = {"id": f"call_{n}_{self.rng.randrange(10**6)}", "type": "function",
                "function": {"name": tool, "arguments": json.dumps(args)}} if tool else None
        message = {"role": "assistant", "content": text or None, **({"tool_calls": [call]} if call else {})}
        finish = "tool_calls" if call else "stop"
        usage = {"prompt_tokens": 20 + n, "completion_tokens": 7, "total_tokens": 27 + n}
        base = {"id": f"chatcmpl-{n}", "created": 1700000000 + n, "model": "gpt-test-2024", "system_fingerprint": "fp_t"}
        if not doc.get("stream"):
            return self._reply({**base, "object": "chat.completion", "usage": usage,
                                "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
        chunk = {**base, "object": "chat.completion.chunk"}
        deltas = [{"role": "assistant", "content": ""}]
        if call:
            deltas.append({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                           "function": {"name": tool, "arguments": ""}}]})
            arguments = call["function"]["arguments"]
            deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": arguments[i:i + 8]}}]}
                       for i in range(0, len(arguments), 8)]
        else:
            deltas += [{"content": text[i:i + 12]} for i in range(0, len(text), 12)]
        events = [_sse({**chunk, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}) for d in deltas]
        events.append(_sse({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
        if (doc.get("stream_options") or {}).get("include_usage"):
            events.append(_sse({**chunk, "choices": [], "usage": usage}))
        events.append(b"data: [DONE]\n\n")
        return await self._events(request, doc, events)

    async def _responses_api(self, request: web.Request) -> web.StreamResponse:
        n, doc = await self._record(request)
        text, tool, args = self.decide(doc, doc.get("input"))
        if tool:
            item = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}_{self.rng.randrange(10**6)}",
                    "name": tool, "arguments": json.dumps(args), "status": "completed"}
        else:
            item = {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}
        return self._reply({"id": f"resp_{n}", "object": "response", "created_at": 1700000000 + n, "status": "completed",
                            "model": "gpt-test-2024", "output": [item], "parallel_tool_calls": False, "tools": [],
                            "tool_choice": "auto", "usage": {"input_tokens": 20 + n, "output_tokens": 7,
                                                             "total_tokens": 27 + n,
                                                             "input_tokens_details": {"cached_tokens": 0},
                                                             "output_tokens_details": {"reasoning_tokens": 0}}})
