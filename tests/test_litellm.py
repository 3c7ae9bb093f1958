"""litellm, unchanged, through nfproxy: plain, streamed and concurrent calls recorded, then strictly
replayed with the upstream stopped, giving the same texts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import start_nfproxy

pytest.importorskip("litellm", reason="litellm is in the test extra")

AGENT = r'''
import asyncio, json, os, sys
import litellm

base = sys.argv[1]
kw = dict(model="openai/gpt-4o-mini", api_base=base + "/v1", api_key=os.environ["KEY"], temperature=0)
out = {"plain": litellm.completion(messages=[{"role": "user", "content": "one"}], **kw).choices[0].message.content}
chunks = litellm.completion(messages=[{"role": "user", "content": "streamed"}], stream=True, **kw)
out["stream"] = "".join(c.choices[0].delta.content or "" for c in chunks)

async def many():
    calls = [litellm.acompletion(messages=[{"role": "user", "content": f"parallel {i}"}], **kw) for i in range(4)]
    return [r.choices[0].message.content for r in await asyncio.gather(*calls)]

out["parallel"] = asyncio.run(many())
print(json.dumps(out))
'''


def run_agent(url: str, key: str, tmp_path) -> dict:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    env = {**os.environ, "KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the cost map
           "LITELLM_TELEMETRY": "False"}
    r = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_litellm_records_and_strictly_replays_plain_streamed_and_concurrent_calls(tmp_path, store, upstream, proxies):
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(rec)
    recorded = run_agent(rec.url, "sk-litellm-record-0123456789", tmp_path)
    assert rec.stop() == 0 and "6 exchanges, 0 errors" in rec.output
    assert recorded["stream"] and len(set(recorded["parallel"])) == 4
    upstream.stop()
    rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store))
    proxies.append(rep)
    assert run_agent(rep.url, "sk-litellm-rotated-987654321", tmp_path) == recorded
    assert rep.stop() == 0
    assert "6 hits, 0 misses, 0 order violations" in rep.output
    from noisefloor.proxy.store import Store

    with Store.open(store, write=False) as s:
        assert not any(b"sk-litellm" in body for body in s.bodies())
