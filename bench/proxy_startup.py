"""nfproxy's start-up CPU: seconds of CPU (user + system) from exec to the ready line, record and
replay, median of N starts, with a fresh CA folder each start (a new store's first run) and with
the CA already there.

The suite and nfladder start hundreds of proxies, so this cost is paid many times; CPU, not wall,
is what a loaded machine cannot hide. Run: `python bench/proxy_startup.py [--starts 10]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import urllib.request
from pathlib import Path

from noisefloor.proxy.launch import start

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU of a running process, from /proc (whole clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def one(args: list[str]) -> float:
    """CPU seconds of one proxy at its ready line; the proxy is then stopped."""
    p = start(*args)
    try:
        return cpu_s(p.proc.pid)
    finally:
        p.stop()


def recorded_store(where: Path) -> Path:
    """A one-exchange store (an upstream that refuses: the error is what gets recorded)."""
    store = where / "seed.lmdb"
    p = start("--mode", "record", "--store", str(store), "--upstream", "http://127.0.0.1:9")
    try:
        req = urllib.request.Request(p.url + "/v1/chat/completions", data=b'{"model": "m"}', method="POST",
                                     headers={"content-type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=30)
        except urllib.error.HTTPError:
            pass  # the recorded 502
    finally:
        p.stop()
    return store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=10)
    n = ap.parse_args().starts
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        seed = recorded_store(root)
        shared = ["--confdir", str(root / "ca")]
        runs = {
            "record, fresh CA": lambda i: ["--mode", "record", "--store", str(root / f"r{i}" / "log.lmdb"),
                                           "--upstream", "http://127.0.0.1:9"],
            "record, CA present": lambda i: ["--mode", "record", "--store", str(root / f"s{i}" / "log.lmdb"),
                                             "--upstream", "http://127.0.0.1:9", *shared],
            "replay, CA present": lambda i: ["--mode", "replay", "--store", str(seed), *shared],
        }
        for name, argv in runs.items():
            got = sorted(one(argv(i)) for i in range(n))
            print(f"{name:20s} median {statistics.median(got):.2f} CPU-s  (min {got[0]:.2f}, max {got[-1]:.2f}, "
                  f"n={n})")
    print(f"load average: {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
