"""Added latency and throughput of nfproxy on loopback, against a direct connection and against
mitmproxy's own mitmdump (plain reverse proxy, writing flows with -w, and --server-replay), all
measured in the same run (ratios, not absolute times). mitmdump runs with -q, so it does not
spend time printing flows. Run it with each line's interpreter (mitmproxy 11 on 3.11, 12 on 3.12+).

Besides latency, each proxy's CPU time per request is read from /proc: on a shared machine it
moves much less than wall-clock latency does, so it shows where a latency difference comes from.

    python bench/proxy_latency.py [--requests 1000] [--rounds 10] [--concurrency 8] [--only PATH,...]

Record against mitmproxy's own recording, side by side (`--only` keeps the paths named; a
concurrency of 0 skips the throughput runs; `--baseline REV` adds REV's record mode, unpacked from
git as bench/record_path.py does and run by the same interpreter, as one more interleaved path):

    python bench/proxy_latency.py --only "direct,mitmdump -w,nfproxy passthrough,nfproxy record" \\
        --baseline main --rounds 8 --requests 2400 --concurrency 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
sys.path.insert(0, str(ROOT / "bench"))

from noisefloor.proxy.launch import start as start_nfproxy  # noqa: E402
from tests.fake_upstream import FakeUpstream  # noqa: E402


def body(i: int) -> bytes:
    return json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"task {i} " + "x" * 400}],
                       "temperature": 0.7}).encode()


def sequential(url: str, n: int, first: int = 0) -> list[float]:
    """Latencies of `n` requests sent one after another, bodies `first` to `first + n - 1`."""
    lat = []
    with httpx.Client(timeout=30) as client:
        for i in range(first, first + n):
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


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_mitmdump(args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    # through this interpreter: a venv layered on another one has no mitmdump script of its own
    proc = subprocess.Popen([sys.executable, "-c", "from mitmproxy.tools.main import mitmdump; mitmdump()", "-q", "--listen-host", "127.0.0.1", "--listen-port", str(port), *args],
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


PATHS = ("direct", "mitmdump (reverse)", "mitmdump -w", "nfproxy passthrough", "nfproxy record", "nfproxy replay",
         "mitmdump --server-replay")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=600, help="sequential requests per path, split over rounds")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=8, help="0: no throughput runs")
    ap.add_argument("--only", default="", help="comma-separated paths to run (default: all)")
    ap.add_argument("--baseline", default="", help="a git revision whose record mode runs beside this one's")
    ap.add_argument("--distinct", action="store_true",
                    help="every request body new (default: each round sends the same bodies again, as a rerun does)")
    args = ap.parse_args()
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = only - set(PATHS)
    if unknown:
        ap.error(f"unknown path(s) {sorted(unknown)}; known: {', '.join(PATHS)}")
    wanted = only or set(PATHS)
    if args.distinct and wanted & {"nfproxy replay", "mitmdump --server-replay"}:
        ap.error("--distinct sends bodies no recording holds: leave the replay paths out (--only)")
    n, rounds, conc = args.requests, args.rounds, args.concurrency
    per_round = n // rounds
    tmp = Path(tempfile.mkdtemp(prefix="nfbench-"))
    up = FakeUpstream().start()
    stoppers: list = []
    try:
        targets: dict[str, str] = {"direct": up.url}
        pids: dict[str, int] = {}
        flows = tmp / "flows.mitm"
        if "nfproxy replay" in wanted:  # a recording to replay from: the same request bodies
            prep = start_nfproxy("--mode", "record", "--store", str(tmp / "replay.lmdb"), "--upstream", up.url, "-q")
            sequential(prep.url, per_round)
            prep.stop()
        if "mitmdump --server-replay" in wanted:  # the same, through mitmdump
            rec, url = run_mitmdump(["--mode", f"reverse:{up.url}", "-w", str(flows)])
            sequential(url, per_round)
            rec.terminate()
            rec.wait(20)
        if "mitmdump (reverse)" in wanted:
            plain, url = run_mitmdump(["--mode", f"reverse:{up.url}", "--set", "connection_strategy=lazy"])
            stoppers.append(lambda: (plain.terminate(), plain.wait(20)))
            targets["mitmdump (reverse)"], pids["mitmdump (reverse)"] = url, plain.pid
        if "mitmdump -w" in wanted:  # mitmproxy's own recording: every flow written to a file as it completes
            writer, url = run_mitmdump(["--mode", f"reverse:{up.url}", "-w", str(tmp / "written.mitm"), "--set",
                                        "connection_strategy=lazy"])
            stoppers.append(lambda: (writer.terminate(), writer.wait(20)))
            targets["mitmdump -w"], pids["mitmdump -w"] = url, writer.pid
        if args.baseline:
            from readers_scale import unpack

            env = {"PYTHONPATH": str(unpack(args.baseline, tmp / "baseline"))}
            p = start_nfproxy("--mode", "record", "--store", str(tmp / "baseline.lmdb"), "--upstream", up.url, "-q",
                              env=env)
            stoppers.append(p.stop)
            name = f"nfproxy record @{args.baseline}"
            targets[name], pids[name] = p.url, p.proc.pid
        for mode in ("passthrough", "record"):
            if f"nfproxy {mode}" in wanted:
                p = start_nfproxy("--mode", mode, "--store", str(tmp / f"{mode}.lmdb"), "--upstream", up.url, "-q")
                stoppers.append(p.stop)
                targets[f"nfproxy {mode}"], pids[f"nfproxy {mode}"] = p.url, p.proc.pid
        if "nfproxy replay" in wanted:
            # --allow-reuse: every round asks for the same bodies again, as server_replay_reuse allows;
            # --no-strict: concurrent clients interleave the recorded order
            p = start_nfproxy("--mode", "replay", "--store", str(tmp / "replay.lmdb"), "--allow-reuse", "--no-strict",
                              "-q")
            stoppers.append(p.stop)
            targets["nfproxy replay"], pids["nfproxy replay"] = p.url, p.proc.pid
        if "mitmdump --server-replay" in wanted:
            rep, url = run_mitmdump(["--mode", f"reverse:{up.url}", "--server-replay", str(flows), "--set",
                                     "server_replay_reuse=true", "--set", "server_replay_extra=kill", "--set",
                                     "connection_strategy=lazy"])
            stoppers.append(lambda: (rep.terminate(), rep.wait(20)))
            targets["mitmdump --server-replay"], pids["mitmdump --server-replay"] = url, rep.pid

        for u in targets.values():
            sequential(u, 20, first=10**6 if args.distinct else 0)  # warm-up (replay: recorded bodies)
        lat: dict[str, list[float]] = {k: [] for k in targets}
        round_p50: dict[str, list[float]] = {k: [] for k in targets}
        cpu: dict[str, float] = {k: 0.0 for k in pids}
        round_cpu: dict[str, list[float]] = {k: [] for k in pids}  # CPU ms per request, each round
        loads = [load()]
        order = list(targets)
        for r in range(rounds):  # interleaved, so machine noise hits every path alike
            for name in order[r % len(order):] + order[: r % len(order)]:
                before = cpu_seconds(pids[name]) if name in pids else 0.0
                xs = sequential(targets[name], per_round, first=r * per_round if args.distinct else 0)
                if name in pids:
                    used = cpu_seconds(pids[name]) - before
                    cpu[name] += used
                    round_cpu[name].append(used * 1000 / len(xs))
                lat[name] += xs
                round_p50[name].append(statistics.median(xs))
            loads.append(load())
        rps = {k: concurrent(u, per_round * 3, conc, per_round) for k, u in targets.items()} if conc else {}
    finally:
        for stop in stoppers:
            stop()
        up.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def ratios(a: str, b: str, per_round: dict[str, list[float]] = round_p50) -> list[float]:
        return sorted(x / y for x, y in zip(per_round[a], per_round[b]))

    def ratio(a: str, b: str) -> float:
        return statistics.median(ratios(a, b))

    def spread(a: str, b: str) -> str:
        rs = ratios(a, b)
        return f"{statistics.median(rs):.2f} (rounds {rs[0]:.2f}-{rs[-1]:.2f})"

    def cpu_spread(a: str, b: str) -> str:
        """The whole run's CPU per request of `a` over `b`, and the range of the rounds' ratios."""
        rs = ratios(a, b, round_cpu)
        return f"{cpu[a] / cpu[b]:.2f} (rounds {rs[0]:.2f}-{rs[-1]:.2f})"

    print(f"{len(lat['direct'])} sequential requests per path in {rounds} interleaved rounds; "
          f"{f'throughput at concurrency {conc}' if conc else 'no throughput runs'}; loopback, ~0.5 kB chat bodies, "
          + (f"all {n} distinct" if args.distinct else f"the same {per_round} each round"))
    print(f"load average (1, 5, 15 min) before each round and after the last: {'; '.join(loads)}\n")
    print(f"{'path':<28}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>9}{'p50 / direct':>14}{'CPU ms/req':>12}")
    for name in targets:
        xs = lat[name]
        cpu_ms = f"{cpu[name] * 1000 / len(xs):>12.2f}" if name in cpu else f"{'-':>12}"
        print(f"{name:<28}{statistics.median(xs):>9.2f}{pct(xs, 0.99):>9.2f}{rps.get(name, float('nan')):>9.0f}"
              f"{ratio(name, 'direct'):>14.2f}{cpu_ms}")
    print()
    comparisons = [  # (what, a, b, target)
        ("record p50 / passthrough p50", "nfproxy record", "nfproxy passthrough", " (target <= 1.15)"),
        ("replay p50 / mitmdump server-replay p50", "nfproxy replay", "mitmdump --server-replay", " (target <= 1.00)"),
        ("record p50 / mitmdump reverse-proxy p50", "nfproxy record", "mitmdump (reverse)", ""),
        ("record p50 / mitmdump -w p50", "nfproxy record", "mitmdump -w", ""),
    ]
    base = f"nfproxy record @{args.baseline}"
    if args.baseline:
        comparisons += [(f"record@{args.baseline} p50 / passthrough p50", base, "nfproxy passthrough", ""),
                        (f"record p50 / record@{args.baseline} p50", "nfproxy record", base, "")]
    for what, a, b, target in comparisons:
        if a in targets and b in targets:
            print(f"{what} = {spread(a, b)}{target}")
    cpu_comparisons = [
        ("record CPU / mitmdump -w CPU per request", "nfproxy record", "mitmdump -w", " (target <= 0.80)"),
        ("record CPU / passthrough CPU per request", "nfproxy record", "nfproxy passthrough", ""),
        ("passthrough CPU / mitmdump -w CPU per request", "nfproxy passthrough", "mitmdump -w", ""),
        ("replay CPU / mitmdump server-replay CPU per request", "nfproxy replay", "mitmdump --server-replay", ""),
    ]
    if args.baseline:
        cpu_comparisons += [(f"record@{args.baseline} CPU / mitmdump -w CPU per request", base, "mitmdump -w", ""),
                            (f"record CPU / record@{args.baseline} CPU per request", "nfproxy record", base, "")]
    for what, a, b, target in cpu_comparisons:
        if a in cpu and b in cpu:
            print(f"{what} = {cpu_spread(a, b)}{target}")
    import mitmproxy.version

    print(f"mitmproxy {mitmproxy.version.VERSION}, Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
