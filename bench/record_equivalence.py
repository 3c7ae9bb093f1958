"""Record the same traffic through two builds' nfproxy and compare what each stored: `nfproxy log
--json` (times aside), the bodies table byte for byte, the replay index's lookups, entries and
sketches, the labels and routes tables, and the answers a replay of each gives.

    python bench/record_equivalence.py BASELINE_NFPROXY [THIS_NFPROXY]
    e.g. python bench/record_equivalence.py ../main/.venv/bin/nfproxy .venv/bin/nfproxy

Deterministic sequential traffic: conversations carrying their answers (dependencies, chained
bodies), repeated bodies, a key, a cookie the upstream echoes, a secret query parameter, a stream,
an error status. Both builds get the same ports, so keys and URLs agree.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fake_upstream import FakeUpstream  # noqa: E402

VOLATILE = {"time", "end", "latency_ms", "start"}
KEY = "sk-test-secret-value-123456"
TABLES = r"""
import hashlib, json, sys
from noisefloor.proxy.store.log import Store
s = Store.open(sys.argv[1], write=False)
names = ("lookups", "labels", "routes", "index_routes")
try:
    next(s.tables.rows("index_routes"), None)
except KeyError:  # a build before the replay index's layout 3
    names = names[:3]
t = {n: hashlib.sha256(b"".join(k + b"=" + v for k, v in s.tables.rows(n))).hexdigest() for n in names}
with s.tables.env.begin(db=s.tables.db["bodies"]) as txn:
    t["bodies"] = hashlib.sha256(b"".join(k + b"=" + bytes(v) for k, v in txn.cursor())).hexdigest()
t["entries"] = [(e.key, e.session, e.occurrence, e.seq, e.route, list(e.deps)) for e in s.index.entries()]
t["sketches"] = [g and g[1].hex() for g in s.index.stored_sketches(list(range(1, len(s) + 1)))]
print(json.dumps(t))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORTS: dict[str, int] = {}


def proxy(exe: str, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    port = PORTS.setdefault(args[1], free_port())
    p = subprocess.Popen([exe, "run", "-q", *args, "--listen", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            httpx.get(url + "/__probe__", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    return p, url


def chat(c: httpx.Client, url: str, messages: list[dict[str, str]], model: str = "gpt-4o-mini", query: str = "",
         **extra: Any) -> httpx.Response:
    return c.post(url + "/v1/chat/completions" + query, json={"model": model, "messages": messages, **extra},
                  headers=extra.pop("headers", None))


def traffic(url: str) -> list[bytes]:
    answers = []
    with httpx.Client(timeout=30, headers={"authorization": f"Bearer {KEY}"}) as c:
        for conv in range(4):
            msgs = [{"role": "user", "content": f"conversation {conv} " + "word " * 30}]
            for turn in range(4):
                r = c.post(url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": msgs},
                           headers={"x-nf-session": f"s{conv % 2}", "x-nf-task": f"t{conv}"})
                answers.append(r.content)
                msgs = [*msgs, {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                        {"role": "user", "content": f"go on {turn}"}]
        for i in range(10):  # the same bodies again
            answers.append(chat(c, url, [{"role": "user", "content": f"q {i % 3}"}]).content)
        answers.append(chat(c, url, [{"role": "user", "content": "stream please"}], stream=True).content)
        answers.append(chat(c, url, [{"role": "user", "content": "x"}], model="status-429").content)
        answers.append(chat(c, url, [{"role": "user", "content": f"echo {KEY}"}], query="?api_key=sk-query-987654").content)
    return answers


def norm(v: Any) -> Any:
    """A log line's values with its times starred (a stream's chunk offsets, the Date header)."""
    if isinstance(v, dict):
        return {k: "*" if k in VOLATILE else [["*", n] for _, n in x] if k == "chunks" else norm(x)
                for k, x in v.items()}
    if isinstance(v, list):
        if len(v) == 2 and isinstance(v[0], str) and v[0].lower() == "date":
            return [v[0], "*"]
        return [norm(x) for x in v]
    return v


def recorded(exe: str) -> dict[str, Any]:
    up = FakeUpstream(port=PORTS.setdefault("up", free_port())).start()
    store = Path(tempfile.mkdtemp()) / "s.lmdb"
    p, url = proxy(exe, "--mode", "record", "--store", str(store), "--upstream", up.url, "--session", "base")
    answers = traffic(url)
    p.terminate()
    p.wait(30)
    up.stop()
    log = subprocess.run([exe, "log", "--json", "--store", str(store)], capture_output=True, text=True, check=True)
    rp, rurl = proxy(exe, "--mode", "replay", "--store", str(store), "--session", "base")
    replayed = traffic(rurl)
    rp.terminate()
    rp.wait(30)
    tables = subprocess.run([str(Path(exe).with_name("python")), "-c", TABLES, str(store)], capture_output=True,
                            text=True, check=True, cwd=tempfile.gettempdir())
    return {"log": [norm(json.loads(line)) for line in log.stdout.splitlines()], "answers": answers,
            "replayed": replayed, "tables": json.loads(tables.stdout)}


def main() -> None:
    this = sys.argv[2] if len(sys.argv) > 2 else str(Path(sys.executable).with_name("nfproxy"))
    a, b = recorded(sys.argv[1]), recorded(this)
    print(f"{len(a['log'])} and {len(b['log'])} exchanges")
    print("nfproxy log --json identical but for times:", a["log"] == b["log"])
    print("recorded answers identical:", a["answers"] == b["answers"])
    print("replayed answers identical:", a["replayed"] == b["replayed"], "; equal to the recorded:",
          b["replayed"] == b["answers"])
    for k in sorted(set(a["tables"]) | set(b["tables"])):
        print(f"{k} identical:", a["tables"].get(k) == b["tables"].get(k))
    print("a secret in either log:", any(s in json.dumps(x["log"]) for x in (a, b) for s in (KEY, "cookie-secret")))
    for x, y in zip(a["log"], b["log"]):
        for k in x:
            if x[k] != y.get(k):
                print("differs:", k, json.dumps(x[k])[:300], json.dumps(y.get(k))[:300])


if __name__ == "__main__":
    main()
