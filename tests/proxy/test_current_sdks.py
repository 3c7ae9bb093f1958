"""Today's SDKs and frameworks (the httpx2 generation: openai 3, anthropic 2, langchain-openai,
openai-agents, pydantic-ai, google-genai, litellm), unchanged, through a real nfproxy on
mitmproxy 12.3: each agent is recorded in the wrap form (`nfproxy ... -- python agent.py`, base
URLs from the environment) and strictly replayed in the base-URL form (the proxy's address passed
explicitly, a rotated API key) with the upstream still listening, and must see exactly what it saw
live while the upstream gets no connection at all. Plain, streamed and concurrent calls.

These SDKs cannot share an environment with mitmproxy 11 (h11 <= 0.14), so they are tested on
Python 3.12+; the 3.11 line keeps the SDKs of before (tests/proxy/test_proxy_e2e.py and the others)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from noisefloor.proxy.store.log import Store
from tests.conftest import ROOT, nfproxy_argv, start_nfproxy

AGENTS = ROOT / "tests" / "current_sdk_agents.py"
# the import that says the SDK is there, and the version line it must be (the current one)
SDKS = {
    "openai": ("openai", "3"),
    "anthropic": ("anthropic", "2"),
    "langchain-openai": ("langchain_openai", None),
    "openai-agents": ("agents", None),
    "pydantic-ai": ("pydantic_ai", None),
    "google-genai": ("google.genai", None),
    "litellm": ("litellm", None),
}
OLD_LINE = sys.version_info < (3, 12)
pytestmark = pytest.mark.skipif(OLD_LINE, reason="today's SDKs need h11 0.16, which only mitmproxy 12.3 (Python "
                                "3.12+) shares; the 3.11 line tests the SDKs of before")
RECORD_KEYS = {"OPENAI_API_KEY": "sk-current-record-0123456789", "ANTHROPIC_API_KEY": "sk-ant-current-record-0123",
               "GEMINI_API_KEY": "AIza-current-record-0123456789"}
REPLAY_KEYS = {"OPENAI_API_KEY": "sk-current-rotated-987654321", "ANTHROPIC_API_KEY": "sk-ant-current-rotated-98",
               "GEMINI_API_KEY": "AIza-current-rotated-98765432"}


def agent_env(tmp_path: Path, keys: dict[str, str]) -> dict[str, str]:
    drop = ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "GOOGLE_GEMINI_BASE_URL", "HTTPS_PROXY", "HTTP_PROXY",
            "https_proxy", "http_proxy", "GOOGLE_API_KEY")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, **keys, "HOME": str(tmp_path), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
            "OPENAI_AGENTS_DISABLE_TRACING": "1", "LOGFIRE_IGNORE_NO_CONFIG": "1"}


def result(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.slow
@pytest.mark.parametrize("sdk", list(SDKS))
def test_current_sdk_records_in_the_wrap_form_and_replays_strictly_in_the_base_url_form(sdk, tmp_path, upstream,
                                                                                         proxies):
    module, line = SDKS[sdk]
    if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
        pytest.skip(f"{sdk} is not installed (the test extra on Python 3.12+ brings it)")
    if line is not None:
        from importlib.metadata import version

        assert version(sdk).split(".")[0] == line, f"{sdk} {version(sdk)} is not the current line {line}.x"
    store = tmp_path / "log.lmdb"
    wrap = [*nfproxy_argv(), "run", "--listen", "127.0.0.1:0", "--mode", "record", "--store", str(store),
            "--upstream", upstream.url, "--", sys.executable, str(AGENTS), sdk]
    rec = subprocess.run(wrap, capture_output=True, text=True, timeout=240, cwd=tmp_path,
                         env=agent_env(tmp_path, RECORD_KEYS))
    recorded = result(rec)
    calls = len(upstream.requests)
    assert calls >= 5 and f"{calls} exchanges, 0 errors" in rec.stderr, rec.stderr[-3000:]
    assert len(set(map(str, recorded["concurrent"]))) == len(recorded["concurrent"]) == 4  # four distinct answers

    connections = upstream.connections
    rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store))  # upstream from the store: still up
    proxies.append(rep)
    base_url = subprocess.run([sys.executable, str(AGENTS), sdk, rep.url], capture_output=True, text=True, timeout=240,
                              cwd=tmp_path, env=agent_env(tmp_path, REPLAY_KEYS))
    assert result(base_url) == recorded  # texts, and the raw clients' response bytes
    assert rep.stop() == 0, rep.output[-3000:]
    assert f"{calls} hits, 0 misses, 0 order violations, 0 errors" in rep.output, rep.output[-3000:]
    assert upstream.connections == connections and len(upstream.requests) == calls  # replay never reached it

    with Store.open(store, write=False) as s:
        secrets = [k.encode() for k in RECORD_KEYS.values()]
        assert not any(key in body for body in s.bodies.all() for key in secrets)
        assert not any(key.decode() in json.dumps(ex.request) for ex in s.exchanges() for key in secrets)


@pytest.mark.slow
def test_langchain_with_question_two_of_six_changed_misses_once_and_answers_the_rest_as_recorded(store, upstream,
                                                                                                  proxies):
    if importlib.util.find_spec("langchain_openai") is None:
        pytest.skip("langchain-openai is not installed (the test extra on Python 3.12+ brings it)")
    from langchain_openai import ChatOpenAI

    questions = [f"Question {i} of six: name a colour that starts with the letter {'BGRYPW'[i]}." for i in range(6)]

    def run(proxy, asked: list[str]) -> list[str]:
        llm = ChatOpenAI(model="gpt-4o-mini", temperature=0, max_retries=0, base_url=proxy.url + "/v1",
                         api_key="sk-langchain-test-0123456789")
        out = []
        for q in asked:
            try:
                out.append(str(llm.invoke(q).content))
            except Exception as exc:  # noqa: BLE001 - the SDK's error for a miss, as a user would see it
                out.append(f"error: {exc}")
        return out

    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(rec)
    live = run(rec, questions)
    assert rec.stop() == 0 and len(set(live)) == 6, rec.output[-2000:]
    rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store))
    proxies.append(rep)
    changed = [q.replace("name a colour", "name one colour") if i == 2 else q for i, q in enumerate(questions)]
    replayed = run(rep, changed)
    assert rep.stop() == 3
    assert replayed[2].startswith("error: ") and "nfproxy replay miss" in replayed[2], replayed[2]
    assert replayed[:2] + replayed[3:] == live[:2] + live[3:]
    assert "5 hits, 1 misses, 0 order violations, 0 errors" in rep.output, rep.output[-3000:]
