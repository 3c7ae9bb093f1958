"""Time to first chunk and total time of a 200-event SSE stream: direct, through nfproxy while
recording, and replayed (at once and with the recorded gaps). Interleaved rounds, medians.

    python bench/stream_latency.py [--events 200] [--pause-ms 2] [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from noisefloor.proxy.launch import start as start_nfproxy  # noqa: E402
from tests.fake_upstream import FakeUpstream  # noqa: E402


def one_stream(url: str, body: dict) -> tuple[float, float, int]:
    with httpx.Client(timeout=60) as client:
        start = time.perf_counter()
        with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, r.read()[:300]
            first, size = None, 0
            for chunk in r.iter_raw():
                if first is None:
                    first = time.perf_counter() - start
                size += len(chunk)
        return first or 0.0, time.perf_counter() - start, size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--pause-ms", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "stream"}], "stream": True,
            "x_events": a.events, "x_pause_ms": a.pause_ms}
    tmp = Path(tempfile.mkdtemp(prefix="nfstream-"))
    up = FakeUpstream().start()
    procs = []
    try:
        rec = start_nfproxy("--mode", "record", "--store", str(tmp / "s.lmdb"), "--upstream", up.url, "-q")
        procs.append(rec)
        one_stream(rec.url, body)  # the recording that replay serves
        # the replay proxies read the store while the record proxy keeps writing to it (LMDB allows this)
        fast = start_nfproxy("--mode", "replay", "--store", str(tmp / "s.lmdb"), "--allow-reuse", "--no-strict", "-q")
        timed = start_nfproxy("--mode", "replay", "--store", str(tmp / "s.lmdb"), "--allow-reuse", "--no-strict",
                              "--replay-timing", "recorded", "-q")
        procs += [fast, timed]
        targets = {"direct": up.url, "nfproxy record": rec.url, "nfproxy replay (timing none)": fast.url,
                   "nfproxy replay (timing recorded)": timed.url}
        res: dict[str, list[tuple[float, float, int]]] = {k: [] for k in targets}
        for u in targets.values():
            one_stream(u, body)  # warm-up
        for _ in range(a.rounds):
            for k, u in targets.items():
                res[k].append(one_stream(u, body))
    finally:
        for p in procs:
            p.stop()
        up.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{a.events}-event SSE stream, upstream pause {a.pause_ms} ms between events, {a.rounds} interleaved rounds "
          "(medians, minimum in brackets)\n")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'path':<34}{'first chunk ms (min)':>22}{'total ms (min)':>16}{'bytes':>8}")
    for k, xs in res.items():
        print(f"{k:<34}{statistics.median(x[0] for x in xs) * 1000:>13.2f} ({min(x[0] for x in xs) * 1000:5.2f})"
              f"{statistics.median(x[1] for x in xs) * 1000:>8.1f} ({min(x[1] for x in xs) * 1000:5.1f}){xs[0][2]:>8}")


if __name__ == "__main__":
    main()
