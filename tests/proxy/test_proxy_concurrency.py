"""Strict replay under concurrent clients, as real harnesses send them: requests that overlapped
when recorded may come back in any order; only a request that followed another's answer waits for
it. Real nfproxy processes, the official openai SDK, an aiohttp upstream."""

from __future__ import annotations

import asyncio
import random

import openai

from tests.conftest import ProxyProcess, start_nfproxy

PROMPTS = [f"Write function number {i}." for i in range(6)]


def client(proxy: ProxyProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-concurrency", max_retries=0, timeout=30)


async def gather_chats(proxy: ProxyProcess, prompts: list[str], seed: int) -> dict[str, str]:
    c = client(proxy)
    order = list(prompts)
    random.Random(seed).shuffle(order)

    async def one(p: str) -> tuple[str, str]:
        r = await c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": p}])
        return p, r.choices[0].message.content or ""

    try:
        return dict(await asyncio.gather(*(one(p) for p in order)))
    finally:
        await c.close()


def test_concurrent_requests_recorded_together_replay_together_in_any_order(store, upstream, proxies):
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(rec)
    recorded = asyncio.run(gather_chats(rec, PROMPTS, seed=0))
    assert rec.stop() == 0
    for seed in (1, 2, 3):
        rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store))
        proxies.append(rep)
        assert asyncio.run(gather_chats(rep, PROMPTS, seed)) == recorded
        assert rep.stop() == 0, rep.output
        assert "6 hits, 0 misses, 0 order violations" in rep.output


async def conversations(proxy: ProxyProcess, n: int, turns: int, seed: int) -> list[list[str]]:
    """n multi-turn conversations at once in one session (no per-sample labels, as an unchanged
    harness sends them), each turn carrying the previous answers, with random pauses between turns."""
    c = client(proxy)
    rng = random.Random(seed)
    pauses = [[rng.uniform(0, 0.03) for _ in range(turns)] for _ in range(n)]

    async def talk(i: int) -> list[str]:
        messages: list[dict[str, str]] = [{"role": "user", "content": f"Task {i}: start."}]
        answers = []
        for t in range(turns):
            await asyncio.sleep(pauses[i][t])
            r = await c.chat.completions.create(model="gpt-4o-mini", messages=messages)  # type: ignore[arg-type]
            text = r.choices[0].message.content or ""
            answers.append(text)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"Task {i}: go on ({t})."}]
        return answers

    try:
        return list(await asyncio.gather(*(talk(i) for i in range(n))))
    finally:
        await c.close()


def test_concurrent_multi_turn_conversations_replay_strictly_with_other_timing(store, upstream, proxies):
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url, "--session", "eval")
    proxies.append(rec)
    recorded = asyncio.run(conversations(rec, 5, 3, seed=0))
    assert rec.stop() == 0
    for seed in (11, 12):
        rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store), "--session", "eval")
        proxies.append(rep)
        assert asyncio.run(conversations(rep, 5, 3, seed)) == recorded
        assert rep.stop() == 0, rep.output
        assert "15 hits, 0 misses, 0 order violations" in rep.output
