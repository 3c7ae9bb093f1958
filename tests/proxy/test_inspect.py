"""inspect_ai, unchanged, through nfproxy: a real `inspect eval` (6 samples x 2 epochs, two turns
each, 4 connections at once) recorded and then strictly replayed, on chat completions and on the
Responses API; then its logs read by nfanalyze as outcome rows; and replayed with one sample's
prompt changed, where only that sample misses.

Both API flavours run in one `inspect eval` process (two model specs, one log each): each process
spends most of its ~9 CPU-s importing inspect_ai, and what a test checks is the traffic and the
logs, not a fresh process per flavour."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from noisefloor.analyzer import inspect_logs
from tests.conftest import ROOT, nfproxy_argv
from tests.fake_upstream import FakeUpstream

if importlib.util.find_spec("inspect_ai") is None:  # not imported: ~3.5 CPU-s this process never needs
    pytest.skip("inspect_ai is in the test extra", allow_module_level=True)
EXAMPLES = ROOT / "examples"
INSPECT = Path(sys.executable).with_name("inspect")
FLAVOURS = {False: "chat-completions", True: "responses-api"}  # responses_api: the name of its log folder
BOTH = (False, True)


def inspect_through(mode: str, store: Path, logs: Path, flavours: tuple[bool, ...], upstream: str | None = None,
                    *extra: str) -> subprocess.CompletedProcess[str]:
    """One `inspect eval` process through one nfproxy, one model spec per API flavour; each flavour's
    log is then moved to `logs/<flavour>/`."""
    proxy = [*nfproxy_argv(), "run", "--listen", "127.0.0.1:0", "--mode", mode, "--store", str(store)]
    proxy += ["--upstream", upstream] if upstream else ["--strict"]
    specs = [f"--model-spec={{model: openai/gpt-4o-mini, model_args: {{responses_api: {str(r).lower()}}}}}"
             for r in flavours]
    agent = [str(INSPECT), "eval", "inspect_multiturn.py", *specs, "--epochs", "2", "--max-connections", "4",
             "--log-dir", str(logs), "--display", "plain", "--no-log-realtime", *extra]
    env = {**os.environ, "OPENAI_API_KEY": "sk-test-inspect-0001", "INSPECT_LOG_LEVEL": "warning"}
    run = subprocess.run([*proxy, "--", *agent], capture_output=True, text=True, timeout=300, cwd=EXAMPLES, env=env)
    _by_flavour(logs)
    return run


def _by_flavour(logs: Path) -> None:
    """Each log into the folder of the flavour its header names (one log per flavour, never two)."""
    for f in inspect_logs.log_files(logs) if logs.is_dir() and any(logs.iterdir()) else []:
        header, _ = _entries(f)
        folder = logs / FLAVOURS[bool(header["eval"]["model_args"]["responses_api"])]
        folder.mkdir(exist_ok=True)
        assert not any(folder.iterdir()), f"two logs of one flavour in {logs}"
        shutil.move(f, folder / f.name)


def _entries(log: Path) -> tuple[dict, list[dict]]:
    """A log's header and its samples as inspect wrote them (its own reader would cost the test
    process ~3.5 CPU-s of imports)."""
    with zipfile.ZipFile(log) as z:
        names = sorted(n for n in z.namelist() if n.startswith("samples/"))
        return inspect_logs._entry(z, log, "header.json"), [inspect_logs._entry(z, log, n) for n in names]


def scored(logs: Path) -> list[tuple[str, int, int]]:
    return sorted((r["task_id"], r["replicate"], r["outcome"]) for _, r in inspect_logs.rows(str(logs)))


def samples(logs: Path) -> dict[tuple[str, int], tuple[str | None, str | None]]:
    """Each sample's (final answer, error message), by (sample id, epoch), from its full record."""
    out = {}
    for f in inspect_logs.log_files(logs):
        for s in _entries(f)[1]:
            score = next(iter(s["scores"].values()))["answer"] if s.get("scores") else None
            out[(str(s["id"]), s["epoch"])] = (score, (s.get("error") or {}).get("message"))
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
    """One recorded eval of both API flavours, shared by the tests (replay leaves the recording as
    it is): (folder with log.lmdb and the live logs, the record run, what the upstream was asked)."""
    where = tmp_path_factory.mktemp("inspect")
    up = FakeUpstream().start()
    try:
        rec = inspect_through("record", where / "log.lmdb", where / "live", BOTH, up.url)
    finally:
        up.stop()  # replay needs no provider
    assert rec.returncode == 0, rec.stdout[-2000:] + rec.stderr[-3000:]
    return where, rec, list(up.requests)


@pytest.fixture(scope="module")
def replayed(recorded, tmp_path_factory: pytest.TempPathFactory):
    """Both flavours strictly replayed in one eval: (its logs folder, the run)."""
    logs = tmp_path_factory.mktemp("inspect-replay")
    return logs, inspect_through("replay", recorded[0] / "log.lmdb", logs, BOTH)


@pytest.mark.parametrize("responses_api", BOTH, ids=FLAVOURS.values())
def test_inspect_eval_records_and_replays_strictly_with_identical_scores(recorded, replayed, responses_api):
    where, rec, requests = recorded
    assert "Traceback" not in rec.stderr and "CancelledError" not in rec.stderr, rec.stderr[-3000:]
    assert "0 errors" in rec.stderr
    path = "/v1/responses" if responses_api else "/v1/chat/completions"
    assert {r.path for r in requests} == {"/v1/responses", "/v1/chat/completions"} and len(requests) == 48
    assert sum(r.path == path for r in requests) == 24
    logs, rep = replayed
    assert rep.returncode == 0, rep.stdout[-2000:] + rep.stderr[-3000:]
    assert "48 hits, 0 misses, 0 order violations, 0 errors" in rep.stderr
    live, replay = where / "live" / FLAVOURS[responses_api], logs / FLAVOURS[responses_api]
    assert scored(replay) == scored(live) and len(scored(live)) == 12
    assert answers(replay) == answers(live)
    # the ladder from the logs the user already has
    an = subprocess.run([str(Path(sys.executable).with_name("nfanalyze")), "--inspect-logs", f"live={live}",
                         "--inspect-logs", f"replay={replay}", "--json", "-", "--bootstrap", "300"],
                        capture_output=True, text=True, timeout=120)
    assert an.returncode == 0, an.stderr
    doc = json.loads(an.stdout)
    assert doc["conditions"]["live"]["tasks"] == 6 and doc["conditions"]["live"]["replicates"] == 2
    assert doc["conditions"]["replay"]["score"] == doc["conditions"]["live"]["score"]


def test_inspect_eval_with_one_sample_reworded_misses_only_that_sample(tmp_path, recorded):
    """Replay is by content: the reworded sample's first turn misses in both epochs (its second
    turn is never asked); the 5 other samples' 20 requests hit, whenever they come, and score as
    they did live."""
    where, _, _ = recorded
    rep = inspect_through("replay", where / "log.lmdb", tmp_path / "replay", (False,), None,
                          "-T", "reworded=2", "--no-fail-on-error")
    assert "20 hits, 2 misses, 0 order violations, 0 errors" in rep.stderr, rep.stderr[-3000:]
    misses = [ln for ln in rep.stderr.splitlines() if ln.startswith("nfproxy: replay miss ")]
    assert len(misses) == 2 and all("differs first at /body/messages/0/content" in ln for ln in misses), misses
    assert rep.returncode == 3, rep.stderr[-3000:]  # a strict replay with misses fails
    flavour = FLAVOURS[False]
    live, replayed = samples(where / "live" / flavour), samples(tmp_path / "replay" / flavour)
    assert set(live) == set(replayed) and len(live) == 12
    for (sample, epoch), (answer, error) in replayed.items():
        if sample == "s2":
            assert error is not None and "nfproxy replay miss" in error, (sample, epoch, error)
        else:
            assert error is None and answer == live[(sample, epoch)][0], (sample, epoch)
