"""Four third-party agents nobody here wrote (openai-agents on the Responses API, pydantic-ai, a
langgraph ReAct agent streaming, smolagents), unchanged, through real nfproxy processes in the
wrap form against a fake tool-calling model on loopback (tests/tool_upstream.py): three sampled
runs recorded and each replayed exactly in turn; a changed system prompt, tool description and
tool result each reported at its own step; four concurrent agents recorded and replayed exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, nfproxy_argv
from tests.tool_upstream import ToolUpstream

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    sys.version_info < (3, 12), reason="today's agent frameworks need h11 0.16, which only mitmproxy 12.3 (Python "
    "3.12+) accepts; the test extra installs them there")]

AGENTS = ("openai-agents", "pydantic-ai", "langgraph", "smolagents")
SCRIPT = ROOT / "tests" / "real_agents.py"


@pytest.fixture
def model() -> Iterator[ToolUpstream]:
    up = ToolUpstream().start()
    yield up
    up.stop()


def _agent(store: Path, model: ToolUpstream, agent: str, *args: str, env: dict[str, str] | None = None,
           concurrent: bool = False) -> tuple[subprocess.CompletedProcess[str], list[str] | None]:
    argv = [*nfproxy_argv(), "run", "--listen", "127.0.0.1:0", "--store", str(store), "--upstream", model.url, *args,
            "--", sys.executable, str(SCRIPT), agent, *(["concurrent"] if concurrent else [])]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=180,
                       env={**os.environ, "OPENAI_API_KEY": "sk-real-agents-0001", "PYTHONPATH": str(ROOT),
                            **(env or {})})
    found = [line[7:] for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    return r, json.loads(found[-1]) if found else None


@pytest.mark.parametrize("agent", AGENTS)
def test_three_sampled_runs_replay_in_turn_and_each_change_diverges_at_its_step(agent, tmp_path, model):
    store = tmp_path / "s.lmdb"
    runs = []
    for i in range(3):
        r, answers = _agent(store, model, agent, "--mode", "record", "--session", f"run-{i + 1}")
        assert r.returncode == 0 and answers, r.stderr[-3000:]
        runs.append(answers)
    asked = len(model.requests)
    for i in range(3):  # each run in turn, exactly, without reaching the model
        r, answers = _agent(store, model, agent, "--mode", "replay", "--strict", "--replay-session", "next")
        assert r.returncode == 0, r.stderr[-3000:]
        assert answers == runs[i] and f"recorded session 'run-{i + 1}'" in r.stderr and " 0 misses" in r.stderr
    assert len(model.requests) == asked
    changes = {"NF_SYSTEM": ("Answer in French.", 0), "NF_TOOL_DOC": ("Look up the weather.", 0),
               "NF_TOOL_SUFFIX": (", wind 30 km/h", 1)}  # the tool's result is first sent at step 1
    for var, (value, step) in changes.items():
        r, _ = _agent(store, model, agent, "--mode", "replay", "--strict", "--replay-session", "run-1",
                      env={var: value})
        assert r.returncode != 0, f"{var}: {r.stderr[-2000:]}"
        assert f"diverged from recorded session 'run-1' at step {step} (miss at /body/" in r.stderr, \
            f"{var}: {r.stderr[-3000:]}"
    assert len(model.requests) == asked


@pytest.mark.parametrize("agent", AGENTS)
def test_four_concurrent_agents_record_and_replay_exactly(agent, tmp_path, model):
    store = tmp_path / "s.lmdb"
    r, recorded = _agent(store, model, agent, "--mode", "record", concurrent=True)
    assert r.returncode == 0 and recorded and len(recorded) == 4, r.stderr[-3000:]
    asked = len(model.requests)
    r, replayed = _agent(store, model, agent, "--mode", "replay", "--strict", concurrent=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert replayed == recorded and " 0 misses" in r.stderr and len(model.requests) == asked
