"""The pytest plugin, on a throwaway project (pytester, each run a real pytest session): a test
marked `@pytest.mark.nfproxy` records with --nf-record-mode=once, passes offline with its recording
byte-identical, fails with the nearest request and the diff once its prompt changes, and passes
offline again after --nf-record-mode=new_episodes, which sent only the new request upstream; one
of the offline runs is on two pytest-xdist workers (subprocesses). The other sessions run inside
this process, which has imported the SDK once: in a subprocess each would import it again, the
larger part of the test's CPU."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy  # noqa: F401 - imported before pytester's in-process runs, not inside one (see below)
import pytest

from tests.fake_upstream import FakeUpstream

# pytester's in-process runs drop the modules first imported inside them; numpy (which the plugin's
# merge of a test's recording imports) cannot be imported twice in one process, so the second run
# failed whenever no earlier test in this worker had imported it

pytest_plugins = ["pytester"]

PROJECT = '''
import os

import openai
import pytest

UPSTREAM = os.environ["NF_PLUGIN_UPSTREAM"]
PROMPT = {prompt!r}


def ask(text):
    client = openai.OpenAI(api_key="sk-plugin-test-0123456789", max_retries=0)  # OPENAI_BASE_URL: the proxy
    return client.chat.completions.create(model="gpt-4o-mini", messages=[{{"role": "user", "content": text}}])


@pytest.mark.nfproxy(upstream=UPSTREAM)
def test_agent():
    assert ask("the same every time").choices[0].message.content.startswith("answer number")
    assert ask(PROMPT).choices[0].message.content.startswith("answer number")


def test_fixture_form(nfproxy):
    assert os.environ["OPENAI_BASE_URL"] == nfproxy.env["OPENAI_BASE_URL"] == nfproxy.url + "/v1"
    assert ask("through the fixture").choices[0].message.content.startswith("answer number")
'''

INI = "[pytest]\nnf_record_mode = none\nnf_upstream = {upstream}\n"


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeUpstream]:
    server = FakeUpstream().start()
    monkeypatch.setenv("NF_PLUGIN_UPSTREAM", server.url)
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    yield server
    server.stop()


def _project(pytester: pytest.Pytester, prompt: str, upstream: FakeUpstream) -> None:
    pytester.makepyfile(test_project=PROJECT.format(prompt=prompt))
    pytester.makeini(INI.format(upstream=upstream.url))


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """One pytest session on the project, in this process (the SDK stays imported between runs)."""
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)


def test_record_replay_miss_and_new_episodes(pytester: pytest.Pytester, upstream: FakeUpstream):
    pytest.importorskip("xdist")
    pytest.importorskip("openai")  # imported here, before the sessions: each reuses it
    _project(pytester, "write a haiku", upstream)
    recordings = pytester.path / "recordings"
    offline = _run(pytester)
    offline.assert_outcomes(errors=2)  # default none: no recording is an error, never upstream
    assert "record it once with --nf-record-mode=once" in offline.stdout.str()
    assert len(upstream.requests) == 0

    _run(pytester, "--nf-record-mode=once").assert_outcomes(passed=2)
    assert len(upstream.requests) == 3
    assert sorted(p.name for p in (recordings / "test_project").iterdir()) == ["test_agent.lmdb",
                                                                               "test_fixture_form.lmdb"]
    recorded = _digest(recordings)
    assert all(name.endswith("data.mdb") for name in recorded)  # one compact file per test, nothing else

    # offline, byte-identical, and on two xdist workers: each test its own proxies and temporary copy
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2").assert_outcomes(passed=2)
    assert len(upstream.requests) == 3 and _digest(recordings) == recorded

    _project(pytester, "write a limerick", upstream)
    # only the changed test (the fixture form's offline pass on this recording was just shown)
    changed = _run(pytester, "-k", "test_agent")
    changed.assert_outcomes(failed=1)
    out = changed.stdout.str()
    assert "nfproxy strict replay missed (1; " in out and "nearest recorded request: exchange" in out
    assert '-/body/messages/0/content = "write a haiku"' in out and '+/body/messages/0/content = "write a limerick"' in out
    assert len(upstream.requests) == 3 and _digest(recordings) == recorded

    _run(pytester, "--nf-record-mode=new_episodes").assert_outcomes(passed=2)
    assert len(upstream.requests) == 4  # only the new prompt went upstream; the rest was replayed
    assert upstream.requests[-1].body.count(b"write a limerick") == 1
    grown = _digest(recordings)
    assert grown != recorded
    assert grown["test_project/test_fixture_form.lmdb/data.mdb"] == recorded["test_project/test_fixture_form.lmdb/data.mdb"]

    # offline again: the grown recording (the fixture form's is byte-identical to the one that
    # passed offline on the xdist workers above)
    _run(pytester, "-k", "test_agent").assert_outcomes(passed=1)
    assert len(upstream.requests) == 4 and _digest(recordings) == grown

