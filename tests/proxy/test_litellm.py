"""litellm, unchanged, through nfproxy: plain, streamed and concurrent calls recorded, then strictly
replayed with the upstream stopped, giving the same texts."""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import start_nfproxy

# litellm runs in the agent process only: looked for, not imported (its import is ~4 CPU-s a worker)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("litellm") is None, reason="litellm is in the test extra")

# One agent process for both runs (litellm's import is most of the test's CPU): each line on its
# stdin names a proxy and a key; it answers with one JSON line of what litellm got back.
AGENT = r'''
import asyncio, json, sys
import litellm

async def many(kw):
    calls = [litellm.acompletion(messages=[{"role": "user", "content": f"parallel {i}"}], **kw) for i in range(4)]
    return [r.choices[0].message.content for r in await asyncio.gather(*calls)]

for line in sys.stdin:
    base, key = line.split()
    kw = dict(model="openai/gpt-4o-mini", api_base=base + "/v1", api_key=key, temperature=0)
    out = {"plain": litellm.completion(messages=[{"role": "user", "content": "one"}], **kw).choices[0].message.content}
    chunks = litellm.completion(messages=[{"role": "user", "content": "streamed"}], stream=True, **kw)
    out["stream"] = "".join(c.choices[0].delta.content or "" for c in chunks)
    out["parallel"] = asyncio.run(many(kw))
    print(json.dumps(out), flush=True)
'''


class Agent:
    """The litellm agent process; `ask` sends it one proxy and reads its answers (bounded in time)."""

    def __init__(self, tmp_path: Path) -> None:
        script = tmp_path / "agent.py"
        script.write_text(AGENT)
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the cost map
               "LITELLM_TELEMETRY": "False"}
        self.err = tmp_path / "agent.err"
        with self.err.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, text=True, env=env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # it exited

    def ask(self, url: str, key: str) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{url} {key}\n")
        self.proc.stdin.flush()
        try:
            line = self.lines.get(timeout=180)
        except queue.Empty:
            line = None
        assert line is not None, f"the litellm agent gave no answer: {self.err.read_text()[-3000:]}"
        return json.loads(line)

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, failed: object, *exc: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            code = self.proc.wait(60)
        finally:
            self.proc.kill()
        assert failed or code == 0, self.err.read_text()[-3000:]


def test_litellm_records_and_strictly_replays_plain_streamed_and_concurrent_calls(tmp_path, store, upstream, proxies):
    with Agent(tmp_path) as agent:  # importing litellm while the proxy starts
        rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
        proxies.append(rec)
        recorded = agent.ask(rec.url, "sk-litellm-record-0123456789")
        assert rec.stop() == 0 and "6 exchanges, 0 errors" in rec.output
        assert recorded["stream"] and len(set(recorded["parallel"])) == 4
        upstream.stop()
        rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store))
        proxies.append(rep)
        assert agent.ask(rep.url, "sk-litellm-rotated-987654321") == recorded
    assert rep.stop() == 0
    assert "6 hits, 0 misses, 0 order violations" in rep.output
    from noisefloor.proxy.store.log import Store

    with Store.open(store, write=False) as s:
        assert not any(b"sk-litellm" in body for body in s.bodies.all())
