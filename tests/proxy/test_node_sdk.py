"""The official openai Node SDK, unchanged, through the wrap form: a plain and a streamed chat
completion recorded, then strictly replayed with the upstream gone. Skipped where node or the npm
registry is not available (the SDK is installed into a temporary folder for this test only)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import nfproxy_argv

AGENT = """
const OpenAI = require("openai");
const client = new OpenAI({ maxRetries: 0 });  // OPENAI_BASE_URL and OPENAI_API_KEY from nfproxy's wrap
(async () => {
  const r = await client.chat.completions.create({ model: "gpt-4o-mini", messages: [{ role: "user", content: "hi" }] });
  const s = await client.chat.completions.create({ model: "gpt-4o-mini", stream: true,
                                                   messages: [{ role: "user", content: "stream please" }] });
  let text = "";
  for await (const chunk of s) text += (chunk.choices[0] && chunk.choices[0].delta.content) || "";
  console.log("NODE-AGENT " + JSON.stringify([r.choices[0].message.content, text]));
})().catch((e) => { console.error(String(e)); process.exit(5); });
"""


@pytest.fixture(scope="module")
def node_agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("node and npm are not installed")
    folder = tmp_path_factory.mktemp("node-agent")
    try:
        r = subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", "openai@4"], cwd=folder,
                           capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip("npm install openai timed out (no registry here)")
    if r.returncode != 0:
        pytest.skip(f"npm install openai failed: {r.stderr.strip()[-200:]}")
    agent = folder / "agent.js"
    agent.write_text(AGENT)
    return agent


def wrapped(*args: str, agent: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_API_KEY": "sk-test-node-0001"}
    return subprocess.run([*nfproxy_argv(), "run", "--listen", "127.0.0.1:0", *args, "--", "node", str(agent)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=agent.parent)


def answers(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("NODE-AGENT "))


def test_node_openai_sdk_records_and_replays_strictly(tmp_path, upstream, node_agent):
    store = tmp_path / "log.lmdb"
    rec = wrapped("--mode", "record", "--upstream", upstream.url, "--store", str(store), agent=node_agent)
    assert rec.returncode == 0, rec.stderr[-2000:]
    assert "0 errors" in rec.stderr  # the stream the SDK closed after [DONE] is complete
    upstream.stop()
    rep = wrapped("--mode", "replay", "--strict", "--store", str(store), agent=node_agent)
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert "2 hits, 0 misses" in rep.stderr
    assert answers(rep.stdout) == answers(rec.stdout) and "answer number 1" in answers(rec.stdout)
