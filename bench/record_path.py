"""The recorder's CPU per exchange before the answer is released (`Recorder.finish`: the record
written, its head with it), while the upstream works (`Recorder.begin`) and after the answer is
released (`after`: a proxy's deferred dependency marks, where the revision defers them), this checkout against
another revision (`--baseline`, unpacked as bench/readers_scale.py does), each in its own process
on a fresh store, interleaved round by round so that both see the same load.

    python bench/record_path.py --baseline main --exchanges 3000 --rounds 5 [--json out.json]
    python bench/record_path.py --baseline main --exchanges 3000 --rounds 5 --traffic latency

`--traffic latency`: bench/proxy_latency.py's traffic instead of 50 sessions of new bodies: one
session, the same 300 bodies sent again and again, an httpx client's headers with the cookie the
fake upstream sets (and sets again in every answer), its answers ("answer number N").

What this measures is the CPU the head adds to the record path (this - baseline, per exchange),
next to the cost of writing the head from the record's text (the way import and compact do).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from readers_scale import unpack  # noqa: E402 - a sibling script

_PREAMBLE = r'''
import json, sys, tempfile, time
from pathlib import Path
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.store.log import Store
from noisefloor.proxy.request.traffic import RequestData, ResponseData

n = int(sys.argv[1])
'''

# the timed part, after a traffic's request(i), response(i), label(i) and WARM (exchanges recorded first)
_TIMED = r'''
with tempfile.TemporaryDirectory() as d, Store.open(Path(d) / "s.lmdb", write=True, create=True) as s:
    rec = Recorder(s, Rules())
    work = [(request(i), response(i), label(i)) for i in range(n + WARM)]
    # a revision whose proxy registers an answer's dependency marks after releasing it: timed apart
    defer = {"defer_tracking": True} if hasattr(rec, "track_answers") else {}
    for req, resp, lab in work[:WARM]:  # warm: dictionaries trained, caches filled
        rec.finish(rec.begin(req, lab), resp, **defer)
        if defer:
            rec.track_answers()
    begin = finish = after = 0.0
    for req, resp, lab in work[WARM:]:
        t0 = time.process_time()
        p = rec.begin(req, lab)
        t1 = time.process_time()
        rec.finish(p, resp, **defer)
        t2 = time.process_time()
        if defer:
            rec.track_answers()
        t3 = time.process_time()
        begin += t1 - t0
        finish += t2 - t1
        after += t3 - t2
    print(json.dumps({"begin_us": begin / n * 1e6, "finish_us": finish / n * 1e6, "after_us": after / n * 1e6}))
'''

# 50 labelled sessions, distinct bodies
WORKER = _PREAMBLE + r'''
WARM = 200
def request(i):
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"question {i} " * 20}]})
    return RequestData("POST", "http://127.0.0.1:9/v1/chat/completions", "127.0.0.1", "/v1/chat/completions",
                       (("content-type", "application/json"),), body.encode())
def response(i):
    doc = {"id": f"c-{i}", "object": "chat.completion", "model": "gpt-4o-mini-2024-07-18",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": f"answer {i} " * 30},
                        "finish_reason": "stop"}], "usage": {"prompt_tokens": 50, "completion_tokens": 60}}
    return ResponseData(200, (("content-type", "application/json"),), json.dumps(doc).encode())
LABELS = [Labels(f"session-{k}", task=f"task-{k % 20}", replicate=str(k % 3), condition=f"c{k % 2}") for k in range(50)]
def label(i):
    return LABELS[i % 50]
''' + _TIMED

# proxy_latency's traffic: one session, 300 bodies asked again and again, an httpx client's headers
LATENCY_TRAFFIC = _PREAMBLE + r'''
WARM = 300
def request(i):
    b = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"task {i % 300} " + "x" * 400}],
                    "temperature": 0.7}).encode()
    return RequestData("POST", "http://127.0.0.1:9/v1/chat/completions", "127.0.0.1", "/v1/chat/completions",
                       (("host", "127.0.0.1:9"), ("accept", "*/*"), ("accept-encoding", "gzip, deflate"),
                        ("connection", "keep-alive"), ("user-agent", "python-httpx/0.27.0"),
                        ("content-type", "application/json"), ("content-length", str(len(b))),
                        ("cookie", "upstream-session=cookie-secret")), b, arrived=1.7e9 + i)
def response(i):
    b = json.dumps({"id": f"chatcmpl-{i}", "object": "chat.completion", "created": 1700000000 + i,
                    "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": f"fp_{i % 3}",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": f"answer number {i}"},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10 + i, "completion_tokens": i, "total_tokens": 10 + 2 * i}}).encode()
    return ResponseData(200, (("content-type", "application/json"), ("set-cookie", "upstream-session=cookie-secret"),
                              ("content-length", str(len(b))), ("date", "Thu, 03 Dec 2026 19:00:00 GMT"),
                              ("server", "Python/3.11 aiohttp/3.9")), b)
def label(i):
    return Labels("default")
''' + _TIMED

HEAD_COST = r'''
import json, sys, time
from noisefloor.proxy.store import exchange as exchange_record
from noisefloor.proxy.store import heads as store_heads
from noisefloor.proxy.store.exchange import Head
n = 20000
text = json.dumps({"id": 7, "version": 1, "time": 1.7e9, "mode": "record", "session": "session-1", "task": "t",
                   "replicate": "0", "condition": "c0", "key": "ab" * 32, "occurrence": 0, "seq": 3, "rules_id": "r",
                   "request": {"method": "POST", "url": "http://127.0.0.1:9/v1/chat/completions", "headers": [["a", "b"]] * 6,
                               "body": "cd" * 32, "body_size": 900}, "overrides": None, "perturbation": None,
                   "notes": [], "end": 1.7e9, "latency_ms": 12.5, "error": None,
                   "response": {"status": 200, "headers": [["c", "d"]] * 8, "body": "ef" * 32, "body_size": 1200},
                   "model": "m", "fingerprint": None, "usage": {"input": 5, "output": 3}, "finish_reason": "stop",
                   "truncated": False}).encode()
stored = text * 2
head, left = exchange_record.checked_head(text)
t0 = time.process_time()
for _ in range(n):
    store_heads.row(*exchange_record.checked_head(text), stored)
t1 = time.process_time()
for _ in range(n):
    store_heads.row(Head(0, 1.7e9, "ab" * 32, 0, 200, {"input": 5, "output": 3}, False, None, [], "record",
                         "session-1", "POST", "http://127.0.0.1:9/v1/chat/completions", "t", "0", "c0", "m", None,
                         None), left, stored)
t2 = time.process_time()
print(json.dumps({"head_from_text_us": (t1 - t0) / n * 1e6, "head_from_values_us": (t2 - t1) / n * 1e6}))
'''


def run(code: str, pythonpath: str | None, *args: str) -> dict[str, float]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=1200,
                         cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default="main")
    ap.add_argument("--exchanges", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--traffic", choices=("sessions", "latency"), default="sessions")
    args = ap.parse_args()
    worker = LATENCY_TRAFFIC if args.traffic == "latency" else WORKER
    with tempfile.TemporaryDirectory() as tmp:
        base = str(unpack(args.baseline, Path(tmp) / "base"))
        runs: dict[str, list[dict[str, float]]] = {"baseline": [], "this": []}
        for r in range(args.rounds):
            for name, path in (("baseline", base), ("this", None)) if r % 2 == 0 else (("this", None), ("baseline", base)):
                runs[name].append(run(worker, path, str(args.exchanges)))
                print(name, runs[name][-1], flush=True)
    doc: dict[str, object] = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in runs.items()}
    doc["added_finish_us"] = doc["this"]["finish_us"] - doc["baseline"]["finish_us"]  # type: ignore[index]
    doc["added_begin_us"] = doc["this"]["begin_us"] - doc["baseline"]["begin_us"]  # type: ignore[index]
    doc["head"] = run(HEAD_COST, None)
    doc["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    print(json.dumps(doc, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"summary": doc, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
