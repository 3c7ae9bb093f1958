"""Candidates that attack the verdict channel fail alone; the run goes on.

The candidate's process can write to the pipe its results travel on (it must, to report them),
so every line there is read against a schema: a forged isolation error, malformed frames, lines
before the load report or after the last result, and floods each fail that candidate with
`sandbox_violation` and a one-line detail, while good candidates around them pass. Isolation
errors travel on a pipe the child closes before any candidate code runs. As root (CI) the
candidates run in the sandbox's namespaces under its unprivileged slot uid."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from noisefloor.verifier.datasets import CodeTask
from noisefloor.verifier.differential import verdict
from noisefloor.verifier.isolation import Limits
from noisefloor.verifier.protocol import CandidateLines
from noisefloor.verifier.sandbox import Sandbox
from noisefloor.verifier.values import encode
from tests.conftest import wait_until

TASK = CodeTask("T/0", "def f(x):\n", "f", "def f(x):\n    return x\n", ((1,), (2,)), 0.0, "humaneval")
GOOD = "def f(x):\n    return x\n"


def _writer(lines: list[bytes], where: str = "call", repeat: int = 1) -> str:
    """A candidate that writes `lines` (`repeat` times) to every descriptor from 3 up, at import or in f."""
    body = (f"    data = {b''.join(lines)!r} * {repeat}\n"
            "    for fd in range(3, 64):\n        try:\n            os.write(fd, data)\n"
            "        except OSError:\n            pass\n")
    if where == "import":
        return "import os\nif True:\n" + body + GOOD
    return "import os\ndef f(x):\n" + body + "    return x\n"


LATE = ("import os, time\ndef f(x):\n    if x == 2 and os.fork() == 0:\n        time.sleep(0.2)\n"
        "        for fd in range(3, 64):\n            try:\n"
        "                os.write(fd, b'{\"i\": 2, \"ok\": true, \"out\": 2}\\n')\n"
        "            except OSError:\n                pass\n        os._exit(0)\n    return x\n")

HOSTILE = {
    "forged sandbox_error": _writer([b'{"phase": "load", "ok": false, "kind": "sandbox_error", "exc": "forged"}\n'],
                                    "import"),
    "result before load": _writer([b'{"i": 0, "ok": true, "out": 1}\n'], "import"),
    "not JSON": _writer([b"garbage\n"]),
    "a list": _writer([b"[1, 2]\n"]),
    "wrong index type": _writer([b'{"i": "0", "ok": true, "out": 1}\n']),
    "ok not a bool": _writer([b'{"i": 0, "ok": "yes", "out": 1}\n']),
    "undecodable out": _writer([b'{"i": 0, "ok": true, "out": {"$f": 1, "$i": 2}}\n']),
    "second load": _writer([b'{"phase": "load", "ok": true}\n']),
    "extra key": _writer([b'{"i": 0, "ok": true, "out": 1, "pass": true}\n']),
    "flood": _writer([b'{"i": 0, "ok": true, "out": 1}\n'], repeat=100_000),
    "late": LATE,
}


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    sb = Sandbox(1, Limits(cpu_s=5, memory_mb=512))
    yield sb
    sb.close()


def grade(sandbox: Sandbox, code: str):
    res = sandbox.run(code, "f", encode([list(i) for i in TASK.inputs]))
    return verdict(TASK, res, [1, 2])


@pytest.mark.parametrize("name", list(HOSTILE))
def test_each_hostile_candidate_fails_alone(sandbox, name):
    v = grade(sandbox, HOSTILE[name])
    assert v.outcome == 0 and v.failure == "sandbox_violation", (name, v)
    assert v.detail and "\n" not in v.detail
    assert grade(sandbox, GOOD).failure == "pass"  # the slot grades on


def test_the_schema_accepts_what_the_worker_writes_and_nothing_else():
    lines = CandidateLines(2)
    for raw in (b'{"phase": "load", "ok": true}', b'{"i": 0, "ok": true, "out": 1}', b'{"i": 1, "ok": false, "exc": "E"}'):
        lines.take(raw)
    assert lines.violation is None and len(lines.results) == 2
    lines.take(b'{"i": 2, "ok": true, "out": 1}')
    assert lines.violation == "more lines than the 2 inputs"
    failed = CandidateLines(2)
    failed.take(b'{"phase": "load", "ok": false, "kind": "syntax_error", "exc": "SyntaxError: x"}')
    assert failed.violation is None
    forged = CandidateLines(2)
    forged.take(b'{"phase": "load", "ok": false, "kind": "sandbox_error", "exc": "forged"}')
    assert forged.violation and forged.load is None


def _dataset(path: Path) -> Path:
    tasks = [{"task_id": "T/0", "prompt": "def add(a, b):\n", "entry_point": "add", "canonical_solution": "    return a + b\n",
              "base_input": [[1, 2], [3, 4]], "plus_input": [], "atol": 0},
             {"task_id": "T/1", "prompt": "def rev(s):\n", "entry_point": "rev", "canonical_solution": "    return s[::-1]\n",
              "base_input": [["ab"], ["xyz"]], "plus_input": [], "atol": 0}]
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def _as(entry: str, code: str) -> str:
    return code.replace("def f(x):", f"def {entry}(*x):").replace("return x\n", "return _good(*x)\n") + (
        "\ndef _good(*a):\n    return a[0] + a[1] if len(a) == 2 else a[0][::-1]\n")


_PEAK = ("import resource, subprocess, sys\n"
         "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
         "sys.exit(r.returncode)\n")


def _nfverify(samples: Path, dataset: Path, out: Path) -> tuple[int, str, int]:
    """Exit code, stderr and peak RSS (KiB; nfverify and the processes it waited for) of one run."""
    exe = Path(sys.executable).with_name("nfverify")
    r = subprocess.run([sys.executable, "-c", _PEAK, str(exe), "humaneval+", "--samples", str(samples),
                        "--dataset", str(dataset), "--outcomes", str(out), "-j", "2", "--timeout", "5"],
                       capture_output=True, text=True, timeout=300)
    return r.returncode, r.stderr, int(r.stdout.strip() or 0)


FLOOD = ("import os\ndef rev(s):\n    line = b'{\"i\": 0, \"ok\": true, \"out\": \"ba\"}\\n' * 100_000\n"
         "    for _ in range(30):  # 3M lines\n        for fd in range(3, 64):\n            try:\n"
         "                os.write(fd, line)\n            except OSError:\n                pass\n"
         "    return s[::-1]\n")


def test_a_mixed_run_finishes_good_candidates_pass_hostile_fail_alone(tmp_path):
    dataset = _dataset(tmp_path / "tiny.jsonl")
    good = [{"task_id": "T/0", "solution": "def add(a, b):\n    return a + b\n"},
            {"task_id": "T/1", "solution": "def rev(s):\n    return s[::-1]\n"}]
    hostile = [{"task_id": "T/0", "solution": _as("add", code), "name": name} for name, code in HOSTILE.items()
               if name not in ("flood", "late")]
    flood = {"task_id": "T/1", "name": "flood", "solution": FLOOD}
    mixed = [good[0], *hostile[:5], good[1], *hostile[5:], flood, *good]
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(s) + "\n" for s in mixed))
    base = tmp_path / "good.jsonl"
    base.write_text("".join(json.dumps(s) + "\n" for s in good * 2))
    rc0, err0, rss0 = _nfverify(base, dataset, tmp_path / "good_out.jsonl")
    assert rc0 == 0, err0
    rc, err, rss = _nfverify(samples, dataset, tmp_path / "out.jsonl")
    assert rc == 0 and "Traceback" not in err, err
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(rows) == len(mixed)
    for sample, row in zip(mixed, rows):
        want = "sandbox_violation" if "name" in sample else "pass"
        assert row["failure"] == want, (sample.get("name"), row)
    # a 3M-line flood does not grow the parent: its peak stays within 60 MiB of a run without it
    assert rss0 and rss - rss0 < 60 * 1024, (rss0, rss)


def _run_nfverify(*args: str, **kw) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("nfverify")
    return subprocess.Popen([str(exe), "humaneval+", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)

def _interrupt_after_rows(args: tuple[str, ...], partial: Path, rows: int, sig: int = signal.SIGINT,
                         ) -> tuple[subprocess.Popen[str], str]:
    """nfverify started with `args`, sent `sig` once its partial file holds `rows` graded rows."""
    p = _run_nfverify(*args)
    wait_until(lambda: partial.is_file() and len(partial.read_text().splitlines()) > rows,
               f"{rows} rows graded into {partial}", timeout=120)
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    return p, err



def test_ctrl_c_keeps_the_graded_rows_and_the_same_command_grades_only_the_rest(tmp_path):
    dataset = _dataset(tmp_path / "tiny.jsonl")
    slow = "import time\ndef add(a, b):\n    time.sleep(0.3)\n    return a + b\n"
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps({"task_id": "T/0", "solution": slow}) + "\n" for _ in range(12)))
    out = tmp_path / "out.jsonl"
    partial = tmp_path / "out.jsonl.partial"
    args = ("--samples", str(samples), "--dataset", str(dataset), "--outcomes", str(out), "-j", "1")
    p, err = _interrupt_after_rows(args, partial, 3)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "Aborted!" not in err and "interrupted" in err, err
    assert not out.exists()
    kept = len(partial.read_text().splitlines()) - 1  # the first line says which command made the file
    assert 3 <= kept < 12
    again = _run_nfverify(*args)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert f"resuming: {kept} rows" in err and f"{12 - kept}/{12 - kept}" in err, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["failure"] for r in rows] == ["pass"] * 12 and [r["replicate"] for r in rows] == list(range(12))
    assert not partial.exists()


def test_a_missing_output_folder_is_one_line_before_any_work(tmp_path):
    dataset = _dataset(tmp_path / "tiny.jsonl")
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"task_id": "T/0", "solution": "def add(a, b):\n    return a + b\n"}) + "\n")
    p = _run_nfverify("--samples", str(samples), "--dataset", str(dataset), "--outcomes", str(tmp_path / "nodir" / "o.jsonl"))
    _, err = p.communicate(timeout=120)
    assert p.returncode == 5 and "does not exist" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "reference outputs" not in err and "grading" not in err


def test_sigterm_ends_with_143_and_keeps_the_rows(tmp_path):
    dataset = _dataset(tmp_path / "tiny.jsonl")
    slow = "import time\ndef add(a, b):\n    time.sleep(0.3)\n    return a + b\n"
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps({"task_id": "T/0", "solution": slow}) + "\n" for _ in range(8)))
    partial = tmp_path / "out.jsonl.partial"
    p, err = _interrupt_after_rows(("--samples", str(samples), "--dataset", str(dataset), "--outcomes",
                                    str(tmp_path / "out.jsonl"), "-j", "1"), partial, 1, signal.SIGTERM)
    assert p.returncode == 143 and "Traceback" not in err and "interrupted" in err, err
    assert len(partial.read_text().splitlines()) >= 2


def _log_of_slow_answers(store_path: Path, n: int) -> None:
    """A store written through the real recorder: n sessions of task T/0, each answered with a
    correct but slow program, labelled as an agent run is."""
    from noisefloor.proxy.record.recorder import Recorder
    from noisefloor.proxy.request.keys import Rules
    from noisefloor.proxy.request.labels import Labels
    from noisefloor.proxy.request.traffic import RequestData, ResponseData
    from noisefloor.proxy.store.log import Store

    answer = "```python\nimport time\ndef add(a, b):\n    time.sleep(0.3)\n    return a + b\n```"
    with Store.open(store_path, write=True, create=True) as store:
        rec = Recorder(store, Rules())
        for r in range(n):
            body = json.dumps({"model": "m", "temperature": 0.5, "messages": [{"role": "user", "content": f"go {r}"}]})
            req = RequestData("POST", "http://up/v1/chat/completions", "up", "/v1/chat/completions",
                              (("content-type", "application/json"),), body.encode())
            pending = rec.begin(req, Labels(f"live-r{r}-T0", "T/0", str(r), "live"))
            doc = {"object": "chat.completion", "model": "m-1", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}]}
            rec.finish(pending, ResponseData(200, (("content-type", "application/json"),), json.dumps(doc).encode()),
                       latency_ms=1.0)


def test_ctrl_c_while_grading_a_log_keeps_the_rows_there_too_and_a_rerun_grades_the_rest(tmp_path):
    from noisefloor.proxy.store.log import Store

    dataset = _dataset(tmp_path / "tiny.jsonl")
    log = tmp_path / "log.lmdb"
    _log_of_slow_answers(log, 10)
    out = tmp_path / "out.jsonl"
    partial = tmp_path / "out.jsonl.partial"
    args = (str(log), "--dataset", str(dataset), "--outcomes", str(out), "-j", "1")
    p, err = _interrupt_after_rows(args, partial, 3)
    assert p.returncode == 130 and "Traceback" not in err, err
    kept = len(partial.read_text().splitlines()) - 1
    assert 3 <= kept < 10
    with Store.open(log, write=False) as store:
        assert len(store.outcome_rows()) == kept  # the log keeps the graded rows as well
    again = _run_nfverify(*args)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert f"resuming: {kept} rows" in err and f"{10 - kept}/{10 - kept}" in err, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["replicate"] for r in rows] == list(range(10)) and {r["failure"] for r in rows} == {"pass"}
    assert {(r["model"], r["served_model"], r["temperature"]) for r in rows} == {("m", "m-1", 0.5)}
    with Store.open(log, write=False) as store:
        assert len(store.outcome_rows()) == 10 and "not kept" not in err
