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

import pytest

from noisefloor import exit_codes
from noisefloor.proxy.launch import FINISH_SIGNAL
from noisefloor.proxy.store.log import Store
from tests import loopback
from tests.conftest import start_nfproxy


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, exit_codes.INTERRUPTED),
                                             (signal.SIGTERM, exit_codes.TERMINATED), (FINISH_SIGNAL, exit_codes.OK)])
def test_a_proxy_on_its_own_ends_by_signal_with_its_status_the_summary_and_the_recording(tmp_path, upstream,
                                                                                          proxies, sig, status):
    store = tmp_path / "s.lmdb"
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(rec)
    for n in range(2):
        r = loopback.post(rec.url + "/v1/chat/completions", timeout=20,
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
    loopback.post(rec.url + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=20)
    assert rec.stop() == exit_codes.OK
    for sig, status in ((FINISH_SIGNAL, exit_codes.REPLAY_FAILED), (signal.SIGINT, exit_codes.INTERRUPTED)):
        rep = start_nfproxy("--mode", "replay", "--store", str(store))
        proxies.append(rep)
        r = loopback.post(rep.url + "/v1/chat/completions", json={"model": "other", "messages": []}, timeout=20)
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


def _interrupted_after_two_runs(out: Path, ignore_sigint: bool = False) -> tuple[subprocess.Popen[str], str]:
    """nfladder in its own process group, sent SIGINT once two runs finished (as a terminal's Ctrl-C
    reaches the whole foreground group); `ignore_sigint`: nfladder itself ignores it (a script's
    background job), so only its proxy and agents get it. The process and its stderr."""
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    p = subprocess.Popen(_nfladder(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=ignore)
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
    return p, err


def test_ctrl_c_of_nfladder_exits_130_without_a_traceback_and_the_rerun_resumes(tmp_path):
    out = tmp_path / "o"
    # a terminal's Ctrl-C reaches the whole foreground group: nfladder, its proxy and its agents
    p, err = _interrupted_after_two_runs(out)
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


def test_runs_cut_off_by_their_proxys_interrupt_are_not_failed_runs_and_run_again(tmp_path):
    """nfladder started where SIGINT is ignored (a script's background job) while Ctrl-C reaches its
    proxy: the runs the proxy's end cut off are neither reported nor kept as failed."""
    out = tmp_path / "o"
    p, err = _interrupted_after_two_runs(out, ignore_sigint=True)
    assert p.returncode == exit_codes.INTERRUPTED, err[-3000:]
    done = _finished(out)
    assert 2 <= len(done) < 12 and all(a["returncode"] == 0 for a in done), done
    assert f"[live] interrupted: {len(done)}/12 runs" in err and "failed" not in err, err[-3000:]


STUCK = '''
import pathlib, sys, time
from noisefloor._cli import exit_on_sigterm
canary = pathlib.Path(sys.argv[1])
exit_on_sigterm(grace=1.0, hard_stop=lambda: canary.write_text("killed what it started"))
try:
    print("ready", flush=True)  # inside: a signal from here on finds the cleanup below
    time.sleep(600)
finally:  # an unwinding that cannot end: a cleanup waiting on something that never comes
    time.sleep(600)
'''


def test_a_command_that_cannot_unwind_after_sigterm_prints_its_stacks_stops_its_children_and_exits_143(tmp_path):
    from noisefloor._cli import STUCK_AFTER_SIGTERM

    canary = tmp_path / "canary"
    p = subprocess.Popen([sys.executable, "-c", STUCK, str(canary)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        p.send_signal(signal.SIGQUIT)  # stacks on demand (printed in the C handler, at once), and it goes on
        p.send_signal(signal.SIGTERM)
        start = time.monotonic()
        _, err = p.communicate(timeout=60)
        took = time.monotonic() - start
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    assert p.returncode == exit_codes.TERMINATED, err[-3000:]
    assert 1.0 <= took < 30, (took, err)
    assert canary.read_text() == "killed what it started"
    stuck = err.index(STUCK_AFTER_SIGTERM)
    assert "Current thread" in err[:stuck] or "Thread 0x" in err[:stuck], err  # SIGQUIT's dump came first
    assert "in <module>" in err[stuck:], err  # and the deadline's dump names where the main thread was


def test_a_signal_the_kernel_hands_another_thread_still_ends_the_wait_for_an_agent():
    """The kernel may give a process's signal to any thread; Python runs its handler in the main
    thread when that thread next wakes. The executor's wait for an agent wakes every WAKE_S, so
    the interrupt does not wait for the agent (an untimed wait here ends only with the future)."""
    import threading
    from concurrent.futures import Future

    from noisefloor.ladder import executors

    class Stop(Exception):
        pass

    def handler(signum: int, frame: object) -> None:
        raise Stop

    never: Future = Future()  # an agent that would run on and on
    sent = threading.Event()

    def from_another_thread() -> None:
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR2)  # to this thread, not the main one
        sent.set()

    old = signal.signal(signal.SIGUSR2, handler)
    try:
        threading.Timer(0.2, from_another_thread).start()
        start = time.monotonic()
        with pytest.raises(Stop):
            executors._result(never)
        took = time.monotonic() - start
    finally:
        signal.signal(signal.SIGUSR2, old)
    assert sent.is_set() and took < 0.2 + executors.WAKE_S + 5, took


def test_a_proxy_that_fails_to_start_or_outlives_its_command_is_killed(tmp_path, monkeypatch):
    from noisefloor.proxy import launch

    monkeypatch.setattr(launch, "_STARTED", set())  # this test's proxies only: others in this process live on
    with pytest.raises(launch.ProxyStartError, match="did not listen"):
        launch.start("--store", str(tmp_path / "a.lmdb"), timeout=0.001)
    assert not launch._STARTED  # the one that could not start in time is gone, not left listening
    proxy = start_nfproxy("--store", str(tmp_path / "b.lmdb"), "--upstream", "http://127.0.0.1:9")
    assert launch._STARTED == {proxy.proc}
    launch.kill_started()
    assert proxy.proc.wait(10) == -signal.SIGKILL
    assert proxy.stop() == -signal.SIGKILL and not launch._STARTED
