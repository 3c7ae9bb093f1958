"""Replay start-up, hit and miss latency against store size, through the LMDB lookup rows.

Stores are written through the real recorder: sessions of four-turn conversations (each turn
carries the earlier answers), a 0.8 kB system prompt, ~0.4 kB answers (~2.5 kB requests). A miss is a recorded request
with one word of its last user message changed (CPU times are reported beside wall-clock ones:
on a shared machine they move much less); "found" says how often the nearest recorded
request named in the miss answer is the one that was changed. Each measurement runs in a fresh
process, so its peak RSS is its own.

    python bench/replay_miss.py [--sizes 10000,100000] [--queries 200]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TURNS = 4
SYSTEM = " ".join(f"Rule {i}: answer carefully, cite the source, and keep the tone plain." for i in range(12))
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar".split()


def turn_text(session: int, turn: int, changed: bool = False) -> str:
    rng = random.Random(session * 1000 + turn)
    words = [rng.choice(WORDS) for _ in range(24)]
    if changed:
        words[7] = "zulu"
    return f"Session {session} turn {turn}: " + " ".join(words)


def answer_text(session: int, turn: int) -> str:
    rng = random.Random(-(session * 1000 + turn))
    return " ".join(rng.choice(WORDS) for _ in range(60))


def messages(session: int, turn: int, changed: bool = False) -> list[dict[str, str]]:
    out = [{"role": "system", "content": SYSTEM}]
    for t in range(turn):
        out += [{"role": "user", "content": turn_text(session, t)}, {"role": "assistant", "content": answer_text(session, t)}]
    return out + [{"role": "user", "content": turn_text(session, turn, changed)}]


def chat(session: int, turn: int, changed: bool = False):  # noqa: ANN201
    from noisefloor.proxy.request.traffic import RequestData

    body = json.dumps({"model": "gpt-4o-mini", "messages": messages(session, turn, changed)}).encode()
    return RequestData("POST", "http://127.0.0.1:9/v1/chat/completions", "127.0.0.1", "/v1/chat/completions",
                       (("content-type", "application/json"),), body)


def build(path: Path, n: int) -> float:
    from noisefloor.proxy.record.recorder import Recorder
    from noisefloor.proxy.request.keys import Rules
    from noisefloor.proxy.request.labels import Labels
    from noisefloor.proxy.request.traffic import ResponseData
    from noisefloor.proxy.store.log import Store

    t = time.process_time()
    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        for i in range(n):
            session, turn = divmod(i, TURNS)
            doc = {"id": f"c{i}", "object": "chat.completion", "model": "gpt-4o-mini-2024-07-18",
                   "choices": [{"index": 0, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": answer_text(session, turn)}}],
                   "usage": {"prompt_tokens": 900, "completion_tokens": 200, "total_tokens": 1100}}
            resp = ResponseData(200, (("content-type", "application/json"),), json.dumps(doc).encode())
            rec.finish(rec.begin(chat(session, turn), Labels(f"s{session}")), resp)
    return time.process_time() - t


def _rss_mb() -> float:
    """Resident memory now (ru_maxrss would carry the forking parent's peak across exec)."""
    with open("/proc/self/status") as fh:
        return round(next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024, 1)


def measure(path: Path, n: int, queries: int) -> dict[str, float]:
    from noisefloor.proxy.replay.replayer import Replayer
    from noisefloor.proxy.request.keys import Rules
    from noisefloor.proxy.request.labels import Labels
    from noisefloor.proxy.store.log import Store

    rss0 = _rss_mb()
    with Store.open(path, write=False) as s:
        t = time.perf_counter()
        rep = Replayer(s, Rules(), log=lambda build: None)
        start = time.perf_counter() - t
        rss = _rss_mb()
        rng = random.Random(7)
        picks = [divmod(rng.randrange(n), TURNS) for _ in range(queries)]
        hits, misses, found = [], [], 0
        cpu_hits = cpu_misses = 0.0
        for q, (session, turn) in enumerate(picks):
            req = chat(session, turn)
            t, c = time.perf_counter(), time.process_time()
            a = rep.answer(req, Labels(f"h{q}", replay_from=f"s{session}") if turn == 0 else Labels(f"h{q}"))
            hits.append(time.perf_counter() - t)
            cpu_hits += time.process_time() - c
            assert a.result in ("hit", "order_violation"), a.result
        for q, (session, turn) in enumerate(picks):
            req = chat(session, turn, changed=True)
            t, c = time.perf_counter(), time.process_time()
            a = rep.answer(req, Labels(f"m{q}"))
            misses.append(time.perf_counter() - t)
            cpu_misses += time.process_time() - c
            assert a.result == "miss"
            near = json.loads(a.response.raw_body)["error"]["nearest"]
            found += near is not None and near["exchange_id"] == session * TURNS + turn + 1
    queries = len(picks)
    ms = lambda xs, p: round(sorted(xs)[int(p * (len(xs) - 1))] * 1000, 3)  # noqa: E731
    return {"start_s": round(start, 3), "rss_mb": rss, "rss_before_mb": rss0,
            "hit_p50_ms": ms(hits, 0.5), "miss_p50_ms": ms(misses, 0.5), "miss_p95_ms": ms(misses, 0.95),
            "found": round(found / queries, 3), "hit_cpu_ms": round(cpu_hits / queries * 1000, 3),
            "miss_cpu_ms": round(cpu_misses / queries * 1000, 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        path, n = args.child
        print(json.dumps(measure(Path(path), int(n), args.queries)))
        return
    for n in (int(x) for x in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="nf-replay-miss-") as tmp:
            path = Path(tmp) / "log.lmdb"
            took = build(path, n)
            size = (path / "data.mdb").stat().st_size >> 20
            print(f"{n} exchanges: recorded in {took:.1f} CPU s ({n / took:.0f}/CPU s), file {size} MB", flush=True)
            out = subprocess.run([sys.executable, __file__, "--queries", str(args.queries), "--child", str(path),
                                  str(n)], capture_output=True, text=True, check=True)
            print(f"  {out.stdout.strip()}", flush=True)


if __name__ == "__main__":
    main()
