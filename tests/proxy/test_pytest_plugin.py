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



SHARING = '''
import json
import os
import time
import urllib.request
from pathlib import Path

import pytest

UPSTREAM = os.environ["NF_PLUGIN_UPSTREAM"]
BARRIER = Path(os.environ["NF_PLUGIN_BARRIER"])
SHARED = os.environ["NF_PLUGIN_SHARED"]  # "pair": test i of each module shares pair-i; else one for all
ROUND = os.environ["NF_PLUGIN_ROUND"]


def meet():
    """Arrive, then wait for the other worker's test: both tests end, and save, at the same moment."""
    k = 1
    while True:
        try:
            os.close(os.open(BARRIER / str(k), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            break
        except FileExistsError:
            k += 1
    partner = BARRIER / str(k + 1 if k % 2 else k - 1)
    deadline = time.monotonic() + 60
    while not partner.exists():
        assert time.monotonic() < deadline, "the other xdist worker's test never arrived"
        time.sleep(0.005)


def ask(text):
    body = json.dumps({{"model": "gpt-4o-mini", "messages": [{{"role": "user", "content": text}}]}}).encode()
    req = urllib.request.Request(os.environ["NFPROXY_URL"] + "/v1/chat/completions", data=body,
                                 headers={{"content-type": "application/json", "authorization": "Bearer sk-x"}})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)["choices"][0]["message"]["content"]


@pytest.mark.parametrize("n", [
    pytest.param(n, marks=pytest.mark.nfproxy(upstream=UPSTREAM, recording=f"pair-{{n}}.lmdb" if SHARED == "pair"
                                              else "shared.lmdb")) for n in range(2)])
def test_episode(n):
    assert ask(f"{module} episode {{n}} round {{ROUND}}").startswith("answer number")
    meet()
'''


def _exchanges(path: Path) -> int:
    from noisefloor.proxy.store.log import Store

    with Store.open(path, write=False) as store:
        return len(store)


@pytest.mark.slow
def test_xdist_workers_sharing_one_recording_lose_nothing(pytester: pytest.Pytester, upstream: FakeUpstream,
                                                          monkeypatch: pytest.MonkeyPatch):
    """Two xdist workers (one test module each, `--dist loadscope`) whose tests end together and save
    into one recording at the same moment, in every record mode: every episode is kept, and a
    strict run of the result passes."""
    pytest.importorskip("xdist")
    pytester.makepyfile(test_a=SHARING.format(module="a"), test_b=SHARING.format(module="b"))
    pytester.makeini(INI.format(upstream=upstream.url))

    def run(mode: str, shared: str, round_: int, **outcomes: int) -> None:
        barrier = pytester.mkdir(f"barrier-{len(list(pytester.path.glob('barrier-*')))}")
        monkeypatch.setenv("NF_PLUGIN_BARRIER", str(barrier))
        monkeypatch.setenv("NF_PLUGIN_SHARED", shared)
        monkeypatch.setenv("NF_PLUGIN_ROUND", str(round_))
        r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadscope",
                                          f"--nf-record-mode={mode}", timeout=300)
        r.assert_outcomes(**outcomes)

    # once: each pair of tests (one per worker) records into a recording neither found
    run("once", "pair", 1, passed=4)
    assert [_exchanges(pytester.path / f"pair-{n}.lmdb") for n in range(2)] == [2, 2]
    # new_episodes: into no recording, then (new prompts) into the one the first run left
    run("new_episodes", "shared", 1, passed=4)
    assert _exchanges(pytester.path / "shared.lmdb") == 4
    run("new_episodes", "shared", 2, passed=4)
    assert _exchanges(pytester.path / "shared.lmdb") == 8
    # all: the run's first save replaces the earlier runs' recording, its later saves add to it
    run("all", "shared", 2, passed=4)
    assert _exchanges(pytester.path / "shared.lmdb") == 4
    sent = len(upstream.requests)
    run("none", "shared", 2, passed=4)
    assert len(upstream.requests) == sent
    # nothing beside the recordings: no lock file, no half-written or moved-aside copy
    assert sorted(p.name for p in pytester.path.iterdir() if "lmdb" in p.name or "lock" in p.name) == [
        "pair-0.lmdb", "pair-1.lmdb", "shared.lmdb"]


def test_a_save_stopped_between_its_renames_is_put_back_and_a_held_folder_times_out(tmp_path):
    """A save killed after moving the recording aside and before moving the new one in: the next
    record-mode use puts the recording back before reading it. A folder another process holds
    locked past the wait is one error naming it, not a hang."""
    import fcntl
    import os

    from noisefloor.file_lock import LockTimeout, held
    from noisefloor.pytest_plugin import _copy_for_replay

    recording = tmp_path / "r.lmdb"
    (tmp_path / "r.lmdb.old").mkdir()
    (tmp_path / "r.lmdb.old" / "data.mdb").write_bytes(b"recorded")
    assert _copy_for_replay(recording, tmp_path / "copy", locked=True)
    assert (recording / "data.mdb").read_bytes() == b"recorded" and (tmp_path / "copy" / "data.mdb").exists()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process's save, in effect (flock is per open file)
        with pytest.raises(LockTimeout, match=f"{tmp_path} stayed locked"), held(tmp_path, timeout=0.2):
            pass
    finally:
        os.close(fd)
