"""`nfproxy merge` with worker processes (large shards): the same store as merging in one process,
and a damaged body that only a worker reads is still refused before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.request.traffic import RequestData, ResponseData
from noisefloor.proxy.store.log import Store

# merge in a fresh process (pytest's may run threads, where merge uses no workers), with workers
# from 50 exchanges on
MERGE = """
import json, sys
from noisefloor.proxy.store.merge import _copying as merge_copy
from noisefloor.proxy.store.merge.run import merge
from noisefloor.proxy.store.log import StoreError
merge_copy.PARALLEL_FROM = 50
try:
    r = merge(sys.argv[1], sys.argv[3:], jobs=int(sys.argv[2]))
except StoreError as exc:
    sys.exit(f"refused: {exc}")
print(json.dumps({"exchanges": r.exchanges_added, "bodies": r.bodies_added, "workers": merge_copy.workers(2, 180)}))
"""


def run_merge(out: Path, jobs: int, *shards: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", MERGE, str(out), str(jobs), *map(str, shards)], capture_output=True,
                          text=True, timeout=300)


def contents(path: Path) -> tuple[list, list, list, int]:
    """Everything a merge writes, as read back: records (verified), bodies, index rows, replay entries."""
    with Store.open(path, write=False) as s:
        records = [e.json_bytes() for e in s.exchanges()]
        bodies = sorted(s.bodies.all())
        rows = list(s.tables.rows("lookups"))  # the index's lookups
        return records, bodies, rows, s.tables.count("recorded")


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sessions of 1-3 turns whose requests repeat the conversation (so requests are stored
    against their session's previous exchange), a replay recorded in the same store."""
    path = tmp_path_factory.mktemp("shard") / "s.lmdb"
    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        for i in range(90):
            messages = [{"role": "system", "content": "a shared system prompt, long enough to chain " * 20}]
            for turn in range(1 + i % 3):
                messages.append({"role": "user", "content": f"session {i} turn {turn} asks a question " * 5})
                body = json.dumps({"model": "m", "messages": messages}).encode()
                req = RequestData("POST", "http://up/v1/chat/completions", "up", "/v1/chat/completions", (), body)
                answer = json.dumps({"choices": [{"message": {"content": f"answer {i}.{turn} " * 30}}]}).encode()
                rec.finish(rec.begin(req, Labels(f"s{i}")), ResponseData(200, (), answer))
                messages.append({"role": "assistant", "content": f"answer {i}.{turn} " * 30})
    return path


def test_workers_write_the_same_store_as_one_process(shard, tmp_path):
    one, two = tmp_path / "one.lmdb", tmp_path / "two.lmdb"
    a, b = run_merge(one, 1, shard), run_merge(two, 2, shard)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert json.loads(a.stdout) == json.loads(b.stdout) == {"exchanges": 180, "bodies": json.loads(a.stdout)["bodies"],
                                                          "workers": 2}  # where this merge runs, two workers
    assert contents(one) == contents(two)
    records, bodies, rows, entries = contents(two)
    assert len(records) == entries == 180 and rows
    with Store.open(shard, write=False) as s:
        assert bodies == sorted(s.bodies.all())
    again = run_merge(two, 2, shard)  # merging again adds nothing
    assert again.returncode == 0 and json.loads(again.stdout)["exchanges"] == 0


def test_a_body_damaged_in_a_workers_range_is_refused_before_anything_is_written(shard, tmp_path):
    damaged = tmp_path / "damaged.lmdb"
    subprocess.run(["cp", "-r", str(shard), str(damaged)], check=True)
    with Store.open(damaged, write=False) as s:  # a response body of the last exchange: the second worker's range
        last = s.exchange(s.last_id())
        assert last is not None and last.response is not None
        digest = bytes.fromhex(last.response["body"])
    env = lmdb.open(str(damaged), max_dbs=8)
    with env.begin(write=True) as txn:
        db = env.open_db(b"bodies", txn=txn)
        txn.put(digest, b"\x00" + b"not the recorded answer", db=db)
    env.close()
    out = tmp_path / "out.lmdb"
    r = run_merge(out, 2, damaged)
    assert r.returncode == 1 and "does not match its sha256" in r.stderr and "nothing was merged" in r.stderr
    assert f"exchange {last.id} " in r.stderr and "Traceback" not in r.stderr
    assert not (out / "data.mdb").exists()  # OUT was not even created


CLI = """
import sys
from noisefloor.proxy.store.merge import _copying as merge_copy
from noisefloor.proxy.cli import main
merge_copy.PARALLEL_FROM = 50
started = []
pool = merge_copy.pool
merge_copy.pool = lambda jobs, *init: started.append(jobs) or pool(jobs, *init)
try:
    main(["merge", *sys.argv[1:]], standalone_mode=False)
finally:
    print("pools", started, file=sys.stderr)
"""


def test_the_command_line_takes_the_workers_and_refuses_none(shard, tmp_path):
    """`nfproxy merge --jobs 2`: the merge runs with two workers and writes what one process writes."""
    out = subprocess.run([sys.executable, "-c", CLI, "--jobs", "2", str(tmp_path / "two.lmdb"), str(shard)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "pools [2, 2]" in out.stderr, out.stderr  # the check's and the copy's
    assert run_merge(tmp_path / "one.lmdb", 1, shard).returncode == 0
    assert contents(tmp_path / "two.lmdb") == contents(tmp_path / "one.lmdb")
    bad = subprocess.run([sys.executable, "-m", "noisefloor.proxy.cli", "merge", "--jobs", "0", str(tmp_path / "x"),
                          str(shard)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 64 and "--jobs" in bad.stderr and not (tmp_path / "x").exists(), bad.stderr


INTERRUPTED = """
import sys, time
from noisefloor.proxy.store.merge import _copying as merge_copy
from noisefloor.proxy.store.merge import run as merge
from noisefloor.proxy.cli import main
merge_copy.PARALLEL_FROM = 50
checked = merge._check_range

def slow(*args):  # the workers still checking when the interrupt comes
    time.sleep(float(sys.argv[1]))
    return checked(*args)

merge._check_range = slow
main(["merge", *sys.argv[2:]])
"""


def test_an_interrupt_stops_the_merge_and_its_workers_without_their_tracebacks(shard, tmp_path):
    """Ctrl-C (SIGINT to the process group) while the default two workers check: the merge says
    it was stopped, no worker prints a traceback, none is left running, OUT holds nothing."""
    import os
    import signal
    import time

    out = tmp_path / "out.lmdb"
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED, "20", str(out), str(shard)], stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_group(proc.pid)) < 3:  # the merge and its two workers
            time.sleep(0.05)
        assert len(_group(proc.pid)) >= 3
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    time.sleep(0.5)
    assert _group(proc.pid) == [], "a worker outlived the merge"
    assert not out.exists() or len(Store.open(out, write=False)) == 0


def _group(pgid: int) -> list[int]:
    """The live (not zombie) processes of a process group this test started."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
    return found
