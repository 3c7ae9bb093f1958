"""CPU work per request of each proxy path, counted in instructions by valgrind's callgrind.

Latency on a shared machine moves by tens of percent between runs; instruction counts do not
(the same binary, inputs and environment give the same count whatever else runs). This counts
the instructions each proxy process executes while serving N sequential requests, after a
warm-up, with instrumentation switched on only for that window. It complements
`proxy_latency.py` (which measures what the issue's targets are stated in) with a figure that
repeats.

    python bench/proxy_instructions.py [--requests 200]

Needs valgrind (Debian: valgrind). Each path takes about a minute: everything runs ~50x slower
under callgrind.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from proxy_latency import free_port, run_mitmdump, sequential  # noqa: E402

from noisefloor.proxy.launch import start as start_nfproxy  # noqa: E402
from tests.fake_upstream import FakeUpstream  # noqa: E402


def count(argv: list[str], port: int, warmup: int, n: int, out: Path) -> int:
    """Instructions the process started by `argv` (listening on `port`) spends on `n` requests."""
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                             *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                httpx.get(url + "/__probe__", timeout=10)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{argv[0]} did not start under valgrind") from None
                time.sleep(1)
        sequential(url, warmup)
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
        sequential(url, n)
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
    finally:
        proc.terminate()
        proc.wait(300)
    totals = re.search(r"^totals:\s+(\d+)", out.read_text(errors="replace"), re.M)
    if totals is None:
        raise RuntimeError(f"no totals in {out}")
    return int(totals.group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--only", help="comma-separated substrings: count only the paths whose name has one")
    ap.add_argument("--keep", type=Path, help="keep the callgrind files here (for callgrind_annotate)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("proxy_instructions: valgrind is not installed (Debian: apt-get install valgrind)")
    n = args.requests
    tmp = Path(tempfile.mkdtemp(prefix="nfbench-ir-"))
    up = FakeUpstream().start()
    try:
        # recordings to replay from, made without valgrind: the same bodies the counted runs send
        prep = start_nfproxy("--mode", "record", "--store", str(tmp / "replay.lmdb"), "--upstream", up.url, "-q")
        sequential(prep.url, max(n, args.warmup))
        prep.stop()
        flows = tmp / "flows.mitm"
        rec, url = run_mitmdump(["--mode", f"reverse:{up.url}", "-w", str(flows)])
        sequential(url, max(n, args.warmup))
        rec.terminate()
        rec.wait(20)
        mitmdump = str(Path(sys.executable).with_name("mitmdump"))

        nfproxy = [sys.executable, str(Path(sys.executable).with_name("nfproxy")), "run", "-q"]
        paths: dict[str, tuple[list[str], int]] = {}
        for name, extra in {
            "nfproxy passthrough": ["--mode", "passthrough", "--upstream", up.url],
            "nfproxy record": ["--mode", "record", "--store", str(tmp / "rec.lmdb"), "--upstream", up.url],
            "nfproxy replay": ["--mode", "replay", "--store", str(tmp / "replay.lmdb"), "--allow-reuse", "--no-strict"],
        }.items():
            port = free_port()
            paths[name] = ([*nfproxy, *extra, "--listen", f"127.0.0.1:{port}"], port)
        for name, extra in {
            "mitmdump (reverse)": ["--mode", f"reverse:{up.url}"],
            "mitmdump --server-replay": ["--mode", f"reverse:{up.url}", "--server-replay", str(flows), "--set",
                                         "server_replay_reuse=true", "--set", "server_replay_extra=kill"],
        }.items():
            port = free_port()
            paths[name] = ([sys.executable, mitmdump, "-q", "--listen-host", "127.0.0.1", "--listen-port", str(port),
                            "--set", "connection_strategy=lazy", *extra], port)
        if args.only:
            paths = {k: v for k, v in paths.items() if any(part in k for part in args.only.split(","))}
        per_request = {}
        cg_dir = args.keep or tmp
        cg_dir.mkdir(parents=True, exist_ok=True)
        for name, (argv, port) in paths.items():
            per_request[name] = count(argv, port, args.warmup, n, cg_dir / f"{name.replace(' ', '_')}.cg") / n
            print(f"{name:<28}{per_request[name] / 1e6:>8.2f} M instructions per request", flush=True)
    finally:
        up.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{n} sequential requests per path after {args.warmup} warm-up requests; ~0.5 kB chat bodies")
    for a, b in (("nfproxy record", "nfproxy passthrough"), ("nfproxy replay", "mitmdump --server-replay"),
                 ("nfproxy record", "mitmdump (reverse)")):
        if a in per_request and b in per_request:
            print(f"{a} / {b} = {per_request[a] / per_request[b]:.3f}")


if __name__ == "__main__":
    main()
