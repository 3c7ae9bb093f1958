"""Interrupts keep the work, with real processes this test starts (and signals only those): a
proxy run on its own ends by SIGINT / SIGTERM with 130 / 143, its summary printed, no traceback
and every answered exchange kept, while SIGUSR1 (how nfladder and the launcher stop a proxy)
ends it with the run's own status; nfladder on Ctrl-C ends with 130, no traceback, and the same
command then resumes: the finished agent runs are not run again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from noisefloor import exit_codes
from noisefloor.proxy.launch import FINISH_SIGNAL
from noisefloor.proxy.store import Store
from tests.conftest import start_nfproxy


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, exit_codes.INTERRUPTED),
                                             (signal.SIGTERM, exit_codes.TERMINATED), (FINISH_SIGNAL, exit_codes.OK)])
def test_a_proxy_on_its_own_ends_by_signal_with_its_status_the_summary_and_the_recording(tmp_path, upstream,
                                                                                          proxies, sig, status):
    store = tmp_path / "s.lmdb"
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(rec)
    for n in range(2):
        r = httpx.post(rec.url + "/v1/chat/completions", timeout=20,
                       json={"model": "m", "messages": [{"role": "user", "content": f"q{n}"}]})
        assert r.status_code == 200
    assert rec.stop(sig) == status, rec.output
    assert "nfproxy record: 2 exchanges, 0 errors" in rec.output and "Traceback" not in rec.output, rec.output
    with Store.open(store, write=False) as s:
        assert [ex.response["status"] for ex in s.exchanges()] == [200, 200]


def test_finish_signal_reports_a_strict_replay_miss_while_sigint_reports_the_interrupt(tmp_path, upstream, proxies):
    store = tmp_path / "s.lmdb"
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(rec)
    httpx.post(rec.url + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=20)
    assert rec.stop() == exit_codes.OK
    for sig, status in ((FINISH_SIGNAL, exit_codes.REPLAY_FAILED), (signal.SIGINT, exit_codes.INTERRUPTED)):
        rep = start_nfproxy("--mode", "replay", "--store", str(store))
        proxies.append(rep)
        r = httpx.post(rep.url + "/v1/chat/completions", json={"model": "other", "messages": []}, timeout=20)
        assert r.status_code == 404 and r.headers["x-nf-replay"] == "miss"
        assert rep.stop(sig) == status, rep.output
        assert "1 misses" in rep.output and "Traceback" not in rep.output, rep.output


def _nfladder(out: Path) -> list[str]:
    """The built-in agent as a script (nfladder runs it in a thread by default): the Ctrl-C reaches
    agent processes, as it does a user's agent."""
    exe = Path(sys.executable).with_name("nfladder")
    return [str(exe), "run", "--agent", f"{sys.executable} -m noisefloor.ladder.agent {{task_file}}", "--tasks", "3",
            "-R", "4", "--conditions", "live", "-j", "1", "--bootstrap", "200", "--latency-ms", "150", "--no-plot",
            "--out", str(out)]


def _finished(out: Path) -> list[dict]:
    path = out / "attempts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_ctrl_c_of_nfladder_exits_130_without_a_traceback_and_the_rerun_resumes(tmp_path):
    out = tmp_path / "o"
    # a terminal's Ctrl-C reaches the whole foreground group: nfladder, its proxy and its agents
    p = subprocess.Popen(_nfladder(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(_finished(out)) < 2 and p.poll() is None:
            time.sleep(0.1)
        assert p.poll() is None, "nfladder ended before it could be interrupted"
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    assert p.returncode == exit_codes.INTERRUPTED, err[-3000:]
    assert "Traceback" not in err and "Error" not in err, err[-3000:]
    assert err.rstrip().endswith("interrupted; the agent runs that finished are kept in --out: the same command "
                                 "resumes"), err[-3000:]
    done = _finished(out)
    assert 2 <= len(done) < 12 and all(a["returncode"] == 0 for a in done), done
    again = subprocess.run(_nfladder(out), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming: {len(done)} of 12 runs done earlier; {12 - len(done)} to run" in again.stderr, again.stderr
    sessions = [a["session"] for a in _finished(out)]
    assert len(sessions) == 12 and len(set(sessions)) == 12  # each run once: none of the finished ones again
    doc = json.loads((out / "report.json").read_text())
    assert doc["conditions"]["live"]["tasks"] == 3 and doc["conditions"]["live"]["replicates"] == 4
