"""Synthetic LLM agent traffic for the store benchmarks, written through the real recorder.

Each session is one agent run on one task: a system prompt shared by every run of an agent (a
few agents), the task's prompt (a pool of tasks, each run several times: replicates), then a few
turns in which the request carries the whole conversation so far, as OpenAI chat requests do.
Answers are chat.completion documents with the fields and headers an OpenAI response has, their
text drawn from a Zipf-weighted vocabulary (so it compresses like prose, not like repeats or
noise). About 5 kB raw per exchange (request body, response body and record), seeded.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.request.traffic import RequestData, ResponseData
from noisefloor.proxy.store.log import Store

_WORDS = ("the of and to a in is that for it as with was on be by this are or an at from which not have but "
          "function return value list string number error test case input output file line code python class "
          "method call result data type should must would could first second then next because however "
          "example given each every only also more most less some any all none true false check compute sum "
          "index loop element array dictionary key map filter sort order reverse empty length size count "
          "answer question step solution approach problem edge condition handle raise exception import module "
          "variable parameter argument default optional required integer float boolean character word sentence").split()
_CUM = np.cumsum(1 / np.arange(1, len(_WORDS) + 1))
SYSTEM = ("You are a careful coding assistant. Answer with a short explanation and one Python code block. "
          "Follow the user's function signature exactly, handle edge cases, and never print debugging output. "
          "When a tool is available, call it with valid JSON arguments; otherwise answer directly. ") * 4


class _Stream:
    """Zipf-weighted words drawn in bulk (a million at a time) and handed out in order: the same
    i.i.d. words as drawing each text afresh, without numpy's per-call cost for every text (that
    cost a fifth of recording them). Never reused: texts that repeated one another would compress,
    and collide in the miss index, as no real traffic does."""

    def __init__(self, seed: int, block: int = 1 << 20) -> None:
        self.gen = np.random.default_rng(seed)
        self.block = block
        self.words: list[str] = []
        self.at = 0

    def prose(self, words: int) -> str:
        if self.at + words > len(self.words):
            picks = np.searchsorted(_CUM, self.gen.random(self.block) * _CUM[-1], side="right").tolist()
            self.words = self.words[self.at:] + [_WORDS[i] for i in picks]
            self.at = 0
        text = " ".join(self.words[self.at:self.at + words])
        self.at += words
        return text.capitalize() + "."


def _prose(gen: np.random.Generator, words: int) -> str:
    """Zipf-weighted words, drawn in bulk (a task's prompt: the same whatever the seed)."""
    picks = np.searchsorted(_CUM, gen.random(words) * _CUM[-1], side="right").tolist()
    return " ".join([_WORDS[i] for i in picks]).capitalize() + "."


@dataclass(frozen=True)
class Shape:
    agents: int = 4
    tasks: int = 2000
    turns: tuple[int, int] = (2, 5)
    answer_words: tuple[int, int] = (120, 220)


_REQUEST_HEAD = '{"model": "gpt-4o-mini", "temperature": 0.7, "max_tokens": 1024, "messages": ['
# an OpenAI chat.completion, as json.dumps writes that document (the same bytes, spliced)
_ANSWER = ('{{"id": "chatcmpl-{id:024x}", "object": "chat.completion", "created": {created}, '
           '"model": "gpt-4o-mini-2024-07-18", "choices": [{{"index": 0, "message": {{"role": "assistant", '
           '"content": {content}, "refusal": null, "annotations": []}}, "logprobs": null, "finish_reason": "stop"}}], '
           '"usage": {{"prompt_tokens": {prompt}, "completion_tokens": {completion}, "total_tokens": 0, '
           '"prompt_tokens_details": {{"cached_tokens": 0, "audio_tokens": 0}}, "completion_tokens_details": '
           '{{"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, '
           '"rejected_prediction_tokens": 0}}}}, "service_tier": "default", "system_fingerprint": "fp_{fp}"}}')


def _message(role: str, content: str) -> str:
    return json.dumps({"role": role, "content": content})


def sessions(n_exchanges: int, seed: int = 0, shape: Shape = Shape(),
             prefix: str = "run") -> Iterator[tuple[str, list[tuple[bytes, bytes]]]]:
    """(session name, [(request body, response body), ...]) until n_exchanges are produced; the task
    prompts are the same whatever the seed (shards of one study run the same tasks)."""
    rng = random.Random(seed)
    made = 0
    stream = _Stream(seed)
    tasks = [_prose(np.random.default_rng(7919 + t), rng.randint(40, 90)) for t in range(shape.tasks)]
    s = 0
    while made < n_exchanges:
        agent = s % shape.agents
        task = rng.randrange(min(shape.tasks, max(20, n_exchanges // 35)))  # about 10 replicates of each
        messages = [_message("system", f"[agent {agent}] " + SYSTEM), _message("user", tasks[task])]
        turns = []
        for turn in range(min(rng.randint(*shape.turns), n_exchanges - made)):
            request = _REQUEST_HEAD + ", ".join(messages) + "]}"
            text = stream.prose(rng.randint(*shape.answer_words))
            answer = _ANSWER.format(id=rng.getrandbits(96), created=1_790_000_000 + made, content=json.dumps(text),
                                    prompt=300 + 150 * turn, completion=rng.randint(80, 300),
                                    fp=rng.choice(("b8bc95a0ac", "0aa8d3e20b")))
            turns.append((request.encode(), answer.encode()))
            messages += [_message("assistant", text),
                         _message("user", f"The tests failed on case {turn}: " + stream.prose(20))]
        made += len(turns)
        yield f"{prefix}-{s:07d}-task{task:04d}", turns
        s += 1


def response_headers(rng: random.Random, size: int) -> tuple[tuple[str, str], ...]:
    return (("date", time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(1_790_000_000 + rng.randrange(10**6)))),
            ("content-type", "application/json"), ("content-length", str(size)),
            ("access-control-expose-headers", "X-Request-ID"), ("openai-organization", "user-abc123"),
            ("openai-processing-ms", str(rng.randint(300, 4000))), ("openai-version", "2020-10-01"),
            ("x-ratelimit-limit-requests", "10000"), ("x-ratelimit-remaining-requests", str(rng.randint(0, 9999))),
            ("x-ratelimit-limit-tokens", "2000000"), ("x-ratelimit-remaining-tokens", str(rng.randint(0, 2 * 10**6))),
            ("x-request-id", f"req_{rng.getrandbits(128):032x}"), ("cf-ray", f"{rng.getrandbits(64):016x}-AMS"))


REQUEST_HEADERS = (("host", "api.openai.com"), ("content-type", "application/json"), ("accept", "application/json"),
                   ("user-agent", "OpenAI/Python 1.54.0"), ("x-stainless-lang", "python"),
                   ("x-stainless-package-version", "1.54.0"), ("authorization", "Bearer sk-bench-not-a-secret"))


def record(store: Store, n_exchanges: int, seed: int = 0, prefix: str = "run") -> dict[str, int]:
    """Record n_exchanges through Recorder.begin/finish (the path a proxy's requests take); the raw
    bytes it was given: bodies and the records' JSON."""
    rec = Recorder(store, Rules())
    rng = random.Random(seed + 1)
    raw = {"bodies": 0, "exchanges": 0}
    rows: list[dict[str, Any]] = []
    with store.batch():  # the recorder's bulk form (nfproxy import's): 100 exchanges per transaction
        replicates = _record_sessions(rec, rng, n_exchanges, seed, raw, rows, prefix)
    # graded, as nfverify would (a task run once has no within-task variance: left out)
    store.outcomes.put([{**r, "outcome": int(r["outcome"])} for r in rows if replicates[r["task_id"]] > 0])
    return raw


def _record_sessions(rec: Recorder, rng: random.Random, n_exchanges: int, seed: int, raw: dict[str, int],
                     rows: list[dict[str, Any]], prefix: str) -> dict[str, int]:
    replicates: dict[str, int] = {}
    for name, turns in sessions(n_exchanges, seed, prefix=prefix):
        task = f"{prefix}-{name.rsplit('-', 1)[1]}"  # a task per shard: shards grade apart
        replicate = replicates[task] = replicates.get(task, -1) + 1
        labels = Labels(name, task, str(replicate), "live")
        rows.append({"task_id": task, "condition": "live", "replicate": replicate, "outcome": rng.random() < 0.6})
        for req_body, resp_body in turns:
            req = RequestData("POST", "https://api.openai.com/v1/chat/completions", "api.openai.com",
                              "/v1/chat/completions", REQUEST_HEADERS, req_body)
            pending = rec.begin(req, labels)
            resp = ResponseData(200, response_headers(rng, len(resp_body)), resp_body)
            rec.finish(pending, resp, latency_ms=float(rng.randint(300, 4000)))
            raw["bodies"] += len(req_body) + len(resp_body)
            raw["exchanges"] += 1
    return replicates
