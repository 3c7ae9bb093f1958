"""Added latency and throughput of nfproxy on loopback, against a direct connection and against
mitmproxy's own --server-replay, all measured in the same run (ratios, not absolute times).

    python bench/proxy_latency.py [--requests 400] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import start_nfproxy  # noqa: E402
from tests.fake_upstream import FakeUpstream  # noqa: E402


def body(i: int) -> bytes:
    return json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"task {i} " + "x" * 400}],
                       "temperature": 0.7}).encode()


def sequential(url: str, n: int) -> list[float]:
    lat = []
    with httpx.Client(timeout=30) as client:
        for i in range(n):
            t = time.perf_counter()
            r = client.post(url + "/v1/chat/completions", content=body(i), headers={"content-type": "application/json"})
            lat.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200, (r.status_code, r.text[:300])
    return lat


def concurrent(url: str, n: int, conc: int, distinct: int) -> float:
    async def main() -> float:
        sem = asyncio.Semaphore(conc)
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=conc)) as client:
            async def one(i: int) -> None:
                async with sem:
                    r = await client.post(url + "/v1/chat/completions", content=body(i % distinct),
                                          headers={"content-type": "application/json"})
                    assert r.status_code == 200, r.text[:300]
            t = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(n)))
            return n / (time.perf_counter() - t)
    return asyncio.run(main())


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_mitmdump(args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    exe = Path(sys.executable).with_name("mitmdump")
    port = free_port()
    proc = subprocess.Popen([str(exe), "--listen-host", "127.0.0.1", "--listen-port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/__probe__", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    return proc, url


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=600, help="sequential requests per path, split over rounds")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    n, rounds, conc = args.requests, args.rounds, args.concurrency
    per_round = n // rounds
    tmp = Path(tempfile.mkdtemp(prefix="nfbench-"))
    up = FakeUpstream().start()
    stoppers: list = []
    try:
        # recordings to replay from: the same request bodies, once through nfproxy, once through mitmdump
        prep = start_nfproxy("--mode", "record", "--store", str(tmp / "replay.lmdb"), "--upstream", up.url, "-q")
        sequential(prep.url, per_round)
        prep.stop()
        flows = tmp / "flows.mitm"
        rec, url = run_mitmdump(["--mode", f"reverse:{up.url}", "-w", str(flows)])
        sequential(url, per_round)
        rec.terminate()
        rec.wait(20)

        targets: dict[str, str] = {"direct": up.url}
        for mode in ("passthrough", "record"):
            p = start_nfproxy("--mode", mode, "--store", str(tmp / f"{mode}.lmdb"), "--upstream", up.url, "-q")
            stoppers.append(p.stop)
            targets[f"nfproxy {mode}"] = p.url
        # --allow-reuse: every round asks for the same bodies again, as server_replay_reuse allows;
        # --no-strict: concurrent clients interleave the recorded order
        p = start_nfproxy("--mode", "replay", "--store", str(tmp / "replay.lmdb"), "--allow-reuse", "--no-strict", "-q")
        stoppers.append(p.stop)
        targets["nfproxy replay"] = p.url
        rep, url = run_mitmdump(["--mode", f"reverse:{up.url}", "--server-replay", str(flows), "--set",
                                 "server_replay_reuse=true", "--set", "server_replay_extra=kill", "--set",
                                 "connection_strategy=lazy"])
        stoppers.append(lambda: (rep.terminate(), rep.wait(20)))
        targets["mitmproxy --server-replay"] = url

        for u in targets.values():
            sequential(u, 20)  # warm-up
        lat: dict[str, list[float]] = {k: [] for k in targets}
        round_p50: dict[str, list[float]] = {k: [] for k in targets}
        order = list(targets)
        for r in range(rounds):  # interleaved, so machine noise hits every path alike
            for name in order[r % len(order):] + order[: r % len(order)]:
                xs = sequential(targets[name], per_round)
                lat[name] += xs
                round_p50[name].append(statistics.median(xs))
        rps = {k: concurrent(u, per_round * 3, conc, per_round) for k, u in targets.items()}
    finally:
        for stop in stoppers:
            stop()
        up.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(round_p50[a], round_p50[b]))

    print(f"{len(lat['direct'])} sequential requests per path in {rounds} interleaved rounds; throughput at "
          f"concurrency {conc}; loopback, {per_round} distinct ~0.5 kB chat bodies\n")
    print(f"{'path':<28}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>9}{'p50 / direct':>14}")
    for name in targets:
        xs = lat[name]
        print(f"{name:<28}{statistics.median(xs):>9.2f}{pct(xs, 0.99):>9.2f}{rps[name]:>9.0f}"
              f"{ratio(name, 'direct'):>14.2f}")
    print(f"\nrecord p50 / passthrough p50 = {ratio('nfproxy record', 'nfproxy passthrough'):.2f} (target <= 1.15)")
    print(f"replay p50 / mitmproxy server-replay p50 = {ratio('nfproxy replay', 'mitmproxy --server-replay'):.2f} "
          "(target <= 1.00)")


if __name__ == "__main__":
    main()
