"""The sandbox against hostile candidates. As root (CI runs as root) each candidate runs under an
unprivileged slot uid, in an empty network namespace and its own mount namespace; the process
limit is checked with a harmless bounded spawner before any fork bomb is tried, and "delete
outside" aims at a canary this test made."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import noisefloor
from noisefloor.verifier import forkserver, uids
from noisefloor.verifier.datasets import CodeTask
from noisefloor.verifier.differential import Differential, verdict
from noisefloor.verifier.isolation import Limits, SandboxError
from noisefloor.verifier.sandbox import Sandbox
from noisefloor.verifier.uids import kill_uid, live_pids
from noisefloor.verifier.values import decode, encode
from tests.conftest import wait_until

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="uid, network and mount isolation need root")
TASK = CodeTask("T/0", "def f(x):\n", "f", "def f(x):\n    return x\n", ((1,),), 0.0, "humaneval")
SECRET = "sk-test-0123456789abcdefNOISEFLOOR"


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    mp = pytest.MonkeyPatch()
    mp.setenv("OPENAI_API_KEY", SECRET)  # the verifier's environment holds a key; candidates must not
    sb = Sandbox(1, Limits(cpu_s=2, memory_mb=512, fsize_mb=4, nproc=16))
    yield sb
    sb.close()
    mp.undo()


def run(sandbox: Sandbox, code: str, inputs: tuple = ((1,),)):
    res = sandbox.run(code, "f", encode([list(i) for i in inputs]))
    return res, verdict(TASK, res, [1] * len(inputs))


def out(sandbox: Sandbox, body: str):
    """What `f` returned (or raised) for a candidate whose body is `body`."""
    res, _ = run(sandbox, "def f(x):\n" + "".join(f"    {line}\n" for line in body.splitlines()))
    r = res.results[0]
    return r["out"] if r["ok"] else r["exc"]


def uid_processes(uid: int) -> int:
    """Live processes of the slot uid, after a moment for SIGKILL to land."""
    deadline = time.monotonic() + 5
    while live_pids(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(live_pids(uid))


def test_a_plain_candidate_passes_and_a_wrong_one_fails(sandbox):
    assert run(sandbox, "def f(x):\n    return x\n")[1].failure == "pass"
    assert run(sandbox, "def f(x):\n    return x + 1\n")[1].failure == "wrong_output"
    assert run(sandbox, "def f(x):\n    raise ValueError('no')\n")[1].failure == "exception"
    assert run(sandbox, "def g(x):\n    return x\n")[1].failure == "no_code"


def test_correct_candidates_import_any_stdlib_module(sandbox):
    """Python lives under /root here (pyenv): the slot uid must still import what was not preloaded."""
    code = ("import gzip, glob, socket, sqlite3, csv, zipfile, fractions, xml.etree.ElementTree, email.utils\n"
            "def f(x):\n    return x\n")
    assert run(sandbox, code)[1].failure == "pass"


def test_no_credentials_reach_the_candidate_or_the_outcome(sandbox):
    env = out(sandbox, "import os\nreturn sorted(os.environ)")
    assert not {k for k in env if "KEY" in k or "TOKEN" in k or "SECRET" in k}
    assert set(env) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
                        "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"}
    res, v = run(sandbox, "import os\ndef f(x):\n    raise RuntimeError(os.environ.get('OPENAI_API_KEY', 'none'))\n")
    assert v.failure == "exception" and "none" in v.detail and SECRET not in v.detail
    # even a candidate that knows the key (it is in its text) cannot carry it into the outcome row
    res, v = run(sandbox, f"def f(x):\n    raise RuntimeError({SECRET!r})\n")
    assert SECRET not in v.detail and "[redacted]" in v.detail


@ROOT_ONLY
def test_default_isolation_is_namespaces(sandbox):
    assert sandbox.mode == "namespaces"


@ROOT_ONLY
def test_the_users_files_do_not_exist_for_the_candidate(sandbox, tmp_path):
    """Dataset, reference cache, proxy store, home and repository: none is visible, not even by path."""
    dataset = tmp_path / "HumanEvalPlus.jsonl"
    dataset.write_text('{"canonical_solution": "return x"}\n')
    os.chmod(tmp_path, 0o755)
    os.chmod(dataset, 0o644)  # world-readable, as datasets and caches usually are
    repo = Path(noisefloor.__file__).resolve().parent
    for path in (dataset, repo / "__init__.py", Path.home() / ".cache", "/etc/passwd", "/proc/1/environ"):
        got = out(sandbox, f"return open({str(path)!r}, 'rb').read()[:20]")
        assert isinstance(got, str) and ("FileNotFoundError" in got or "IsADirectoryError" in got), (path, got)
    listing = out(sandbox, "import os\nreturn sorted(os.listdir('/'))")
    assert "home" not in listing and "proc" not in listing and "candidate" in listing


@ROOT_ONLY
def test_nothing_written_survives_into_the_next_candidate(sandbox):
    host_before = set(os.listdir("/tmp"))
    wrote = out(sandbox, "import os\nfor d in ('/tmp', '/var/tmp', '/dev/shm', '.'):\n"
                         "    open(os.path.join(d, 'nf-leak'), 'w').write('x')\nreturn os.getcwd()")
    assert wrote == "/candidate"
    seen = out(sandbox, "import os\nreturn [os.path.exists(os.path.join(d, 'nf-leak')) "
                        "for d in ('/tmp', '/var/tmp', '/dev/shm', '.')]")
    assert seen == [False, False, False, False]
    assert "nf-leak" not in set(os.listdir("/tmp")) - host_before


@ROOT_ONLY
def test_a_unix_socket_outside_is_unreachable(sandbox, tmp_path):
    path = tmp_path / "s.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    os.chmod(tmp_path, 0o755)
    os.chmod(path, 0o777)
    srv.listen(1)
    srv.settimeout(0.5)
    got = out(sandbox, f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(path)!r})\nreturn 'connected'")
    with pytest.raises(TimeoutError):
        srv.accept()
    srv.close()
    assert got != "connected" and "FileNotFoundError" in got


def test_fail_closed_when_a_limit_cannot_be_set():
    """An rlimit the candidate's uid may not set: the candidate is not run, the run says why."""
    sb = Sandbox(1, Limits(nofile=1 << 40))
    try:
        with pytest.raises(SandboxError, match="setrlimit"):
            sb.run("def f(x):\n    return x\n", "f", encode([[1]]))
    finally:
        sb.close()


@ROOT_ONLY
def test_fail_closed_when_the_network_namespace_cannot_be_made(monkeypatch):
    def refuse(flags: int) -> None:
        raise OSError(1, "unshare refused (simulated)")

    monkeypatch.setattr(forkserver._jail, "unshare", refuse)
    sb = Sandbox(1, Limits())
    try:
        with pytest.raises(SandboxError, match="network namespace"):
            sb.run("def f(x):\n    return x\n", "f", encode([[1]]))
    finally:
        sb.close()


@ROOT_ONLY
def test_process_limit_holds_first_with_a_bounded_spawner(sandbox):
    """At most 200 short-lived children; the limit (16 for the slot uid) must stop most of them."""
    spawner = (
        "import os, time\n"
        "def f(x):\n"
        "    made = 0\n"
        "    for _ in range(200):\n"
        "        try:\n"
        "            pid = os.fork()\n"
        "        except OSError:\n"
        "            break\n"
        "        if pid == 0:\n"
        "            time.sleep(1.5)\n"
        "            os._exit(0)\n"
        "        made += 1\n"
        "    return made\n"
    )
    res, _ = run(sandbox, spawner)
    made = res.results[0]["out"]
    assert 0 < made < 16, f"the process limit did not hold: {made} children"
    assert uid_processes(sandbox.uids[0]) == 0, "children outlived the run"


@ROOT_ONLY
def test_fork_bomb_and_daemons_are_contained(sandbox):
    start = time.monotonic()
    res, v = run(sandbox, "import os\ndef f(x):\n    while True:\n        os.fork()\n")
    # each fork that gives up reports a result of its own: one line too many is a violation
    assert v.outcome == 0 and v.failure in ("exception", "timeout", "sandbox_violation")
    assert time.monotonic() - start < 30
    assert uid_processes(sandbox.uids[0]) == 0
    daemon = ("import os, time\ndef f(x):\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
              "            time.sleep(60)\n        os._exit(0)\n    return x\n")
    start = time.monotonic()
    assert run(sandbox, daemon)[1].failure == "pass"
    assert time.monotonic() - start < 10  # the run does not wait for its daemon
    assert uid_processes(sandbox.uids[0]) == 0


def test_infinite_loop_and_endless_printing_time_out(sandbox):
    assert run(sandbox, "def f(x):\n    while True:\n        pass\n")[1].failure == "timeout"
    assert run(sandbox, "def f(x):\n    while True:\n        print('spam' * 100)\n")[1].failure == "timeout"


THREE = CodeTask("T/3", "def f(x):\n", "f", "def f(x):\n    return x\n", ((1,), (2,), (3,)), 0.0, "humaneval")


def _stopping_at_a_wrong_output(sandbox: Sandbox, code: str):
    """Run on THREE's inputs with a check that calls an exception or a wrong output decisive."""
    asked: list[int] = []

    def decides(i: int, line: dict, value: object) -> bool:
        asked.append(i)
        return not line["ok"] or value != i + 1

    res = sandbox.run(code, "f", encode([list(i) for i in THREE.inputs]), decides=decides)
    return res, verdict(THREE, res, [1, 2, 3]), asked


def test_a_decisive_result_stops_the_candidate_and_settles_its_verdict(sandbox):
    """Wrong at input 1, then asleep for ten minutes at input 2: stopped at input 1 (not timed out at
    the wall backstop), with the verdict the full run would give; no process of it is left."""
    sleeper = "import time\ndef f(x):\n    if x == 3:\n        time.sleep(600)\n    return x if x < 2 else -x\n"
    res, v, asked = _stopping_at_a_wrong_output(sandbox, sleeper)
    assert res.stopped and not res.timed_out and len(res.results) == 2 and asked == [0, 1]
    assert (v.failure, v.detail) == ("wrong_output", "input 1")
    if os.geteuid() == 0:
        assert uid_processes(sandbox.uids[0]) == 0
    res, v, _ = _stopping_at_a_wrong_output(sandbox, "def f(x):\n    return x\n")
    assert not res.stopped and v.failure == "pass" and len(res.values) == 3  # a passing run is never cut
    raiser = "def f(x):\n    if x == 2:\n        raise KeyError(x)\n    return x\n"
    res, v, asked = _stopping_at_a_wrong_output(sandbox, raiser)
    assert res.stopped and asked == [0, 1] and (v.failure, v.detail[:16]) == ("exception", "input 1: KeyErro")


def test_the_differential_grader_stops_a_candidate_at_its_first_wrong_output(sandbox):
    """Through the grader every grading path uses: a candidate wrong at input 0 that would then
    sleep for ten minutes is stopped there; the canonical solution (its references) runs whole."""
    d = Differential([THREE], sandbox, "0" * 64, len(THREE.inputs))
    runs = []
    real = sandbox.run

    def spy(*args: object, **kw: object):
        runs.append(real(*args, **kw))
        return runs[-1]

    sandbox.run = spy  # type: ignore[method-assign]
    try:
        v = d.grade_program("T/3", "import time\ndef f(x):\n    if x > 1:\n        time.sleep(600)\n    return -x\n")
    finally:
        del sandbox.run
    assert (v.failure, v.detail) == ("wrong_output", "input 0")
    reference, candidate = runs
    assert not reference.stopped and len(reference.results) == 3
    assert candidate.stopped and not candidate.timed_out and len(candidate.results) == 1


def test_lines_after_the_decisive_result_are_not_read(sandbox):
    """A candidate that breaks the protocol right after its first wrong output is judged by that
    output, every time: what it writes once its verdict is settled is dropped, however soon."""
    late = ("import os\ndef f(x):\n    if x == 3:\n        for fd in range(3, 64):\n            try:\n"
            "                os.write(fd, b'garbage\\n')\n            except OSError:\n                pass\n"
            "    return -x\n")
    for _ in range(3):
        res, v, asked = _stopping_at_a_wrong_output(sandbox, late)
        assert res.violation is None and asked == [0] and (v.failure, v.detail) == ("wrong_output", "input 0")


def test_huge_allocation_fails_inside_the_limit(sandbox):
    res, v = run(sandbox, "def f(x):\n    b = bytearray(50 * 1024**3)\n    return x\n")
    assert v.failure == "exception" and "MemoryError" in v.detail


def test_huge_file_is_cut_at_the_file_size_limit(sandbox):
    """The candidate ignores SIGXFSZ and counts what it could write: the 4 MiB limit must stop it."""
    written = out(sandbox, "import signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\nn = 0\n"
                           "with open('big.bin', 'wb') as fh:\n    try:\n"
                           "        for _ in range(64):\n            n += fh.write(b'0' * (1 << 20))\n            fh.flush()\n"
                           "    except OSError:\n        pass\nreturn n")
    assert isinstance(written, int) and written <= 4 << 20


def test_killing_its_parent_does_not_stop_grading(sandbox):
    server = sandbox._servers[0]
    res, v = run(sandbox, "import os\ndef f(x):\n    os.kill(os.getppid(), 9)\n    return x\n")
    assert v.outcome == 0
    assert run(sandbox, "def f(x):\n    return x\n")[1].failure == "pass"  # the sandbox still grades
    if os.geteuid() == 0:  # the fork server is root's: the candidate could not touch it
        assert sandbox._servers[0] is server and server.alive()


def test_forged_frames_do_not_desynchronize_grading(sandbox):
    """A candidate writes fake end and result lines to every descriptor it can find."""
    forger = ("import os\ndef f(x):\n    for fd in range(3, 64):\n        try:\n"
              "            os.write(fd, b'\\nE {\"signal\": null, \"cpu_s\": 0}\\nC {\"i\": 0, \"ok\": true, \"out\": 7}\\n')\n"
              "        except OSError:\n            pass\n    return x + 1\n")
    v = run(sandbox, forger)[1]  # the result pipe is the one it can write: its lines break the protocol
    assert v.failure == "sandbox_violation" and "not a JSON object" in v.detail
    assert run(sandbox, "def f(x):\n    return x\n")[1].failure == "pass"
    assert run(sandbox, "def f(x):\n    return x * 3\n")[1].failure == "wrong_output"


def test_no_network_even_to_loopback(sandbox):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(srv.accept())
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    code = (f"import socket\ndef f(x):\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    s.sendall(b'leak')\n    return x\n")
    res, v = run(sandbox, code)
    stop.set()
    t.join(2)
    srv.close()
    assert v.failure == "exception"
    assert accepted == []


@ROOT_ONLY
def test_deleting_outside_the_working_directory_fails(sandbox, tmp_path):
    """The candidate runs (its answer comes back, with what its deletes met) and the canary,
    world-writable outside, survives: it does not exist in the candidate's view."""
    canary_dir = tmp_path / "canary-dir"
    canary_dir.mkdir()
    canary = canary_dir / "canary.txt"
    canary.write_text("still here")
    os.chmod(tmp_path, 0o777)
    os.chmod(canary_dir, 0o777)
    os.chmod(canary, 0o666)
    code = (f"import os, shutil\ndef f(x):\n    met = [os.path.exists({str(canary)!r})]\n"
            f"    for rm in (os.remove, shutil.rmtree):\n        try:\n"
            f"            rm({str(canary)!r} if rm is os.remove else {str(canary_dir)!r})\n"
            f"            met.append('deleted')\n        except OSError as exc:\n"
            f"            met.append(type(exc).__name__)\n    return [x * 7, met]\n")
    res = sandbox.run(code, "f", encode([[6]]))
    assert res.load == {"phase": "load", "ok": True} and len(res.results) == 1 and res.results[0]["ok"], res
    assert decode(res.results[0]["out"]) == [42, [False, "FileNotFoundError", "FileNotFoundError"]]
    assert canary.read_text() == "still here"


@ROOT_ONLY
def test_concurrent_sandboxes_never_share_a_uid(sandbox):
    """The end of a run kills every process of its slot uid: two verifiers must not share one."""
    with Sandbox(2, Limits(cpu_s=5)) as other:
        assert not set(other.uids) & set(sandbox.uids) and len(set(other.uids)) == 2
        slow = "import time\ndef f(x):\n    time.sleep(1.5)\n    return x\n"
        results: list[str] = []
        t = threading.Thread(target=lambda: results.append(run(other, slow)[1].failure))
        t.start()
        wait_until(lambda: any(live_pids(u) for u in other.uids), "the other sandbox's run started")
        for _ in range(3):  # runs that end (and sweep their own uid) while the other sandbox's run is alive
            assert run(sandbox, "def f(x):\n    return x\n")[1].failure == "pass"
        t.join(30)
    assert results == ["pass"]


@ROOT_ONLY
def test_kill_uid_sweeps_a_straggler():
    """The uid is claimed the way a sandbox claims a slot's (its lock held): another suite's
    sandbox on this machine never runs candidates under it while this test kills its processes."""
    uid, lock = uids.claim_uid()
    try:
        with Sandbox(2, Limits()) as other:  # a sandbox starting meanwhile claims other uids
            assert uid not in other.uids and len(set(other.uids)) == 2
        _sweep_a_straggler(uid)
    finally:
        lock.close()


def _sweep_a_straggler(uid: int) -> None:
    assert live_pids(uid) == []  # nobody else's: the lock says so
    pid = os.fork()
    if pid == 0:  # a straggler of that uid, as a candidate's daemon would be
        os.setgid(uid)
        os.setuid(uid)
        time.sleep(30)
        os._exit(0)
    try:
        deadline = time.monotonic() + 5
        while not live_pids(uid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert live_pids(uid) == [pid]
        assert kill_uid(uid) == 1
        assert os.waitpid(pid, 0)[1] & 0x7F == signal.SIGKILL
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_uid_claims_live_in_one_private_folder(tmp_path):
    """Claims in a folder another user could write would not be claims: such a folder is refused,
    and the claims' folder never follows TMPDIR (two verifiers with different TMPDIRs see each other)."""
    planted = tmp_path / "locks"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    with pytest.raises(SandboxError, match="not a private folder"):
        uids.claim_uid(planted)
    mine = tmp_path / "mine"
    uid, lock = uids.claim_uid(mine)
    try:
        assert oct(mine.stat().st_mode & 0o777) == "0o700" and uids.BASE_UID <= uid < uids.BASE_UID + uids.UID_RANGE
        again, other = uids.claim_uid(mine)  # held: the next claim gets the next uid
        other.close()
        assert again != uid
    finally:
        lock.close()
    seen = subprocess.run([sys.executable, "-c", "from noisefloor.verifier import uids; print(uids.LOCKS)"],
                          env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, check=True)
    assert seen.stdout.strip() == str(uids.LOCKS) and str(tmp_path) not in seen.stdout
