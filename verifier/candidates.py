"""Candidates from the proxy log: one per session, its final answer, and its task.

A session is one agent run (one task replicate under one condition). Its candidate is the last
exchange that got a successful (2xx) answer: with the one-retry structure, the retry's answer
replaces the first one. Task: the session's `x-nf-task` label; without one, the task whose
prompt text appears in the request (the longest such prompt, so a prompt that is a prefix of
another does not win). Replicate: the label; without one, the session's rank among sessions of
the same task and condition, by first exchange. Condition: the label, else "unlabeled".
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from noisefloor.outcome_rows import replicate_of
from noisefloor.proxy.providers import sse_events
from noisefloor.proxy.request.headers import header
from noisefloor.proxy.store.exchange import Exchange
from noisefloor.proxy.store.log import Store


@dataclass(frozen=True)
class Requested:
    """What the final request asked for (after the proxy's overrides): the model and its sampling."""
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None


@dataclass(frozen=True)
class SessionRef:
    """One session as a pass over the log keeps it: labels and exchange ids, no bodies, so that
    memory grows with sessions, never with what they said."""
    session: str
    task_id: str | None
    condition: str
    replicate: int
    final_id: int | None  # the last exchange with a 2xx answer; None: the session got no answer


@dataclass(frozen=True)
class Candidate:
    """A session's candidate: its final answered exchange, that answer as one JSON document
    (streams assembled) and what its request asked for."""
    ref: SessionRef
    exchange: Exchange | None
    body: dict[str, Any] | None
    requested: Requested

    @property
    def session(self) -> str:
        return self.ref.session

    @property
    def task_id(self) -> str | None:
        return self.ref.task_id

    @property
    def condition(self) -> str:
        return self.ref.condition

    @property
    def replicate(self) -> int:
        return self.ref.replicate


def assemble_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A streamed answer (OpenAI chat chunks or Anthropic events) as the equivalent whole response."""
    if any(e.get("type") == "message_start" for e in events):
        blocks: dict[int, dict[str, Any]] = {}
        message: dict[str, Any] = {"type": "message", "content": []}
        partial_json: dict[int, str] = defaultdict(str)
        for e in events:
            kind = e.get("type")
            if kind == "message_start":
                message.update({k: v for k, v in e.get("message", {}).items() if k != "content"})
            elif kind == "content_block_start":
                blocks[e["index"]] = dict(e.get("content_block", {}))
            elif kind == "content_block_delta":
                d = e.get("delta", {})
                block = blocks.setdefault(e.get("index", 0), {"type": "text", "text": ""})
                if d.get("type") == "text_delta":
                    block["text"] = block.get("text", "") + d.get("text", "")
                elif d.get("type") == "input_json_delta":
                    partial_json[e.get("index", 0)] += d.get("partial_json", "")
            elif kind == "message_delta":
                message["stop_reason"] = e.get("delta", {}).get("stop_reason")
        for i, text in partial_json.items():
            try:
                blocks[i]["input"] = json.loads(text) if text else {}
            except ValueError:
                blocks[i]["input"] = text  # left unparsed: the grader calls it malformed
        message["content"] = [blocks[i] for i in sorted(blocks)]
        return message
    tools: dict[int, dict[str, Any]]
    content, finish, tools = "", None, {}
    for e in events:
        for ch in e.get("choices") or []:
            delta = ch.get("delta") or {}
            content += delta.get("content") or ""
            finish = ch.get("finish_reason") or finish
            for tc in delta.get("tool_calls") or []:
                slot = tools.setdefault(tc.get("index", 0), {"id": tc.get("id"), "type": "function",
                                                             "function": {"name": "", "arguments": ""}})
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
    message = {"role": "assistant", "content": content or None}
    if tools:
        message["tool_calls"] = [tools[i] for i in sorted(tools)]
    return {"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def response_json(store: Store, ex: Exchange) -> dict[str, Any] | None:
    if ex.response is None:
        return None
    data = (store.bodies.decoded(ex.response, ex.id) or b"")
    ctype = header(ex.response["headers"], "content-type", "")
    if ctype.lower().startswith("text/event-stream"):
        return assemble_stream(sse_events(data))
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def response_text(body: Mapping[str, Any] | None) -> str:
    """The assistant's text in an OpenAI (chat or Responses), Anthropic or Gemini response."""
    if not body:
        return ""
    if isinstance(body.get("choices"), list) and body["choices"]:
        choice = body["choices"][0]
        msg = choice.get("message") or {}
        return msg.get("content") or choice.get("text") or ""
    if isinstance(body.get("content"), list):
        return "".join(b.get("text", "") for b in body["content"] if isinstance(b, dict) and b.get("type") == "text")
    if isinstance(body.get("output"), list):
        return "".join(c.get("text", "") for item in body["output"] if isinstance(item, dict)
                       for c in item.get("content") or [] if isinstance(c, dict))
    for cand in body.get("candidates") or []:
        return "".join(p.get("text", "") for p in (cand.get("content") or {}).get("parts") or [] if isinstance(p, dict))
    return ""


def sessions(store: Store, prompts: Mapping[str, str] | None = None, modes: Iterable[str] = ("record", "replay"),
             ) -> list[SessionRef]:
    """One reference per session, in order of first appearance, from one pass over the records."""
    wanted = set(modes)
    firsts: dict[str, tuple[int, str | None, str | None, str | None]] = {}  # id, task, condition, replicate
    finals: dict[str, int] = {}
    labelled: dict[str, str] = {}
    for ex in store.exchanges():
        if ex.mode in wanted:
            firsts.setdefault(ex.session, (ex.id, ex.task, ex.condition, ex.replicate))
            if ex.task and ex.session not in labelled:
                labelled[ex.session] = ex.task
            if ex.response is not None and 200 <= ex.response["status"] < 300:
                finals[ex.session] = ex.id
    ranked = sorted((prompts or {}).items(), key=lambda kv: -len(kv[1]))
    out: list[SessionRef] = []
    counters: dict[tuple[str | None, str], int] = defaultdict(int)
    for name, (first_id, task, condition, replicate) in firsts.items():
        task = task or labelled.get(name) or _task_in_request(store, first_id, ranked)
        condition = condition or "unlabeled"
        rank = replicate_of(replicate)  # the exchange's text label as the row's int
        if rank is None:
            rank = counters[(task, condition)]
            counters[(task, condition)] += 1
        out.append(SessionRef(name, task, condition, rank, finals.get(name)))
    return out


def _task_in_request(store: Store, first_id: int, ranked: list[tuple[str, str]]) -> str | None:
    """The task whose prompt the session's first request carries (the longest such prompt)."""
    if not ranked:
        return None
    ex = store.exchange(first_id)
    if ex is None:
        return None
    text = (store.bodies.decoded(ex.request, ex.id) or b"").decode("utf-8", errors="replace")
    return next((tid for tid, p in ranked if p.strip() and _json_text(p) in text), None)


def candidate(store: Store, ref: SessionRef) -> Candidate:
    """The session's candidate, its bodies read now (and let go with it)."""
    ex = store.exchange(ref.final_id) if ref.final_id is not None else None
    if ex is None:
        return Candidate(ref, None, None, Requested())
    return Candidate(ref, ex, response_json(store, ex), requested(request_doc(store, ex)))


def candidates(store: Store, prompts: Mapping[str, str] | None = None) -> Iterator[Candidate]:
    """Every session's candidate, one at a time."""
    for ref in sessions(store, prompts):
        yield candidate(store, ref)


def request_doc(store: Store, ex: Exchange) -> dict[str, Any]:
    """The request body as recorded (after the proxy's overrides), {} when not a JSON object."""
    try:
        doc = json.loads(store.bodies.decoded(ex.request, ex.id, "request") or b"{}")
    except (ValueError, AttributeError, TypeError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


def requested(doc: Mapping[str, Any]) -> Requested:
    """The model and sampling a request carried; a value of the wrong type counts as absent."""
    model = doc.get("model")
    return Requested(model if isinstance(model, str) and model else None, _num(doc.get("temperature"), float),
                     _num(doc.get("top_p"), float), _num(doc.get("seed"), int))


def _num(value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return kind(value)


def _json_text(prompt: str) -> str:
    """How a prompt appears inside a JSON request body (escaped, without the quotes)."""
    return json.dumps(prompt.strip())[1:-1]
