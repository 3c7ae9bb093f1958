"""One body-size limit from record to every reader (--max-body-mb), with real processes: a real
nfproxy recording from a real aiohttp upstream whose answer is 1.5 MiB. Under --max-body-mb 1 the
recorder refuses to keep it (the client still gets it; the exchange is an error saying so, one
warning line), and strict replay answers that recorded error, never a "damaged" store. Under
--max-body-mb 2 it is kept, and every reader (show, export, nfview's exchange page and search,
strict replay) serves it with --max-body-mb 2 and, with a lower limit, says which limit to pass:
never "damaged". A failed export leaves no partial -o file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from noisefloor.proxy.store.log import Store
from tests import loopback
from tests.conftest import nfproxy_argv, start_nfproxy
from tests.fake_upstream import FakeUpstream

BIG = "0123456789abcdef" * (3 << 15)  # 1.5 MiB of answer text


def _ask(url: str, text: str):  # noqa: ANN202 (httpx's response)
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return loopback.post(url + "/v1/chat/completions", json=body, timeout=60)


def _nfproxy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*nfproxy_argv(), *args], capture_output=True, text=True, timeout=120)


def _record(store: Path, upstream: FakeUpstream, limit_mb: int) -> tuple[int, str]:
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url,
                        "--max-body-mb", str(limit_mb))
    try:
        got = _ask(rec.url, "big please")
        assert got.status_code == 200 and len(got.content) > len(BIG), got.text[:300]  # the client got it
        assert _ask(rec.url, "small").status_code == 200
    finally:
        code = rec.stop()
    return code, rec.output


@pytest.fixture(scope="module")
def upstream() -> FakeUpstream:
    server = FakeUpstream(responder=lambda doc, n: BIG if "big" in json.dumps(doc) else "small answer").start()
    yield server
    server.stop()


@pytest.mark.slow
def test_an_answer_over_the_limit_is_refused_with_a_note_and_replayed_as_that_error(tmp_path, upstream):
    store = tmp_path / "refused.lmdb"
    code, output = _record(store, upstream, 1)
    assert code == 0, output
    (warning,) = [line for line in output.splitlines() if "--max-body-mb" in line]
    assert "not recorded" in warning and "--max-body-mb 2" in warning, output
    with Store.open(store, write=False) as s:
        big, small = s.exchange(1), s.exchange(2)
        assert big.response is None and "over --max-body-mb 1" in big.error and small.response["status"] == 200
    rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store))
    try:
        answer = _ask(rep.url, "big please")
        assert answer.status_code != 200 and "--max-body-mb" in answer.text, answer.text
        assert "damaged" not in answer.text and "planted" not in answer.text
        assert _ask(rep.url, "small").status_code == 200
    finally:
        rep.stop()


@pytest.mark.slow
def test_an_answer_kept_under_a_higher_limit_is_served_or_named_by_every_reader(tmp_path, upstream):
    store = tmp_path / "kept.lmdb"
    code, output = _record(store, upstream, 2)
    assert code == 0 and "not recorded" not in output, output
    low = _nfproxy("show", "1", "--store", str(store), "--max-body-mb", "1")
    assert low.returncode == 5 and "over --max-body-mb 1; read it with --max-body-mb 2" in low.stderr, low.stderr
    assert "damaged" not in low.stderr and len(low.stderr.strip().splitlines()) == 1
    shown = _nfproxy("show", "1", "--store", str(store), "--max-body-mb", "2")
    assert shown.returncode == 0 and BIG[:64] in shown.stdout
    out = tmp_path / "x.jsonl"
    failed = _nfproxy("export", str(store), "--format", "jsonl", "-o", str(out), "--max-body-mb", "1")
    assert failed.returncode == 5 and "--max-body-mb 2" in failed.stderr and not out.exists(), failed.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.lmdb"]  # no temporary file left either
    assert _nfproxy("export", str(store), "--format", "jsonl", "-o", str(out), "--max-body-mb", "2").returncode == 0
    assert BIG[:64] in out.read_text()
    for limit, served in (("1", False), ("2", True)):
        page, found = _viewer(store, limit)
        body = page["response_body"]
        assert (body["kind"], body["size"] > len(BIG)) == (("json", True) if served else ("over_limit", True)), body
        assert served or "--max-body-mb 2" in body["text"]
        assert found == [1]  # search by text still answers, the big body searched where the limit allows it
        summary = _summary(store, limit)  # the front page: one big answer does not take it down
        assert summary["store"]["exchanges"] == 2, summary
        assert ("trajectories" in summary) if served else "--max-body-mb 2" in summary["trajectories_note"], summary
        rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store), "--max-body-mb", limit)
        try:
            answer = _ask(rep.url, "big please")
            if served:
                assert answer.status_code == 200 and BIG in answer.text
            else:
                assert answer.status_code >= 500 and "--max-body-mb 2" in answer.text, answer.text
                assert "damaged" not in answer.text and "planted" not in answer.text
        finally:
            rep.stop()


def _viewer(store: Path, limit: str) -> tuple[dict, list[int]]:
    """nfview's page of exchange 1 and the ids a search for text in the request finds."""
    proc = subprocess.Popen([sys.executable, "-m", "noisefloor.viewer.cli", str(store), "--listen", "127.0.0.1:0",
                             "--max-body-mb", limit], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("nfview: http"), line
        url = line.split()[1].rstrip("/")
        page = loopback.get(url + "/api/exchange/1")
        assert page.status_code == 200, page.text
        search = loopback.get(url + "/api/exchanges", params={"q": "big please"})
        assert search.status_code == 200, search.text
        answer = loopback.get(url + "/api/exchanges", params={"q": "0123456789abcdef"}).json()  # in the big answer
        # found where the limit lets it be read, else named as not searched (never a silent "no match")
        assert (answer["items"] != []) != (answer["unsearched"] == [1]), answer
        return page.json(), [x["id"] for x in search.json()["items"]]
    finally:
        proc.terminate()
        proc.wait(10)


def _summary(store: Path, limit: str) -> dict:
    """nfview's /api/summary (the report page) under --max-body-mb `limit`."""
    proc = subprocess.Popen([sys.executable, "-m", "noisefloor.viewer.cli", str(store), "--listen", "127.0.0.1:0",
                             "--max-body-mb", limit], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[1].rstrip("/")
        got = loopback.get(url + "/api/summary")
        assert got.status_code == 200, got.text
        return got.json()
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
def test_a_streamed_answer_over_the_limit_is_forwarded_whole_and_not_held(tmp_path):
    """A 48 MiB stream past --max-body-mb 1: the client gets every chunk, the recorder keeps none
    of them and does not hold them in memory either (the proxy's peak RSS stays far below the
    stream's size), and records the refusal, one warning line."""
    huge = "0123456789abcdef" * (3 << 20)
    server = FakeUpstream(responder=lambda doc, n: huge).start()
    store = tmp_path / "stream.lmdb"
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", server.url, "--max-body-mb", "1")
    try:
        body = {"model": "m", "stream": True, "x_events": 200, "x_pause_ms": 0,
                "messages": [{"role": "user", "content": "big please"}]}
        got = loopback.post(rec.url + "/v1/chat/completions", json=body, timeout=300)
        deltas = [json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                  for line in got.text.splitlines() if line.startswith("data: {")]
        assert got.status_code == 200 and "".join(deltas) == huge  # every chunk forwarded
        peak = next(int(line.split()[1]) for line in Path(f"/proc/{rec.proc.pid}/status").read_text().splitlines()
                    if line.startswith("VmHWM"))
        assert peak < 110 << 10, f"peak RSS {peak >> 10} MiB"  # ~60 MiB; holding the stream made it ~160
    finally:
        code = rec.stop()
        server.stop()
    assert code == 0, rec.output
    assert [line for line in rec.output.splitlines() if "over --max-body-mb 1" in line], rec.output
    with Store.open(store, write=False) as s:
        ex = s.exchange(1)
        assert ex.response is None and "over --max-body-mb 1: not recorded" in ex.error


@pytest.mark.slow
def test_compact_and_migrate_read_a_store_kept_under_a_higher_limit_with_the_flag_they_name(tmp_path, upstream):
    """The line that refuses a body over the limit names --max-body-mb: compact and migrate take it."""
    store = tmp_path / "kept.lmdb"
    code, output = _record(store, upstream, 2)
    assert code == 0, output
    before = (store / "data.mdb").read_bytes()
    for command in ("compact", "migrate"):
        low = _nfproxy(command, "--store", str(store), "--max-body-mb", "1")
        assert low.returncode != 0 and "read it with --max-body-mb 2" in low.stderr.strip().splitlines()[-1], low.stderr
        assert "Traceback" not in low.stderr and (store / "data.mdb").read_bytes() == before
    for command in ("compact", "migrate"):
        done = _nfproxy(command, "--store", str(store), "--max-body-mb", "2")
        assert done.returncode == 0, done.stderr
    shown = _nfproxy("show", "1", "--store", str(store), "--max-body-mb", "2")
    assert shown.returncode == 0 and BIG[:64] in shown.stdout
