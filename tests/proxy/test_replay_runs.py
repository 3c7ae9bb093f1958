"""Repeated agent runs through a real nfproxy (the wrap form, loopback upstream): which recorded
run a replay follows and says it follows, `--replay-session next` taking recorded runs in turn
across restarts, where a replay diverged (step, JSON path, recorded steps cut off), and recording
into a session name the store already holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import nfproxy_argv
from tests.fake_upstream import FakeUpstream

# A two-step agent at temperature > 0: its second request carries the first answer as text, the way
# agents that keep a transcript do. It prints both answers: the run's trajectory.
AGENT = """
import json, os, sys, urllib.request
base = os.environ["OPENAI_BASE_URL"]
system = os.environ.get("AGENT_SYSTEM", "You are terse.")
def ask(messages):
    body = {"model": "gpt-4o-mini", "temperature": 0.9, "messages": [{"role": "system", "content": system}] + messages}
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", "authorization": "Bearer sk-runs-0001"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"]
first = ask([{"role": "user", "content": "Plan the trip."}])
second = ask([{"role": "user", "content": "Plan the trip."},
              {"role": "user", "content": "Your plan was: " + first + " Now refine it."}])
print(json.dumps([first, second]))
"""


def _nfproxy(tmp_path: Path, store: Path, upstream_url: str, *args: str, env: dict[str, str] | None = None,
             ) -> subprocess.CompletedProcess[str]:
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    import os

    return subprocess.run([*nfproxy_argv(), "run", "--listen", "127.0.0.1:0", "--store", str(store), "--upstream",
                           upstream_url, *args, "--", sys.executable, str(agent)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


def _plans(doc: dict, n: int) -> str:
    return f"plan {n}: take the night train, then walk the last mile"  # long enough to be quoted as text


def _record_three(tmp_path: Path, store: Path, upstream: FakeUpstream) -> list[list[str]]:
    upstream.responder = _plans
    upstream_url = upstream.url
    runs = []
    for i in range(3):
        r = _nfproxy(tmp_path, store, upstream_url, "--mode", "record", "--session", f"run-{i + 1}")
        assert r.returncode == 0, r.stderr
        runs.append(json.loads(r.stdout))
    assert len({json.dumps(x) for x in runs}) == 3  # sampled: three different trajectories
    return runs


@pytest.mark.slow
def test_a_plain_replay_says_which_recorded_run_it_follows_and_how_many_others_match(tmp_path, upstream):
    store = tmp_path / "s.lmdb"
    runs = _record_three(tmp_path, store, upstream)
    r = _nfproxy(tmp_path, store, upstream.url, "--mode", "replay", "--strict")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == runs[0]
    assert "followed recorded session 'run-1'" in r.stderr and "2 other recorded sessions match" in r.stderr
    assert "--replay-session next" in r.stderr


@pytest.mark.slow
def test_replay_session_next_reproduces_each_recorded_run_in_turn_across_restarts(tmp_path, upstream):
    store = tmp_path / "s.lmdb"
    runs = _record_three(tmp_path, store, upstream)
    seen = upstream.connections
    for i in range(3):
        r = _nfproxy(tmp_path, store, upstream.url, "--mode", "replay", "--strict", "--replay-session", "next")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == runs[i], f"replay {i + 1} did not reproduce run {i + 1}"
        assert f"recorded session 'run-{i + 1}'" in r.stderr, r.stderr
    assert upstream.connections == seen  # no replay reached the provider
    done = _nfproxy(tmp_path, store, upstream.url, "--mode", "replay", "--strict", "--replay-session", "next")
    assert done.returncode != 0 and "every recorded session was replayed" in done.stderr
    assert "--replay-session first" in done.stderr and "Traceback" not in done.stderr
    again = _nfproxy(tmp_path, store, upstream.url, "--mode", "replay", "--strict", "--replay-session", "first")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == runs[0]
    after = _nfproxy(tmp_path, store, upstream.url, "--mode", "replay", "--strict", "--replay-session", "next")
    assert json.loads(after.stdout) == runs[1]


@pytest.mark.slow
def test_a_changed_system_prompt_diverges_at_step_0_naming_the_path_and_the_step_it_cut_off(tmp_path, upstream):
    store = tmp_path / "s.lmdb"
    _record_three(tmp_path, store, upstream)
    r = _nfproxy(tmp_path, store, upstream.url, "--mode", "replay", "--strict", "--replay-session", "run-2",
                 "--replay-log-in-store", env={"AGENT_SYSTEM": "You are verbose."})
    assert r.returncode != 0, r.stderr  # the agent failed on the miss: its status wins over replay's 3
    assert "diverged from recorded session 'run-2' at step 0" in r.stderr, r.stderr
    assert "/body/messages/0/content" in r.stderr and "1 later recorded step cut off" in r.stderr
    log = subprocess.run([*nfproxy_argv(), "log", "--store", str(store)], capture_output=True, text=True, timeout=60)
    assert log.returncode == 0, log.stderr
    assert "diverged from recorded session 'run-2' at step 0" in log.stdout and "/body/messages/0/content" in log.stdout


@pytest.mark.slow
def test_recording_into_a_session_the_store_holds_is_refused_or_numbered(tmp_path, upstream):
    store = tmp_path / "s.lmdb"
    first = _nfproxy(tmp_path, store, upstream.url, "--mode", "record", "--session", "run")
    assert first.returncode == 0, first.stderr
    again = _nfproxy(tmp_path, store, upstream.url, "--mode", "record", "--session", "run")
    assert again.returncode == 5 and "already holds a session named 'run'" in again.stderr
    assert "--new-session" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    numbered = _nfproxy(tmp_path, store, upstream.url, "--mode", "record", "--session", "run", "--new-session")
    assert numbered.returncode == 0, numbered.stderr
    assert "recording into session 'run-2'" in numbered.stderr
    log = subprocess.run([*nfproxy_argv(), "log", "--store", str(store), "--json"], capture_output=True, text=True,
                         timeout=60)
    sessions = {json.loads(line)["session"] for line in log.stdout.splitlines() if line.strip()}
    assert sessions == {"run", "run-2"}


def test_turns_start_fresh_from_an_unreadable_state_file_and_refuse_next_mixed_with_names(tmp_path):
    from noisefloor.errors import InputError
    from noisefloor.proxy.record.recorder import Recorder
    from noisefloor.proxy.replay import turns
    from noisefloor.proxy.request.keys import Rules
    from noisefloor.proxy.request.labels import Labels
    from noisefloor.proxy.request.traffic import RequestData, ResponseData
    from noisefloor.proxy.store.log import Store

    path = tmp_path / "s.lmdb"
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "q"}]}).encode()
    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        for name in ("b\x1b[2J", "a"):  # recorded order, not name order; a hostile name escaped when shown
            rec.finish(rec.begin(RequestData("POST", "http://u/v1/chat/completions", "u", "/v1/chat/completions", (),
                                             body), Labels(name)), ResponseData(200, (), b'{"choices": []}'))
    state = tmp_path / "state"
    with Store.open(path, write=False) as s:
        first = turns.take(s, path, state, turns.NEXT)
        assert (first.session, first.number, first.of) == ("b\x1b[2J", 1, 2) and "\\x1b" in first.line()
        for f in state.glob("*.json"):
            f.write_text("{not json")  # damaged: a fresh start, not a traceback
        assert turns.take(s, path, state, turns.NEXT).session == "b\x1b[2J"
        assert turns.take(s, path, state, turns.NEXT).session == "a"
        with pytest.raises(InputError, match="every recorded session was replayed"):
            turns.take(s, path, state, turns.NEXT)
        assert turns.take(s, path, state, turns.FIRST).session == "b\x1b[2J"
    assert turns.wanted(("next",)) == "next" and turns.wanted(("a", "b")) is None
    with pytest.raises(InputError, match="stands alone"):
        turns.wanted(("next", "a"))
