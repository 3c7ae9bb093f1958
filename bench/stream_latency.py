"""A streamed answer's first chunk and whole time: directly from the fake upstream, through a
recording nfproxy (with and without --record-timing) and replayed (at once, and with the recorded
gaps), side by side in interleaved rounds (the order rotating each round).

    python bench/stream_latency.py [--events 20] [--pause-ms 2] [--rounds 30] [--fresh] [--baseline NFPROXY]
                                   [--replay-only]

The fake upstream runs in its own process, as each proxy does, so no path shares the client's
interpreter. Each path has one client kept alive across its streams, as an SDK keeps its
connection pool (`--fresh`: a new connection per stream). Printed per path: first chunk and total
ms (median, minimum), the median's difference from direct, and the CPU time per stream of the
process that answered (the upstream for direct, the proxy for the others: /proc), with the load
average before and after. `--baseline NFPROXY`: one more path, the same stream replayed at once by
another nfproxy executable (another checkout's, e.g. before a change) from the recording with
offsets (which every version reads). `--replay-only`: only direct and replay at once (and the
baseline), so each proxy serves every other stream rather than one in five.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from noisefloor.proxy.launch import READY, READY_LINE_ENV  # noqa: E402
from noisefloor.proxy.launch import start as start_nfproxy  # noqa: E402

UPSTREAM = ("import sys; sys.path.insert(0, sys.argv[1]); from tests.fake_upstream import FakeUpstream; "
            "up = FakeUpstream().start(); print(up.url, flush=True); sys.stdin.read(); up.stop()")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_stream(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, float, int]:
    start = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, r.read()[:300]
        first, size = None, 0
        for chunk in r.iter_raw():
            if first is None:
                first = time.perf_counter() - start
            size += len(chunk)
    return first or 0.0, time.perf_counter() - start, size


class Baseline:
    """Another nfproxy executable's `run`, on a free port (its ready line read here)."""

    def __init__(self, exe: str, *args: str) -> None:
        self.proc = subprocess.Popen([exe, "run", "--listen", "127.0.0.1:0", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env={**os.environ, READY_LINE_ENV: "1"})
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        for line in self.proc.stdout:
            if line.startswith(READY):
                self.url = "http://" + line.split()[1]
                break
            assert time.monotonic() < deadline, "the baseline nfproxy did not start"
        else:
            raise SystemExit(f"the baseline nfproxy exited ({self.proc.wait()})")
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(30)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20)
    ap.add_argument("--pause-ms", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--fresh", action="store_true", help="a new connection for every stream")
    ap.add_argument("--baseline", metavar="NFPROXY", help="also replay with this nfproxy executable")
    ap.add_argument("--replay-only", action="store_true", help="only direct and replay at once (and the baseline)")
    a = ap.parse_args()
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "stream"}], "stream": True,
            "x_events": a.events, "x_pause_ms": a.pause_ms}
    tmp = Path(tempfile.mkdtemp(prefix="nfstream-"))
    up = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(ROOT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True)
    procs: list[Any] = []
    try:
        assert up.stdout is not None
        up_url = up.stdout.readline().strip()
        for store, timing in (("s.lmdb", ()), ("t.lmdb", ("--record-timing",))):  # the recordings replay serves
            first = start_nfproxy("--mode", "record", "--store", str(tmp / store), "--upstream", up_url, *timing, "-q")
            with httpx.Client(timeout=60) as c:
                one_stream(c, first.url, body)
            assert first.stop() == 0, first.output
        rec = start_nfproxy("--mode", "record", "--store", str(tmp / "r.lmdb"), "--upstream", up_url, "-q")
        timed_rec = start_nfproxy("--mode", "record", "--store", str(tmp / "rt.lmdb"), "--upstream", up_url,
                                  "--record-timing", "-q")
        fast = start_nfproxy("--mode", "replay", "--store", str(tmp / "s.lmdb"), "--allow-reuse", "-q")
        timed = start_nfproxy("--mode", "replay", "--store", str(tmp / "t.lmdb"), "--allow-reuse",
                              "--replay-timing", "recorded", "-q")
        procs += [rec, timed_rec, fast, timed]
        targets = {"direct": (up_url, up.pid), "nfproxy record": (rec.url, rec.proc.pid),
                   "nfproxy record --record-timing": (timed_rec.url, timed_rec.proc.pid),
                   "nfproxy replay (timing none)": (fast.url, fast.proc.pid),
                   "nfproxy replay (timing recorded)": (timed.url, timed.proc.pid)}
        if a.baseline:
            base = Baseline(a.baseline, "--mode", "replay", "--store", str(tmp / "t.lmdb"), "--allow-reuse", "-q")
            procs.append(base)
            targets["baseline replay (timing none)"] = (base.url, base.proc.pid)
        if a.replay_only:
            targets = {k: v for k, v in targets.items() if k == "direct" or "timing none" in k}
        clients = {k: httpx.Client(timeout=60) for k in targets}
        res: dict[str, list[tuple[float, float, int]]] = {k: [] for k in targets}
        cpu = dict.fromkeys(targets, 0.0)
        for k, (u, _) in targets.items():
            one_stream(clients[k], u, body)  # warm-up: each client's connection open
        load_before = load()
        names = list(targets)
        for i in range(a.rounds):
            for k in names[i % len(names):] + names[:i % len(names)]:
                u, pid = targets[k]
                if a.fresh:
                    clients[k].close()
                    clients[k] = httpx.Client(timeout=60)
                before = cpu_seconds(pid)
                res[k].append(one_stream(clients[k], u, body))
                cpu[k] += cpu_seconds(pid) - before
        load_after = load()
        for c in clients.values():
            c.close()
    finally:
        for p in procs:
            p.stop()
        if up.stdin is not None:
            up.stdin.close()
        up.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    how = "a new connection per stream" if a.fresh else "one kept-alive connection per path"
    print(f"{a.events}-event SSE stream, upstream pause {a.pause_ms} ms between events, {a.rounds} interleaved "
          f"rounds, {how}; ms: median (minimum); Python {sys.version.split()[0]}")
    print(f"load average before {load_before}, after {load_after}\n")
    print(f"{'path':<34}{'first chunk':>16}{'vs direct':>11}{'total':>16}{'CPU ms/stream':>15}{'bytes':>8}")
    direct_first = statistics.median(x[0] for x in res["direct"])
    for k, xs in res.items():
        first = statistics.median(x[0] for x in xs)
        print(f"{k:<34}{first * 1000:>8.2f} ({min(x[0] for x in xs) * 1000:5.2f})"
              f"{(first - direct_first) * 1000:>+11.2f}"
              f"{statistics.median(x[1] for x in xs) * 1000:>8.1f} ({min(x[1] for x in xs) * 1000:5.1f})"
              f"{cpu[k] * 1000 / len(xs):>15.2f}{xs[0][2]:>8}")


if __name__ == "__main__":
    main()
