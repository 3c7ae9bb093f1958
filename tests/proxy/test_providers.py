"""The providers package: each API's dependency rule, error shape and keying; the rules id; the
nearest-request index. Real LMDB stores written by the real recorder; a provider added from
outside the package, through its entry point, recorded and replayed through real nfproxy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from aiohttp import web

from noisefloor.proxy import providers
from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.replay.replayer import Replayer
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.request.traffic import RequestData, ResponseData
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store.log import Store
from tests import loopback
from tests.conftest import ROOT, start_nfproxy
from tests.fake_upstream import FakeUpstream

EXAMPLES = ROOT / "examples" / "providers"

JSON = (("content-type", "application/json"),)


def request(path: str, doc: dict, host: str = "up") -> RequestData:
    return RequestData("POST", f"http://{host}{path}", host, path, JSON, json.dumps(doc).encode())


def response(doc: dict | bytes, ctype: str = "application/json") -> ResponseData:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return ResponseData(200, (("content-type", ctype),), body)


def record(path: Path, calls: list[tuple[RequestData, ResponseData]]) -> list[tuple[int, ...]]:
    """Record the calls one after another in one session; each recorded request's dependencies."""
    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        for req, resp in calls:
            rec.finish(rec.begin(req, Labels("S")), resp)
        return [e.deps for e in sorted(s.index.entries(), key=lambda e: e.seq)]


def test_openai_chat_depends_on_assistant_text_and_tool_calls(tmp_path):
    tool = {"id": "call_7", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    q = [{"role": "user", "content": "hi"}]
    calls = [
        (request("/v1/chat/completions", {"model": "m", "messages": q}),
         response({"choices": [{"message": {"role": "assistant", "content": "  Hello there  "}}]})),
        (request("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "other"}]}),
         response({"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [tool]}}]})),
        # carries answer 0's text (stripped, as SDKs keep it) and answer 1's tool call id
        (request("/v1/chat/completions", {"model": "m", "messages": q + [
            {"role": "assistant", "content": "Hello there"},
            {"role": "assistant", "content": None, "tool_calls": [tool]},
            {"role": "tool", "tool_call_id": "call_7", "content": "42"}]}),
         response({"choices": [{"message": {"role": "assistant", "content": "done"}}]})),
        # the same words as a user message carry nothing
        (request("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "Hello there"}]}),
         response({"choices": [{"message": {"role": "assistant", "content": "x"}}]})),
    ]
    assert record(tmp_path / "s", calls) == [(), (), (0, 1), ()]


def test_openai_chat_stream_answer_is_assembled_from_deltas(tmp_path):
    events = b"".join(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": p}}]}).encode() + b"\n\n"
                      for p in ("Hel", "lo ", "world")) + b"data: [DONE]\n\n"
    calls = [(request("/v1/chat/completions", {"model": "m", "stream": True, "messages": [{"role": "user", "content": "a"}]}),
              response(events, "text/event-stream")),
             (request("/v1/chat/completions", {"model": "m", "messages": [
                 {"role": "user", "content": "a"}, {"role": "assistant", "content": [{"type": "text", "text": "Hello world"}]},
                 {"role": "user", "content": "b"}]}), response({"choices": []}))]
    assert record(tmp_path / "s", calls) == [(), (0,)]


def test_responses_api_depends_on_previous_response_id_and_output_items(tmp_path):
    calls = [
        (request("/v1/responses", {"model": "m", "input": "hi"}),
         response({"id": "resp_1", "output": [{"id": "msg_1", "type": "message", "role": "assistant",
                                               "content": [{"type": "output_text", "text": "first"}]}]})),
        (request("/v1/responses", {"model": "m", "input": "x", "previous_response_id": "resp_1"}),
         response({"id": "resp_2", "output": [{"id": "fc_2", "type": "function_call", "call_id": "call_2",
                                               "name": "f", "arguments": "{}"}]})),
        (request("/v1/responses", {"model": "m", "input": [{"type": "function_call_output", "call_id": "call_2",
                                                            "output": "1"}]}), response({"id": "resp_3", "output": []})),
    ]
    assert record(tmp_path / "s", calls) == [(), (0,), (1,)]


def test_anthropic_depends_on_assistant_blocks_and_tool_use(tmp_path):
    calls = [
        (request("/v1/messages", {"model": "c", "messages": [{"role": "user", "content": "hi"}]}),
         response({"content": [{"type": "text", "text": "Let me look."},
                               {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]})),
        (request("/v1/messages", {"model": "c", "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}]}),
         response({"content": [{"type": "text", "text": "Found it."}]})),
        (request("/v1/messages", {"model": "c", "messages": [{"role": "assistant", "content": "Found it."}]}),
         response({"content": []})),
    ]
    assert record(tmp_path / "s", calls) == [(), (0,), (1,)]


def test_gemini_depends_on_model_turns(tmp_path):
    path = "/v1beta/models/gemini-2.0-flash:generateContent"
    calls = [
        (request(path, {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
         response({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hi, "}, {"text": "human."}]}}]})),
        (request(path, {"contents": [{"role": "user", "parts": [{"text": "hi"}]},
                                     {"role": "model", "parts": [{"text": "Hi, human."}]},
                                     {"role": "user", "parts": [{"text": "more"}]}]}),
         response({"candidates": []})),
    ]
    assert record(tmp_path / "s", calls) == [(), (0,)]


def test_generic_depends_on_bodies_that_contain_an_answer(tmp_path):
    answer = "The quick brown fox answered at length."
    calls = [(request("/api/generate", {"prompt": "a"}), response({"choices": [{"text": answer}]})),
             (request("/api/generate", {"prompt": f"context: {answer} then"}), response({"choices": []})),
             (request("/api/generate", {"prompt": "unrelated"}), response({"choices": []}))]
    assert providers.detect("up", "/api/generate").name == "generic"
    assert record(tmp_path / "s", calls) == [(), (0,), ()]


@pytest.mark.parametrize(("host", "path", "name", "shape"), [
    ("api.openai.com", "/v1/chat/completions", "openai", lambda b: b["error"]["message"]),
    ("api.anthropic.com", "/v1/messages", "anthropic", lambda b: b["type"] == "error" and b["error"]["message"]),
    ("generativelanguage.googleapis.com", "/v1beta/models/g:generateContent", "gemini",
     lambda b: b["error"]["status"] == "NOT_FOUND" and b["error"]["message"]),
    ("api.mistral.ai", "/v1/chat/completions", "mistral", lambda b: b["object"] == "error" and b["message"]),
    ("bedrock-runtime.us-east-1.amazonaws.com", "/model/m/converse", "bedrock", lambda b: b["message"]),
])
def test_each_provider_is_detected_and_answers_errors_in_its_shape(host, path, name, shape):
    p = providers.detect(host, path)
    assert p.name == name
    assert shape(p.error_body(404, "nfproxy_replay_miss", "nfproxy replay miss: x", {"key": "k"}))


def test_rules_id_depends_only_on_what_changes_keys(monkeypatch):
    rules = Rules()
    assert rules.legacy_ids == ("e24973acaa958264",)  # main's id for these rules (1704f55)
    before = rules.id
    extra = providers.Provider(name="newcomer", matches=lambda host, route: host == "new.example")
    monkeypatch.setitem(providers.PROVIDERS, "newcomer", extra)
    monkeypatch.setattr(providers, "_ORDER", (extra, *providers._ORDER))
    assert Rules().id == before  # a provider added: the same id, the same keys for everything else
    monkeypatch.setattr(providers, "KEYING_VERSION", 2)
    assert Rules().id != before and Rules().legacy_ids == ()  # keying changed: old stores are refused


def test_the_nearest_request_index_finds_the_changed_one_among_many(tmp_path):
    path = tmp_path / "s"
    words = ["lighthouse", "mountain", "river", "forest", "desert", "harbor", "castle", "garden"]
    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        for i in range(400):
            text = f"Write a long story number {i} about a {words[i % 8]} and a {words[(i // 8) % 8]} at dawn."
            doc = {"model": f"m{i % 3}", "messages": [{"role": "system", "content": "You are a writer."},
                                                       {"role": "user", "content": text}]}
            rec.finish(rec.begin(request("/v1/chat/completions", doc), Labels(f"S{i % 20}")),
                       response({"choices": [{"message": {"role": "assistant", "content": f"story {i}"}}]}))
    with Store.open(path, write=False) as s:
        rep = Replayer(s, Rules(), log=lambda build: None)
        assert isinstance(rep.index, replay_index.LmdbIndex)
        i = 137
        text = f"Write a long story number {i} about a {words[i % 8]} and a {words[(i // 8) % 8]} at dusk."
        asked = {"model": f"m{i % 3}", "messages": [{"role": "system", "content": "You are a writer."},
                                                     {"role": "user", "content": text}]}
        got = rep.answer(request("/v1/chat/completions", asked), Labels("R"))
        assert got.result == "miss"
        near = json.loads(got.response.raw_body)["error"]["nearest"]
        assert near["exchange_id"] == i + 1 and near["differs_at"] == "/body/messages/1/content"


def test_a_store_recorded_before_index_rows_migrates_with_its_dependencies_recomputed(tmp_path):
    """tests/data/store-main-1704f55 (noisefloor-log/1: entries without dependencies, no lookups):
    migrated, the request that carries an earlier answer's text names it, and replay holds it
    to that order as it does for a store recorded today."""
    from noisefloor.proxy.store.migrate import migrate
    from tests.conftest import DATA

    path = tmp_path / "s"
    shutil.copytree(DATA / "store-main-1704f55", path, ignore=shutil.ignore_patterns("lock.mdb"))
    migrate(path)
    with Store.open(path, write=False) as s:
        entries = {e.id: e for e in s.index.entries()}
        carried = {i: e.deps for i, e in entries.items() if e.deps}
        assert list(carried) == [6] and len(carried[6]) == 1
        source = next(i for i, e in entries.items() if e.seq == carried[6][0])
        answer = json.loads(s.bodies.of_part(s.exchange(source).response, source))["choices"][0]["message"]["content"]
        assert answer in s.bodies.of_part(s.exchange(6).request, 6).decode()  # what the dependency says, read directly
        asked = RequestData.from_record(s.exchange(6).request, s.bodies.of_part(s.exchange(6).request, 6))
        rep = Replayer(s, Rules.described(s.meta("rules")), log=lambda build: None)
        assert rep.answer(asked, Labels("R")).result == "order_violation"  # carries an answer not yet served


class AcmeUpstream(FakeUpstream):
    """The made-up Acme API of examples/providers/acme.py, on a real aiohttp server."""

    def _routes(self, app: web.Application) -> None:
        async def generate(request: web.Request) -> web.Response:
            n, doc = await self._record(request)
            return web.json_response({"engine": "acme-engine-7", "text": f"acme answer {n} to {doc.get('prompt')}",
                                      "halt": "budget", "meter": {"in": 11, "out": 5 + n}})

        app.router.add_post("/acme/v1/generate", generate)


def installed_plugin(where: Path) -> dict[str, str]:
    """The example module installed as a distribution would be: its entry point in a dist-info."""
    shutil.copy(EXAMPLES / "acme.py", where / "acme.py")
    info = where / "acme_provider-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-provider\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[noisefloor.providers]\nacme = acme:PROVIDER\n")
    return {"PYTHONPATH": str(where)}


def test_a_provider_added_from_outside_records_and_replays_strictly_through_nfproxy(tmp_path, proxies):
    """examples/providers/acme.py, registered by its entry point and nothing else edited: its
    keying (ignored field, version header), credential header, served model and usage, error shape
    and base-URL variable all come from that one module; the rules id does not move."""
    env = installed_plugin(tmp_path)
    store = tmp_path / "log.lmdb"
    up = AcmeUpstream().start()
    try:
        rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", up.url, env=env)
        proxies.append(rec)
        head = {"x-acme-key": "acme-secret-record-0123456789", "acme-version": "2026-01"}
        with loopback.client(base_url=rec.url, timeout=20) as c:
            live = c.post("/acme/v1/generate", json={"prompt": "hi", "request_id": "r1"}, headers=head)
        assert live.status_code == 200 and rec.stop() == 0, rec.output
    finally:
        up.stop()
    with Store.open(store, write=False) as s:
        assert s.meta("rules_id") == Rules().id  # the same id as without the module
        (ex,) = list(s.exchanges())
        assert ex.model == "acme-engine-7" and ex.usage == {"input": 11, "output": 6} and ex.finish_reason == "budget"
        assert not any(b"acme-secret-record" in body for body in s.bodies.all())
        assert "acme-secret-record" not in json.dumps(ex.request)

    rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store), env=env)
    proxies.append(rep)
    rotated = {"x-acme-key": "acme-secret-rotated-987654321", "acme-version": "2026-01"}
    with loopback.client(base_url=rep.url, timeout=20) as c:
        hit = c.post("/acme/v1/generate", json={"prompt": "hi", "request_id": "r2"}, headers=rotated)
        newer = c.post("/acme/v1/generate", json={"prompt": "hi", "request_id": "r3"},
                       headers={**rotated, "acme-version": "2026-02"})
    assert hit.status_code == 200 and hit.content == live.content  # another request id, another key: a hit
    assert newer.status_code == 404 and "nfproxy replay miss" in newer.json()["acme_error"]["detail"]
    assert rep.stop() == 3 and "1 hits, 1 misses" in rep.output, rep.output


def test_a_registered_provider_is_asked_before_the_generic_one_and_rewrites_its_own_prompt(monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("acme_example", EXAMPLES / "acme.py")
    acme = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(acme)
    before = Rules().id
    monkeypatch.setattr(providers, "_ORDER", list(providers._ORDER))
    monkeypatch.setattr(providers, "PROVIDERS", dict(providers.PROVIDERS))
    providers.register(acme.PROVIDER)
    try:
        assert providers.detect("acme.example", "/acme/v1/generate").name == "acme"
        assert providers.detect("acme.example", "/other").name == "generic"
        assert providers.sdk_env("http://p")["ACME_BASE_URL"] == "http://p"
        assert "x-acme-key" in providers.credential_headers()
        assert providers.rewrite_user(acme.PROVIDER, {"prompt": "hi"}, str.upper) == {"prompt": "HI"}
        assert Rules().id == before
        with pytest.raises(ValueError, match="already registered"):
            providers.register(acme.PROVIDER)
    finally:
        providers.credential_headers.cache_clear()
        providers.terminal_events.cache_clear()


ARGS = {"city": "Paris", "unit": "celsius"}
USER_CHAT = lambda text: {"model": "m", "messages": [{"role": "user", "content": text}]}  # noqa: E731
# (host, path, provider, an answer calling get_weather(ARGS), a request in the same API with one user text)
TOOL_CALLS = [
    ("api.openai.com", "/v1/chat/completions", "openai",
     {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
         {"id": "call_Xq81", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}]}}]},
     USER_CHAT),
    ("api.mistral.ai", "/v1/chat/completions", "mistral",
     {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
         {"id": "call_Xq81", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}]}}]},
     USER_CHAT),
    ("api.openai.com", "/v1/responses", "openai-responses",
     {"id": "resp_1", "output": [{"type": "function_call", "id": "fc_1", "call_id": "call_Xq81", "name": "get_weather",
                                  "arguments": json.dumps(ARGS)}]},
     lambda text: {"model": "m", "input": [{"role": "user", "content": text}]}),
    ("api.anthropic.com", "/v1/messages", "anthropic",
     {"content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": ARGS}]}, USER_CHAT),
    ("generativelanguage.googleapis.com", "/v1beta/models/g:generateContent", "gemini",
     {"candidates": [{"content": {"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": ARGS}}]}}]},
     lambda text: {"contents": [{"role": "user", "parts": [{"text": text}]}]}),
    ("bedrock-runtime.us-east-1.amazonaws.com", "/model/m/converse", "bedrock",
     {"output": {"message": {"role": "assistant", "content": [
         {"toolUse": {"toolUseId": "tu_1", "name": "get_weather", "input": ARGS}}]}}},
     lambda text: {"messages": [{"role": "user", "content": [{"text": text}]}]}),
    ("up", "/v2/complete", "generic",
     {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
         {"id": "call_Xq81", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}]}}]},
     USER_CHAT),
]


@pytest.mark.parametrize(("host", "path", "name", "answer", "asking"), TOOL_CALLS, ids=[c[2] for c in TOOL_CALLS])
def test_a_tool_call_or_answer_quoted_as_text_in_a_later_message_is_carried_in_every_provider(
        tmp_path, host, path, name, answer, asking):
    """A transcript agent (smolagents) writes earlier tool calls into message text, as Python
    prints them; a request quoting an earlier answer's text does the same for the answer."""
    assert providers.detect(host, path).name == name
    text_answer = {"choices": [{"message": {"role": "assistant", "content": "The forecast says light rain after noon."}}]}
    if name in ("anthropic", "bedrock"):
        text_answer = {"content": [{"type": "text", "text": "The forecast says light rain after noon."}]}
    if name == "bedrock":
        text_answer = {"output": {"message": {"role": "assistant", "content": [
            {"text": "The forecast says light rain after noon."}]}}}
    if name == "gemini":
        text_answer = {"candidates": [{"content": {"role": "model", "parts": [
            {"text": "The forecast says light rain after noon."}]}}]}
    if name == "openai-responses":
        text_answer = {"id": "resp_2", "output": [{"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "The forecast says light rain after noon."}]}]}
    calls = [
        (request(path, asking("weather in Paris?"), host), response(answer)),
        (request(path, asking("and the forecast?"), host), response(text_answer)),
        # Python's form of the call's arguments, inside a message's text: carries answer 0
        (request(path, asking(f"Calling tools: [{{'name': 'get_weather', 'arguments': {ARGS!r}}}]"), host),
         response(text_answer)),
        # the earlier answer's text quoted in a user message: carries answer 1
        (request(path, asking("You said: The forecast says light rain after noon. Why?"), host), response(answer)),
        (request(path, asking("something unrelated altogether"), host), response(answer)),
    ]
    deps = record(tmp_path / "s", calls)
    assert deps[2] == (0,) and 1 in deps[3] and deps[4] == ()


def test_quoted_forms_of_a_tool_call():
    from noisefloor.proxy.providers.base import quoted_forms

    forms = quoted_forms("call_1", '{"a": [1, 2]}')
    assert forms == ["call_1", '{"a": [1, 2]}', '{"a":[1,2]}', '{"a": [1, 2]}', "{'a': [1, 2]}"]
    assert quoted_forms(None, "not json") == ["not json"] and quoted_forms(None, {}) == []

def test_answer_texts_quoted_in_a_body_are_found_as_a_plain_search_finds_them():
    """The generic rule's search (a gram index over a session's last answers) finds exactly what a
    plain search of each text and its JSON-string form finds: texts at every offset of a body,
    at its ends, of the shortest length kept, with quotes, newlines and non-ASCII, after older
    answers were forgotten, and among texts that share most of their characters."""
    import random

    from noisefloor.proxy.request.dependencies import _TEXTS, MIN_TEXT, Tracker

    rng = random.Random(46)
    alphabet = "ab \"\n\\é漢"
    provider = providers.PROVIDERS["openai"]
    tracker, kept = Tracker(), []
    for seq in range(_TEXTS + 60):  # the oldest 60 are forgotten
        text = (f"answer number {seq} " if seq % 3 == 0 else "") + "".join(
            rng.choice(alphabet) for _ in range(rng.randrange(MIN_TEXT - 2, 40)))
        tracker.answered("S", seq, provider, json.dumps({"choices": [{"message": {"content": text}}]}).encode(),
                         "application/json")
        if len(text.strip()) >= MIN_TEXT:
            kept.append((text.strip(), seq))
    kept = kept[-_TEXTS:]
    checked = 0
    for trial in range(300):
        quoted = rng.sample(kept, rng.randrange(0, 4))
        parts = [("".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12))))]
        for text, _ in quoted:
            parts += [text if rng.random() < 0.5 else json.dumps(text, ensure_ascii=False)[1:-1],
                      "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))]
        body = "".join(parts)
        want = tuple(sorted({seq for text, seq in kept
                             if text in body or json.dumps(text, ensure_ascii=False)[1:-1] in body}))
        assert tracker.deps("S", provider, None, body) == want, (trial, body)
        checked += bool(want)
    assert checked > 200  # most bodies quote something


USAGE_SHAPES = {  # one answer as each API writes it, 3 tokens in and 4 out
    "openai": {"model": "gpt-x", "usage": {"prompt_tokens": 3, "completion_tokens": 4},
               "choices": [{"finish_reason": "stop"}]},
    "openai-responses": {"model": "gpt-x", "usage": {"input_tokens": 3, "output_tokens": 4}, "status": "completed"},
    "anthropic": {"model": "claude-x", "usage": {"input_tokens": 3, "output_tokens": 4}, "stop_reason": "end_turn"},
    "gemini": {"modelVersion": "gemini-x", "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4},
               "candidates": [{"finishReason": "STOP"}]},
    "mistral": {"model": "mistral-x", "usage": {"prompt_tokens": 3, "completion_tokens": 4},
                "choices": [{"finish_reason": "stop"}]},
    "bedrock": {"output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}}, "stopReason": "max_tokens",
                "usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}},
    "generic": {"model": "local-x", "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
}


def test_every_provider_module_reads_the_token_counts_of_its_answers():
    """What the log keeps of an answer's usage, from each provider module (a report's "tokens
    in/out" is their sum: a module that reads none makes it 0/0)."""
    from noisefloor.proxy.providers import PROVIDERS

    assert set(USAGE_SHAPES) == set(PROVIDERS), "a provider module without an answer shape here"
    for name, doc in USAGE_SHAPES.items():
        got = PROVIDERS[name].served_doc(doc)
        assert (got.input_tokens, got.output_tokens) == (3, 4), (name, got)
    assert PROVIDERS["bedrock"].served_doc(USAGE_SHAPES["bedrock"]).truncated  # Converse's max_tokens
