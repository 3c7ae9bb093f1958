"""Helpers the store's tests share: running nfproxy on a store, reading its tables raw, and a
recorded multi-turn conversation whose bodies must all read back."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import lmdb
import msgspec

from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.request.traffic import RequestData, ResponseData
from noisefloor.proxy.store.log import Store
from tests.conftest import nfproxy_argv

SYSTEM = "You are a careful assistant who answers with one short paragraph and a code block. " * 8


def conversation(rec: Recorder, session: str, turns: int, seed: int) -> list[tuple[bytes, bytes]]:
    """A multi-turn chat: each request carries every earlier turn, as chat APIs want."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"task {seed}: sum a list"}]
    out = []
    for t in range(turns):
        body = json.dumps({"model": "m", "messages": messages}).encode()
        text = f"answer {seed}.{t}: " + " ".join(f"word{(seed * 31 + t * 7 + i) % 97}" for i in range(60))
        answer = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
        p = rec.begin(RequestData("POST", "http://up/v1/chat/completions", "up", "/v1/chat/completions", (), body),
                      Labels(session))
        rec.finish(p, ResponseData(200, (("content-type", "application/json"),), answer))
        out.append((body, answer))
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"now turn {t + 1}"}]
    return out


def all_bodies_read_back(path: Path, expected: list[tuple[bytes, bytes]]) -> None:
    with Store.open(path, write=False) as s:
        got = {}
        for ex in s.exchanges():
            got[ex.request["body"]] = s.bodies.of_part(ex.request, ex.id, "request")
            got[ex.response["body"]] = s.bodies.of_part(ex.response, ex.id, "response")
        assert sorted(got.values()) == sorted({b for pair in expected for b in pair})


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def listings(store: Path) -> tuple[str, str]:
    plain, as_json = run([*nfproxy_argv(), "log", "--store", str(store)]), \
        run([*nfproxy_argv(), "log", "--json", "--store", str(store)])
    assert plain.returncode == as_json.returncode == 0, plain.stderr + as_json.stderr
    return plain.stdout.replace(str(store), "STORE"), as_json.stdout


def printed(store: Path) -> tuple[str, list[object]]:
    """`listings` with `log --json`'s lines as the objects they print (a noisefloor-log/5 record is
    stored without its head's fields, and printed with them put back: the same object, in
    another key order and spacing than a /4 record's text passed through)."""
    plain, as_json = listings(store)
    return plain, [msgspec.json.decode(line) for line in as_json.splitlines()]


def table_bytes(store: Path, name: str) -> int:
    env = lmdb.open(str(store), readonly=True, lock=False, max_dbs=16)
    try:
        with env.begin() as txn:
            st = txn.stat(env.open_db(name.encode(), txn=txn, create=False))
            return (st["leaf_pages"] + st["branch_pages"] + st["overflow_pages"]) * st["psize"]
    finally:
        env.close()


def nfproxy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*nfproxy_argv(), *args], capture_output=True, text=True, timeout=120)



def fixture_copy(tmp_path: Path, fixture: str, name: str = "old.lmdb") -> Path:
    """A store of tests/data copied into `tmp_path` (its lock file left behind), to change freely."""
    import shutil

    from tests.conftest import DATA

    store = tmp_path / name
    shutil.copytree(DATA / fixture, store, ignore=shutil.ignore_patterns("lock.mdb"))
    return store


def killed_after_first_batch(argv: list[str]) -> None:
    """Run a merge (`argv`) and SIGKILL it once it says its first batch is committed."""
    import signal
    import time

    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if "exchanges merged" in line or not line:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
