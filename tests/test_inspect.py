"""inspect_ai, unchanged, through nfproxy: a real `inspect eval` (6 samples x 2 epochs, two turns
each, 4 connections at once) recorded and then strictly replayed, on chat completions and on the
Responses API; then its logs read by nfanalyze as outcome rows; and replayed with one sample's
prompt changed, where only that sample misses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from noisefloor.analyzer import inspect_logs
from tests.conftest import nfproxy_argv
from tests.fake_upstream import FakeUpstream

pytest.importorskip("inspect_ai")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
INSPECT = Path(sys.executable).with_name("inspect")


def inspect_through(mode: str, store: Path, logs: Path, responses_api: bool, upstream: str | None = None,
                    *extra: str) -> subprocess.CompletedProcess[str]:
    proxy = [*nfproxy_argv(), "run", "--listen", "127.0.0.1:0", "--mode", mode, "--store", str(store)]
    proxy += ["--upstream", upstream] if upstream else ["--strict"]
    agent = [str(INSPECT), "eval", "inspect_multiturn.py", "--model", "openai/gpt-4o-mini", "--epochs", "2",
             "-M", f"responses_api={'true' if responses_api else 'false'}", "--max-connections", "4",
             "--log-dir", str(logs), "--display", "plain", "--no-log-realtime", *extra]
    env = {**os.environ, "OPENAI_API_KEY": "sk-test-inspect-0001", "INSPECT_LOG_LEVEL": "warning"}
    return subprocess.run([*proxy, "--", *agent], capture_output=True, text=True, timeout=300, cwd=EXAMPLES, env=env)


def scored(logs: Path) -> list[tuple[str, int, int]]:
    return sorted((r["task_id"], r["replicate"], r["outcome"]) for _, r in inspect_logs.rows(str(logs)))


def samples(logs: Path) -> dict[tuple[str, int], tuple[str | None, str | None]]:
    """Each sample's (final answer, error message), by (sample id, epoch), read by inspect itself."""
    from inspect_ai.log import read_eval_log

    out = {}
    for f in inspect_logs.log_files(logs):
        for s in read_eval_log(str(f)).samples or []:
            score = next(iter(s.scores.values())).answer if s.scores else None
            out[(str(s.id), s.epoch)] = (score, s.error.message if s.error else None)
    return out


def answers(logs: Path) -> list[tuple[str, int, str]]:
    """Each sample's final answer, as the scorer saw it."""
    out = []
    for f in inspect_logs.log_files(logs):
        _, samples = inspect_logs._read(f)
        out += [(s.id, s.epoch, next(iter(s.scores.values()))["answer"]) for s in samples]
    return sorted(out)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    """One recorded eval per API flavour, shared by the tests (replay leaves the recording as it
    is): (folder with log.lmdb and the live logs, the record run, what the upstream was asked)."""
    made: dict[bool, tuple[Path, subprocess.CompletedProcess[str], list]] = {}

    def get(responses_api: bool) -> tuple[Path, subprocess.CompletedProcess[str], list]:
        if responses_api not in made:
            where = tmp_path_factory.mktemp("inspect")
            up = FakeUpstream().start()
            try:
                rec = inspect_through("record", where / "log.lmdb", where / "live", responses_api, up.url)
                made[responses_api] = (where, rec, list(up.requests))
            finally:
                up.stop()  # replay needs no provider
        return made[responses_api]

    return get


@pytest.mark.parametrize("responses_api", [False, True], ids=["chat-completions", "responses-api"])
def test_inspect_eval_records_and_replays_strictly_with_identical_scores(tmp_path, recorded, responses_api):
    where, rec, requests = recorded(responses_api)
    store = where / "log.lmdb"
    assert rec.returncode == 0, rec.stdout[-2000:] + rec.stderr[-3000:]
    assert "Traceback" not in rec.stderr and "CancelledError" not in rec.stderr, rec.stderr[-3000:]
    assert "0 errors" in rec.stderr
    path = "/v1/responses" if responses_api else "/v1/chat/completions"
    assert {r.path for r in requests} == {path} and len(requests) == 24
    rep = inspect_through("replay", store, tmp_path / "replay", responses_api)
    assert rep.returncode == 0, rep.stdout[-2000:] + rep.stderr[-3000:]
    assert "24 hits, 0 misses, 0 order violations, 0 errors" in rep.stderr
    assert scored(tmp_path / "replay") == scored(where / "live")
    assert answers(tmp_path / "replay") == answers(where / "live")
    # the ladder from the logs the user already has
    an = subprocess.run([str(Path(sys.executable).with_name("nfanalyze")), "--inspect-logs", str(where / "live"),
                         "--inspect-logs", f"replay={tmp_path / 'replay'}", "--json", "-", "--bootstrap", "300"],
                        capture_output=True, text=True, timeout=120)
    assert an.returncode == 0, an.stderr
    doc = json.loads(an.stdout)
    assert doc["conditions"]["live"]["tasks"] == 6 and doc["conditions"]["live"]["replicates"] == 2
    assert doc["conditions"]["replay"]["score"] == doc["conditions"]["live"]["score"]


def test_inspect_eval_with_one_sample_reworded_misses_only_that_sample(tmp_path, recorded):
    """Replay is by content: the reworded sample's first turn misses in both epochs (its second
    turn is never asked); the 5 other samples' 20 requests hit, whenever they come, and score as
    they did live."""
    where, rec, _ = recorded(False)
    store = where / "log.lmdb"
    assert rec.returncode == 0, rec.stdout[-2000:] + rec.stderr[-3000:]
    rep = inspect_through("replay", store, tmp_path / "replay", False, None, "-T", "reworded=2", "--no-fail-on-error")
    assert "20 hits, 2 misses, 0 order violations, 0 errors" in rep.stderr, rep.stderr[-3000:]
    misses = [ln for ln in rep.stderr.splitlines() if ln.startswith("nfproxy: replay miss ")]
    assert len(misses) == 2 and all("differs first at /body/messages/0/content" in ln for ln in misses), misses
    assert rep.returncode == 3, rep.stderr[-3000:]  # a strict replay with misses fails
    live, replayed = samples(where / "live"), samples(tmp_path / "replay")
    assert set(live) == set(replayed) and len(live) == 12
    for (sample, epoch), (answer, error) in replayed.items():
        if sample == "s2":
            assert error is not None and "nfproxy replay miss" in error, (sample, epoch, error)
        else:
            assert error is None and answer == live[(sample, epoch)][0], (sample, epoch)
