"""new_episodes' front (proxy/record/episodes.py) between a real strict replay and a real recorder: what
the recording holds is answered from it, streams included, and only what is new goes upstream."""

from __future__ import annotations

import shutil

from noisefloor.proxy.record.episodes import Episodes
from noisefloor.proxy.store.log import Store
from tests import loopback
from tests.conftest import start_nfproxy

OLD = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "old"}], "stream": True}
NEW = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "new"}], "stream": True}


def test_recorded_streams_replay_and_new_requests_are_recorded(tmp_path, upstream, proxies):
    rec = start_nfproxy("--mode", "record", "--upstream", upstream.url, "--store", str(tmp_path / "a.lmdb"))
    recorded = loopback.post(rec.url + "/v1/chat/completions", json=OLD, timeout=20).text
    assert rec.stop() == 0
    shutil.copytree(tmp_path / "a.lmdb", tmp_path / "copy.lmdb")
    replay = start_nfproxy("--mode", "replay", "--strict", "--store", str(tmp_path / "copy.lmdb"))
    record = start_nfproxy("--mode", "record", "--upstream", upstream.url, "--store", str(tmp_path / "b.lmdb"))
    proxies += [replay, record]
    front = Episodes(replay.url, record.url)
    url = front.start()
    try:
        seen = len(upstream.requests)
        with loopback.client(base_url=url, timeout=20) as c:
            with c.stream("POST", "/v1/chat/completions", json=OLD) as r:
                assert r.headers["x-nf-replay"] == "hit" and r.headers.get("transfer-encoding") == "chunked"
                again = "".join(r.iter_text())
            fresh = c.post("/v1/chat/completions", json=NEW)
        assert again == recorded and len(upstream.requests) == seen + 1  # only the new request went upstream
        assert fresh.status_code == 200 and "[DONE]" in fresh.text and "x-nf-replay" not in fresh.headers
        assert (front.replayed, front.recorded) == (1, 1)
    finally:
        front.stop()
    assert record.stop() == 0
    with Store.open(tmp_path / "b.lmdb", write=False) as b:
        (ex,) = list(b.exchanges())
        assert ex.mode == "record" and b"new" in b.bodies.get(ex.request["body"]) and ex.response["chunks"]
