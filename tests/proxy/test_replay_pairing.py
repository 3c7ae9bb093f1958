"""Which answer a replayed request gets (DESIGN.md): pairing by content, not time. Real nfproxy
processes, the official openai and anthropic SDKs, an aiohttp upstream."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import time
from pathlib import Path
from typing import NamedTuple

import anthropic
import openai
import pytest

from tests.conftest import DATA, ProxyProcess, start_nfproxy
from tests.fake_upstream import FakeUpstream

QUESTIONS = [f"Independent question number {i}: what is {i} + {i}?" for i in range(4)]
MODEL = "gpt-4o-mini"
CONVERSATIONS = {"A": "Conversation A: tell the story of a lighthouse keeper who finds a message in a bottle.",
                 "B": "Conversation B: tell the story of a mountain climber who meets a fox above the clouds."}


def client(proxy: ProxyProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-pairing-0001", max_retries=0, timeout=30)


class Reply(NamedTuple):
    text: str  # the answer, or the error's status and message
    took: float  # client wall seconds (loose: the machine may be loaded)
    wait_ms: float  # what the proxy says it held the request before choosing its answer

# "no request waits": the proxy's own figure, not the client's clock; far below the 20 s order wait
# that a request waiting for another would show, above a first miss's one-time load of its search
NO_WAIT_MS = 2000


async def ask(c: openai.AsyncOpenAI, messages: list[dict[str, str]], **kw: object) -> Reply:
    t = time.monotonic()
    try:
        raw = await c.chat.completions.with_raw_response.create(model=MODEL, messages=messages, **kw)  # type: ignore[arg-type]
        out, headers = raw.parse().choices[0].message.content or "", raw.headers
    except openai.APIStatusError as exc:
        out, headers = f"{exc.status_code} {exc.message}", exc.response.headers
    return Reply(out, time.monotonic() - t, float(headers["x-nf-wait-ms"]) if "x-nf-wait-ms" in headers else -1.0)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def replay(store: Path, proxies: list[ProxyProcess], *extra: str) -> ProxyProcess:
    # a long order wait: a request that waited for another would show in its time
    p = start_nfproxy("--mode", "replay", "--strict", "--store", str(store), "--session", "S", "--order-wait", "20",
                      *extra)
    proxies.append(p)
    return p


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """One session: four independent questions, a question asked twice, and a three-turn
    conversation next to a two-turn one."""
    store = tmp_path_factory.mktemp("pairing") / "log.lmdb"
    up = FakeUpstream().start()
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", up.url, "--session", "S")
    try:
        async def go() -> dict[str, object]:
            c = client(rec)
            try:
                independent = [(await ask(c, user(q)))[0] for q in QUESTIONS]
                twice = [(await ask(c, user("Pick a number."), temperature=0.7))[0] for _ in range(2)]
                convs = {}
                for name, turns in (("A", 3), ("B", 2)):
                    messages = user(CONVERSATIONS[name])
                    answers = []
                    for t in range(turns):
                        text = (await ask(c, messages))[0]
                        answers.append(text)
                        messages = messages + [{"role": "assistant", "content": text},
                                               {"role": "user", "content": f"{name}: go on ({t})."}]
                    convs[name] = answers
                return {"independent": independent, "twice": twice, "convs": convs}
            finally:
                await c.close()

        answers = asyncio.run(go())
        assert rec.stop() == 0, rec.output
    finally:
        rec.stop()
        up.stop()
    return store, answers


def test_a_changed_request_costs_only_itself(recording, proxies):
    store, rec = recording
    before = hashlib.sha256((store / "data.mdb").read_bytes()).hexdigest()
    rep = replay(store, proxies)

    async def go() -> list[Reply]:
        c = client(rep)
        try:
            return [await ask(c, user(q.replace("what is", "what's") if i == 0 else q))
                    for i, q in enumerate(QUESTIONS)]
        finally:
            await c.close()

    got = asyncio.run(go())
    assert got[0][0].startswith("404 ") and "nfproxy replay miss" in got[0][0]  # the SDK prints nfproxy's message
    assert [r.text for r in got[1:]] == rec["independent"][1:]
    assert all(0 <= r.wait_ms < NO_WAIT_MS for r in got), got  # nobody waited for the miss (order wait: 20 s)
    assert max(r.took for r in got) < 10, got
    assert rep.stop() == 3
    line = next(ln for ln in rep.output.splitlines() if ln.startswith("nfproxy: replay miss "))
    assert "session S" in line and "differs first at /body/messages/0/content" in line, line
    assert "3 hits, 1 misses, 0 order violations" in rep.output
    assert "0 order notes" in rep.output  # the miss took its recorded request's place: nothing was reordered
    assert "no recorded request carries its answer" in rep.output
    # replay wrote nothing into the recording
    assert hashlib.sha256((store / "data.mdb").read_bytes()).hexdigest() == before


def test_one_request_alone_and_reverse_order_are_hits(recording, proxies):
    store, rec = recording
    alone = replay(store, proxies)

    async def one() -> Reply:
        c = client(alone)
        try:
            return await ask(c, user(QUESTIONS[2]))
        finally:
            await c.close()

    got = asyncio.run(one())
    assert got.text == rec["independent"][2] and 0 <= got.wait_ms < NO_WAIT_MS and got.took < 10, got
    assert alone.stop() == 0 and "1 hits, 0 misses" in alone.output

    rev = replay(store, proxies)

    async def reverse() -> list[Reply]:
        c = client(rev)
        try:
            return [await ask(c, user(q)) for q in reversed(QUESTIONS)]
        finally:
            await c.close()

    got_rev = asyncio.run(reverse())
    assert [r.text for r in got_rev] == rec["independent"][::-1]
    assert all(0 <= r.wait_ms < NO_WAIT_MS for r in got_rev), got_rev
    assert rev.stop() == 0, rev.output
    assert "4 hits, 0 misses, 0 order violations" in rev.output and "3 order notes" in rev.output


def test_a_question_asked_twice_gets_its_answers_in_recorded_order(recording, proxies):
    store, rec = recording
    rep = replay(store, proxies)

    async def go() -> list[str]:
        c = client(rep)
        try:
            return [(await ask(c, user("Pick a number."), temperature=0.7))[0] for _ in range(2)]
        finally:
            await c.close()

    got = asyncio.run(go())
    assert got == rec["twice"] and got[0] != got[1]
    assert rep.stop() == 0


def test_a_changed_first_turn_reports_the_turns_that_carry_its_answer(recording, proxies):
    store, rec = recording
    rep = replay(store, proxies)

    async def go() -> tuple[list[str], list[str]]:
        c = client(rep)
        try:
            first = await ask(c, user(CONVERSATIONS["A"] + " Please."))  # changed: a miss, the agent stops there
            messages = user(CONVERSATIONS["B"])
            b = []
            for t in range(2):
                text = (await ask(c, messages))[0]
                b.append(text)
                messages = messages + [{"role": "assistant", "content": text}, {"role": "user", "content": f"B: go on ({t})."}]
            return [first[0]], b
        finally:
            await c.close()

    a, b = asyncio.run(go())
    assert a[0].startswith("404 ")
    assert b == rec["convs"]["B"]  # the session's other conversation hits
    assert rep.stop() == 3
    assert "2 later recorded requests carry its answer and are affected" in rep.output, rep.output
    assert "2 hits, 1 misses" in rep.output


def test_a_request_carrying_an_answer_never_served_is_a_call_order_violation_at_once(recording, proxies):
    store, rec = recording
    rep = replay(store, proxies)
    turn2 = user(CONVERSATIONS["B"]) + [{"role": "assistant", "content": rec["convs"]["B"][0]},
                                              {"role": "user", "content": "B: go on (0)."}]

    async def go() -> Reply:
        c = client(rep)
        try:
            return await ask(c, turn2)
        finally:
            await c.close()

    got = asyncio.run(go())
    assert got.text.startswith("412 ") and "has not been served" in got.text and 0 <= got.wait_ms < NO_WAIT_MS, got
    assert rep.stop() == 3 and "1 order violations" in rep.output


def test_sixteen_identical_concurrent_requests_get_every_answer_once(store, upstream, proxies):
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url, "--session", "S")
    proxies.append(rec)

    async def burst(proxy: ProxyProcess) -> list[str]:
        c = client(proxy)
        try:
            got = await asyncio.gather(*(ask(c, user("Sample a haiku."), temperature=0.7) for _ in range(16)))
            return [r.text for r in got]
        finally:
            await c.close()

    recorded = asyncio.run(burst(rec))
    assert rec.stop() == 0 and len(set(recorded)) == 16
    rep = replay(store, proxies)
    replayed = asyncio.run(burst(rep))
    assert sorted(replayed) == sorted(recorded)  # every recorded answer served exactly once
    assert rep.stop() == 0 and "16 hits, 0 misses, 0 order violations" in rep.output


def test_a_store_recorded_by_main_replays_by_content_after_migrate_and_stays_unchanged(tmp_path, proxies):
    """tests/data/store-main-1704f55 was written by main at 1704f55 (see make_main_store.py): no
    dependencies, no lookup rows. `nfproxy migrate` writes them; replay then writes nothing."""
    from noisefloor.proxy.store.migrate import migrate

    store = tmp_path / "old.lmdb"
    shutil.copytree(DATA / "store-main-1704f55", store)
    migrate(store)
    before = (store / "data.mdb").read_bytes()
    rep = replay(store, proxies)
    second = user("Start a story.") + [{"role": "assistant", "content": "recorded answer 5"},
                                       {"role": "user", "content": "Go on."}]

    async def go() -> list[str]:
        c = client(rep)
        try:
            out = [(await ask(c, second))[0]]  # carries answer 5, not served yet: a violation
            out += [(await ask(c, user(f"Independent question {i}?")))[0] for i in (3, 1)]
            out += [(await ask(c, user("Start a story.")))[0], (await ask(c, second))[0]]
            out += [(await ask(c, user("Pick a number.")))[0] for _ in range(2)]
            return out
        finally:
            await c.close()

    got = asyncio.run(go())
    assert got[0].startswith("412 ")
    assert got[1:] == ["recorded answer 4", "recorded answer 2", "recorded answer 5", "recorded answer 6",
                       "recorded answer 7", "recorded answer 8"]
    assert rep.stop() == 3 and "6 hits, 0 misses, 1 order violations" in rep.output
    assert (store / "data.mdb").read_bytes() == before


def test_a_miss_answers_in_the_anthropic_error_shape(store, upstream, proxies):
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(rec)
    a = anthropic.Anthropic(base_url=rec.url, api_key="sk-ant-test-0001", max_retries=0, timeout=30)
    a.messages.create(model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "hello"}])
    assert rec.stop() == 0
    rep = replay(store, proxies)
    b = anthropic.Anthropic(base_url=rep.url, api_key="sk-ant-test-0001", max_retries=0, timeout=30)
    with pytest.raises(anthropic.NotFoundError) as info:
        b.messages.create(model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "hello!"}])
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == "nfproxy_replay_miss"
    assert "nfproxy replay miss" in str(info.value)
    assert rep.stop() == 3


def test_a_misses_nearest_is_chosen_by_route_and_model_then_content_then_recorded_order(store, upstream, proxies):
    """Short prompts leave several neighbours equally near to the sketch (it hashes a short string
    whole): the choice must not depend on the index's internals. Recorded: the asked text under
    another model (excluded: another model), one neighbour with an extra field (more differing
    paths: never chosen over the others), then three one-word neighbours that share as much with
    the asked request; of those the closest text wins ("task 0." for "task 0, changed.")."""
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url, "--session", "S")
    proxies.append(rec)
    asked = "Say hi to task 0, changed."
    recorded = [("gpt-other", asked, {}), (MODEL, "Say hi to task 7.", {"temperature": 0.5}),
                (MODEL, "Say hi to task 1.", {}), (MODEL, "Say hi to task 0.", {}), (MODEL, "Say hi to task 2.", {})]

    async def record() -> None:
        c = client(rec)
        try:
            for model, text, extra in recorded:
                await c.chat.completions.create(model=model, messages=user(text), **extra)  # type: ignore[arg-type]
        finally:
            await c.close()

    asyncio.run(record())
    assert rec.stop() == 0, rec.output
    for _ in range(2):  # the same choice every time
        rep = replay(store, proxies)
        got = asyncio.run(_ask_once(rep, user(asked)))
        assert got.text.startswith("404 ") and 0 <= got.wait_ms < NO_WAIT_MS, got
        assert rep.stop() == 3
        line = next(ln for ln in rep.output.splitlines() if ln.startswith("nfproxy: replay miss "))
        assert "nearest recorded exchange 4 " in line and "differs first at /body/messages/0/content" in line, line


async def _ask_once(proxy: ProxyProcess, messages: list[dict[str, str]]) -> Reply:
    c = client(proxy)
    try:
        return await ask(c, messages)
    finally:
        await c.close()


def test_the_text_tie_break_ranks_the_closest_text_first_and_leaves_true_ties_to_recorded_order():
    from noisefloor.proxy.replay.diagnosis import _closeness

    def body(text: str) -> dict:
        return {"body": {"messages": [{"role": "user", "content": text}], "model": MODEL}}

    asked = body("Say hi to task 0, changed.")
    near, one, two = (_closeness(body(t), asked) for t in ("Say hi to task 0.", "Say hi to task 1.", "Say hi to task 2."))
    assert near > one == two  # 1 and 2 are a true tie: the earlier recorded wins (the id, last in the key)
    assert _closeness(body("write a haiku"), body("write a limerick")) > _closeness(body("the same every time"),
                                                                                     body("write a limerick"))
    assert _closeness(asked, asked) == 0.0  # nothing differs: nothing to compare


def test_a_session_replayed_alone_gets_the_candidates_every_exchange_of_its_key_would_give(tmp_path):
    """`replay_from` names one recorded session: its candidates for a key come from that session's
    own requests (`_Session.by_key`), not from every recorded exchange with the key. On a store
    whose keys repeat across sessions, both give the same entries in the same order."""
    from collections import Counter

    from noisefloor.proxy.store import replay_index
    from noisefloor.proxy.store.log import Store
    from tests.conftest import recorded_shards

    with Store.open(recorded_shards(tmp_path, 160)[0], write=False) as s:
        index = replay_index.open_index(s)
        entries = s.index.entries_by_id(list(range(1, len(s) + 1)))
        assert max(Counter(e.key for e in entries).values()) > 1  # keys shared across sessions
        for e in entries:
            assert index.session(e.session).by_key[e.key] == [c for c in index.candidates(e.key)
                                                               if c.session == e.session]
        assert index.session("no such session").by_key == {}
