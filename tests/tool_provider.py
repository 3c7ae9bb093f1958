"""The built-in provider's tool-calling endpoint with chosen outcome shares (the product's own
endpoint draws from per-question rerun and rewording probabilities instead): each call is drawn (by the provider's own hash of seed, task, temperature and count)
to grade as a chosen outcome with a chosen share, so the audit's floors have a known truth."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from noisefloor.ladder.provider import BuiltinProvider, _prompt, _squash, tool_calls_for

TOOL_OUTCOMES = ("correct", "wrong_function", "wrong_arguments", "malformed_output", "other")


@dataclass
class ToolProvider(BuiltinProvider):
    tool_tasks: list[Any] = field(default_factory=list)  # BFCL ToolTasks answered with native tool calls
    tool_shares: dict[str, float] = field(default_factory=lambda: {"correct": 1.0})  # outcome -> share

    def __post_init__(self) -> None:
        super().__post_init__()
        self._by_question = {_squash(t.question[-1][-1]["content"]): t for t in self.tool_tasks}

    def tool_answer(self, prompt: str, temperature: float) -> tuple[str, list[dict[str, Any]]] | None:
        """(drawn outcome, tool calls) for a BFCL question, or None when the prompt is not one."""
        squashed = _squash(prompt)
        task = next((t for q, t in self._by_question.items() if q in squashed), None)
        if task is None:
            return None
        with self._lock:
            k = self._counts[(task.task_id, temperature)]
            self._counts[(task.task_id, temperature)] += 1
        u, acc = self._u("tool", task.task_id, temperature, k), 0.0
        total = sum(self.tool_shares.values())
        outcome = "correct"
        for name in TOOL_OUTCOMES:
            acc += self.tool_shares.get(name, 0.0) / total
            if u < acc:
                outcome = name
                break
        return outcome, tool_calls_for(task, outcome)

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        doc = await request.json()
        drawn = self.tool_answer(_prompt(doc), float(doc.get("temperature", 1.0))) if doc.get("tools") else None
        if drawn is None:
            return await super()._openai(request)
        self.requests += 1
        message = {"role": "assistant", "content": None, "tool_calls": drawn[1]}
        return web.json_response({"id": f"chatcmpl-nf{self.requests}", "object": "chat.completion",
                                  "model": "nf-builtin-1", "system_fingerprint": "fp_nf_builtin",
                                  "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})
