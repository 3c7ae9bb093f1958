"""The ladder on the local executor and on Ray with 2 and 4 worker nodes (one machine), and merge.

    python bench/ray_ladder.py [--tasks 38] [-R 5] [--latency-ms 500] [--merge-exchanges 20000]

Agent runs are latency-bound (the built-in provider waits --latency-ms per answer), so what is
measured is how the executors spread runs, not CPU speed: the local executor runs 2 at a time
(-j 2), each Ray worker node offers 2 logical CPUs. Wall times are reported as ratios to the
local run of the same invocation. Then `nfproxy merge` on shards that share most bodies: the rate
in exchanges per second and the bytes before and after.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # the nodes bind to loopback

NFLADDER = str(Path(sys.executable).with_name("nfladder"))


def ladder(out: Path, a: argparse.Namespace, address: str | None) -> float:
    args = [NFLADDER, "run", "--tasks", str(a.tasks), "-R", str(a.R), "-j", "2", "--latency-ms", str(a.latency_ms),
            "--bootstrap", "500", "--out", str(out)]
    if address:
        args += ["--executor", "ray", "--ray-address", address]
    start = time.monotonic()
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(r.stderr[-2000:])
    return time.monotonic() - start


def on_ray(nodes: int, out: Path, a: argparse.Namespace) -> float:
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1"})
    try:
        for _ in range(nodes):
            c.add_node(num_cpus=2, node_ip_address="127.0.0.1")
        c.wait_for_nodes()
        return ladder(out, a, c.address)
    finally:
        c.shutdown()


def merge_rate(n: int, root: Path) -> tuple[float, int, int, int]:
    """(exchanges per second, shard bytes, merged bytes, exchanges) for 4 shards that send the same
    500 requests (as replicates of one task set do) and get different answers."""
    import random

    from noisefloor.proxy.store.log import Store
    from noisefloor.proxy.store.merge.run import merge
    from noisefloor.proxy.store.replay_index import RecordedEntry

    rng = random.Random(0)
    prompts = [rng.randbytes(3000).hex().encode() for _ in range(500)]  # 6 kB requests, the same in every shard
    shards = []
    for s in range(4):
        path = root / f"shard{s}.lmdb"
        with Store.open(path, write=True, create=True) as store:
            items = []
            for i in range(n // 4):
                req = prompts[i % len(prompts)]
                resp = f"answer {rng.random()}".encode()
                dq, dr = hashlib.sha256(req).hexdigest(), hashlib.sha256(resp).hexdigest()
                record = {"time": 1e9 + i, "mode": "record", "session": f"s{s}-{i // 4}", "key": dq,
                          "occurrence": 0, "seq": i % 4, "rules_id": "r",
                          "request": {"method": "POST", "url": "u", "headers": [], "body": dq},
                          "response": {"status": 200, "headers": [], "body": dr}}
                items.append((record, {dq: req, dr: resp},
                              RecordedEntry(0, dq, record["session"], 0, i % 4, "POST h /p", 1e9 + i, 1e9 + i + 1)))
            store.append_many(items)
        shards.append(path)
    shard_bytes = sum(_compact_size(p, root) for p in shards)
    start = time.monotonic()
    merge(root / "merged.lmdb", shards)
    seconds = time.monotonic() - start
    return n / seconds, shard_bytes, _compact_size(root / "merged.lmdb", root), n


def _compact_size(path: Path, root: Path) -> int:
    from noisefloor.proxy.store.log import Store

    with tempfile.TemporaryDirectory(dir=root) as tmp, Store.open(path, write=False) as s:
        s.tables.copy_to(Path(tmp))
        return (Path(tmp) / "data.mdb").stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=38)
    ap.add_argument("-R", type=int, default=5)
    ap.add_argument("--latency-ms", type=float, default=500)
    ap.add_argument("--merge-exchanges", type=int, default=20000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nf-bench-ray-") as tmp:
        root = Path(tmp)
        local = ladder(root / "local", a, None)
        print(f"local executor (-j 2): {local:.1f} s (1.00)", flush=True)
        for nodes in (2, 4):
            t = on_ray(nodes, root / f"ray{nodes}", a)
            print(f"ray, {nodes} worker nodes x 2 CPUs: {t:.1f} s ({t / local:.2f} of local)", flush=True)
        rate, before, after, n = merge_rate(a.merge_exchanges, root)
        print(f"merge: {n} exchanges from 4 shards at {rate:,.0f} exchanges/s; compact bytes "
              f"{before / 1e6:.2f} MB in the shards -> {after / 1e6:.2f} MB merged ({after / before:.2f})")


if __name__ == "__main__":
    main()
