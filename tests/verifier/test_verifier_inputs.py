"""nfverify's inputs are bounded and typed: crafted EvalPlus samples, EvalPlus task files and BFCL
files each give one line naming the file, the line and what to do, exit 5, no traceback and no
outcomes file, before any candidate runs; a decompression bomb stays far under 1 GB of RSS."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from noisefloor import bounded, exit_codes
from noisefloor.errors import InputError
from noisefloor.proxy.store.log import Store
from noisefloor.verifier.datasets import DatasetError, load_bfcl
from tests import loopback

GOOD_TASK = {"task_id": "T/0", "prompt": "def add(a, b):\n", "entry_point": "add",
             "canonical_solution": "    return a + b\n", "base_input": [[1, 2]], "plus_input": [], "atol": 0}
GOOD_SAMPLE = {"task_id": "T/0", "solution": "def add(a, b):\n    return a + b\n"}
_PEAK = ("import resource, subprocess, sys\n"
         "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
         "sys.stderr.write(r.stderr)\n"
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
         "sys.exit(r.returncode)\n")


def nfverify(*args: str) -> tuple[int, str, int]:
    """Exit status, stderr and peak RSS (KiB) of one nfverify process."""
    exe = Path(sys.executable).with_name("nfverify")
    r = subprocess.run([sys.executable, "-c", _PEAK, str(exe), *args], capture_output=True, text=True, timeout=300)
    return r.returncode, r.stderr, int(r.stdout.strip() or 0)


def jsonl(path: Path, docs: list) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


def one_line_refusal(rc: int, err: str, *needles: str) -> None:
    assert rc == exit_codes.INPUT, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    return jsonl(tmp_path / "tiny.jsonl", [GOOD_TASK])


SAMPLES = {  # name: (file bytes, what the one line must say)
    "latin-1 byte": (b'{"task_id": "T/0", "solution": "caf\xe9"}\n', ("s.jsonl:1", "not UTF-8")),
    "deep JSON": (b'{"task_id": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n", ("s.jsonl:1", "nested too deep")),
    "a list per line": (b'{"task_id": "T/0", "solution": "x"}\n[1, 2]\n', ("s.jsonl:2", "not an object")),
    "task id a number": (b'{"task_id": 7, "solution": "x"}\n', ("s.jsonl:1", "unknown task_id")),
    "solution a number": (b'{"task_id": "T/0", "solution": 12}\n', ("s.jsonl:1", "not a string of code")),
    "neither field": (b'\n{"task_id": "T/0"}\n', ("s.jsonl:2", "needs 'solution' or 'completion'")),
    "not JSON": (b'{"task_id": "T/0", "solution": \n', ("s.jsonl:1", "not valid JSON")),
    "a line of 17 MiB": (b'{"task_id": "T/0", "solution": "' + b"x" * (17 << 20) + b'"}\n',
                         ("s.jsonl:1", "longer than 16 MiB")),
}


@pytest.mark.parametrize("name", list(SAMPLES))
def test_a_crafted_samples_file_is_one_line_exit_5(tmp_path, dataset, name):
    data, needles = SAMPLES[name]
    samples = tmp_path / "s.jsonl"
    samples.write_bytes(data)
    out = tmp_path / "o.jsonl"
    rc, err, _ = nfverify("humaneval+", "--samples", str(samples), "--dataset", str(dataset), "--outcomes", str(out))
    one_line_refusal(rc, err, *needles)
    assert not out.exists() and not (tmp_path / "o.jsonl.partial").exists()  # nothing half-written


def test_a_bom_and_blank_lines_are_read(tmp_path, dataset):
    """What is refused is refused for a reason: the same sample with a BOM and blank lines passes."""
    samples = tmp_path / "s.jsonl"
    samples.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD_SAMPLE).encode() + b"\n\n")
    out = tmp_path / "o.jsonl"
    rc, err, _ = nfverify("humaneval+", "--samples", str(samples), "--dataset", str(dataset), "--outcomes", str(out),
                          "-j", "1")
    assert rc == 0, err
    assert [json.loads(line)["failure"] for line in out.read_text().splitlines()] == ["pass"]


TASKS = {  # name: (a change to the good task, what the one line must say)
    "entry point not a name": ({"entry_point": "add; import os"}, "not a Python name"),
    "inputs not a list": ({"base_input": "[[1, 2]]"}, "field 'base_input' is a str, not a list"),
    "atol a string": ({"atol": "0.1"}, "field 'atol' is a str"),
    "no prompt": ({"prompt": None}, "field 'prompt' is a NoneType"),
    "an input not an argument list": ({"base_input": [1, 2]}, "every input must be a list of arguments"),
}


@pytest.mark.parametrize("name", list(TASKS))
def test_a_crafted_task_file_is_one_line_exit_5(tmp_path, name):
    change, needle = TASKS[name]
    data = jsonl(tmp_path / "d.jsonl", [GOOD_TASK, GOOD_TASK | {"task_id": "T/1"} | change])
    samples = jsonl(tmp_path / "s.jsonl", [GOOD_SAMPLE])
    rc, err, _ = nfverify("humaneval+", "--samples", str(samples), "--dataset", str(data), "--outcomes",
                          str(tmp_path / "o.jsonl"))
    one_line_refusal(rc, err, "d.jsonl:2", needle)


def test_a_gzip_bomb_is_refused_in_bounded_memory(tmp_path):
    """1 GiB of zeros in 1 MiB of gzip: refused at the line cap, the process far under 1 GB."""
    bomb = tmp_path / "bomb.jsonl.gz"
    z = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    member = z.compress(b"\0" * (1 << 20)) + z.flush()  # one gzip member of 1 MiB of zeros
    bomb.write_bytes(member * 1024)  # 1024 members are one gzip file of 1 GiB (not 7 CPU-s of deflate)
    assert bomb.stat().st_size < 4 << 20
    samples = jsonl(tmp_path / "s.jsonl", [GOOD_SAMPLE])
    rc, err, peak_kib = nfverify("humaneval+", "--samples", str(samples), "--dataset", str(bomb), "--outcomes",
                                 str(tmp_path / "o.jsonl"))
    one_line_refusal(rc, err, "bomb.jsonl.gz:1", "longer than 16 MiB")
    assert 0 < peak_kib < 300 * 1024, peak_kib


def test_the_whole_file_is_capped_after_expansion():
    """Many short lines add up: the total cap refuses them, naming the line where it was passed."""
    lines = io.BytesIO(b'{"a": 1}\n' * 1000)
    with pytest.raises(InputError, match=r"x\.jsonl:114: more than 0 MiB"):
        list(bounded.json_lines(lines, "x.jsonl", total_limit=1024))
    assert len(list(bounded.json_lines(io.BytesIO(b'{"a": 1}\n' * 1000), "x.jsonl"))) == 1000
    # values add up across lines too (a reader may keep every line): 4 per line, refused past 10
    with pytest.raises(InputError, match=r"x\.jsonl:3: more than 10 JSON values"):
        list(bounded.json_lines(io.BytesIO(b'{"a": [1, 2], "b": 3}\n' * 5), "x.jsonl", values_limit=10))


BFCL_Q = {"id": "multiple_0", "question": [[{"role": "user", "content": "What is 5!?"}]],
          "function": [{"name": "math.factorial", "parameters": {"type": "dict", "properties": {}, "required": []}}]}
BFCL_A = {"id": "multiple_0", "ground_truth": [{"math.factorial": {"number": [5]}}]}
BFCL = {  # name: (question doc, answer doc, file and what the one line must say)
    "question a string": (BFCL_Q | {"question": "What is 5!?"}, BFCL_A, ("BFCL_v4_multiple.json:1", "'question'")),
    "a turn without text": (BFCL_Q | {"question": [[{"role": "user", "content": 5}]]}, BFCL_A, ("'question'",)),
    "function without a name": (BFCL_Q | {"function": [{"parameters": {}}]}, BFCL_A, ("'function'",)),
    "answer not a mapping": (BFCL_Q, BFCL_A | {"ground_truth": [["math.factorial", 5]]},
                             ("possible_answer_BFCL_v4_multiple.json:1", "'ground_truth'")),
    "allowed values not a list": (BFCL_Q, BFCL_A | {"ground_truth": [{"math.factorial": {"number": 5}}]},
                                  ("'ground_truth'",)),
    "id a number": (BFCL_Q | {"id": 3}, BFCL_A, ("field 'id' is a int",)),
}


def bfcl_folder(folder: Path, q: dict, a: dict) -> Path:
    folder.mkdir()
    for cat in ("multiple", "parallel"):
        jsonl(folder / f"BFCL_v4_{cat}.json", [q])
        jsonl(folder / f"possible_answer_BFCL_v4_{cat}.json", [a])
    return folder


@pytest.mark.parametrize("name", list(BFCL))
def test_crafted_bfcl_files_are_one_line(tmp_path, name):
    q, a, needles = BFCL[name]
    folder = bfcl_folder(tmp_path / "bfcl", q, a)
    with pytest.raises(DatasetError) as err:
        load_bfcl("multiple", folder)
    for n in needles:
        assert n in str(err.value)
    assert "\n" not in str(err.value)


def test_nfverify_bfcl_refuses_a_damaged_file_with_exit_5(tmp_path):
    folder = bfcl_folder(tmp_path / "bfcl", BFCL_Q, BFCL_A)
    (folder / "BFCL_v4_parallel.json").write_bytes(b'{"id": "p", "question": [[' + b"[" * 100_000 + b"]]}\n")
    log = tmp_path / "log.lmdb"
    with Store.open(log, write=True, create=True):
        pass
    out = tmp_path / "o.jsonl"
    rc, err, _ = nfverify("bfcl", str(log), "--dataset", str(folder), "--outcomes", str(out))
    one_line_refusal(rc, err, "BFCL_v4_parallel.json:1", "nested too deep")
    assert not out.exists()
    assert [t.task_id for t in load_bfcl("multiple", folder)] == ["multiple_0"]  # the good file is read


def test_gzip_is_read_as_gzip(tmp_path):
    data = tmp_path / "d.jsonl.gz"
    data.write_bytes(gzip.compress((json.dumps(GOOD_TASK) + "\n").encode()))
    samples = jsonl(tmp_path / "s.jsonl", [GOOD_SAMPLE])
    out = tmp_path / "o.jsonl"
    rc, err, _ = nfverify("humaneval+", "--samples", str(samples), "--dataset", str(data), "--outcomes", str(out),
                          "-j", "1")
    assert rc == 0, err
    assert json.loads(out.read_text())["failure"] == "pass"


def test_outcomes_into_a_pipe_leave_the_pipe_a_pipe(tmp_path, dataset):
    """`--outcomes /dev/null` must not rename a file over the device: a FIFO stands in for it here."""
    import os
    import stat
    import threading

    fifo = tmp_path / "rows.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    samples = jsonl(tmp_path / "s.jsonl", [GOOD_SAMPLE])
    rc, err, _ = nfverify("humaneval+", "--samples", str(samples), "--dataset", str(dataset), "--outcomes", str(fifo),
                          "-j", "1")
    reader.join(30)
    assert rc == 0, err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [json.loads(line)["failure"] for line in got[0].splitlines()] == ["pass"]


def test_a_log_with_no_session_of_the_suite_is_refused_not_0_of_0(tmp_path):
    """A log recorded for something else is the wrong log: one line and exit 5, not "0/0 passed"."""

    from noisefloor.proxy.launch import start
    from tests.fake_upstream import FakeUpstream

    folder = bfcl_folder(tmp_path / "bfcl", BFCL_Q, BFCL_A)
    log = tmp_path / "log.lmdb"
    up = FakeUpstream().start()
    try:
        rec = start("--mode", "record", "--store", str(log), "--upstream", up.url, timeout=60)
        try:
            body = {"model": "m", "messages": [{"role": "user", "content": "not a BFCL question"}]}
            assert loopback.post(rec.url + "/v1/chat/completions", json=body, timeout=20).status_code == 200
        finally:
            assert rec.stop() == 0
    finally:
        up.stop()
    out = tmp_path / "o.jsonl"
    rc, err, _ = nfverify("bfcl", str(log), "--dataset", str(folder), "--outcomes", str(out))
    one_line_refusal(rc, err, "no session of the log matches a BFCL task", "x-nf-task")
    assert not out.exists()
