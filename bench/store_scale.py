"""The store at scale: stores of 10k / 100k / 1M exchanges built through the real recorder
(bench/store_traffic.py: ~5 kB raw per exchange, multi-turn sessions), and what each reader and
writer costs on them, as whole processes, next to the limits of the parts underneath (raw LMDB
put/get, zstd on these very bodies).

    python bench/store_scale.py --sizes 10000,100000 [--shards 2] [--keep DIR] [--json out.json]

Per size: build rate (with --shards K, K recorder processes at once, then `nfproxy merge` of the
K shards); bytes used and on disk against the raw bytes (bodies + records), live and after
`nfproxy compact`; `nfproxy log` (plain and --json), `nfanalyze STORE` and `nfproxy merge` (wall
seconds, CPU seconds and peak RSS of the process, private memory of it and its workers); replay
start-up (to its ready line) with its RSS (nfverify: bench/verify_scale.py). Peak RSS is the kernel's high-water mark, which counts the store's pages a reader
mapped as well as its own memory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import lmdb  # noqa: E402
import zstandard  # noqa: E402

from bench.store_traffic import record, sessions  # noqa: E402
from noisefloor.proxy.store import _codec as codec  # noqa: E402
from noisefloor.proxy.store.log import Store  # noqa: E402

BIN = Path(sys.executable).parent


PRIVATE: dict[str, float] = {}  # command -> the most private (anonymous) memory seen, MB
CPU: dict[str, float] = {}  # command -> user + system CPU seconds (moves less than wall time on a busy machine)


def _tree(pid: int) -> list[int]:
    """A process and its descendants (merge's worker processes)."""
    out = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
                out += _tree(int(child))
    except OSError:
        pass
    return out


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def timed(argv: list[str], cwd: Path | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one process, its stdout discarded. Peak RSS counts the
    store's pages the process mapped; its private memory (RssAnon of it and its children, summed,
    sampled every 50 ms) is kept in PRIVATE under the command's first argument, its CPU seconds
    (children included) in CPU."""
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd)
    anon = peak = 0
    while proc.poll() is None:
        anon = max(anon, sum(_status_kb(p, "RssAnon:") for p in _tree(proc.pid)))
        peak = max(peak, _status_kb(proc.pid, "VmHWM:"))
        time.sleep(0.05)
    wall = time.perf_counter() - start
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} exited {proc.returncode}: {err[-500:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    name = " ".join([Path(argv[0]).name, *(a for a in argv[1:3] if "/" not in a)])  # the command, not its paths
    PRIVATE[name] = anon / 1024
    CPU[name] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, peak / 1024


def limits(n: int = 20000) -> dict[str, float]:
    """What the parts underneath can do on this machine: LMDB puts and gets of 1 kB values, and zstd
    on this benchmark's bodies (per body, with and without a trained dictionary)."""
    bodies = [b for _, turns in sessions(n // 2, seed=7) for pair in turns for b in pair][:n]
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = lmdb.open(tmp, map_size=1 << 30, sync=False, metasync=False, writemap=True)
        vals = [os.urandom(32) * 32 for _ in range(1000)]
        keys = [hashlib.sha256(str(i).encode()).digest() for i in range(n)]
        t = time.perf_counter()
        for i in range(0, n, 100):  # 100 puts per transaction
            with env.begin(write=True) as txn:
                for k in keys[i:i + 100]:
                    txn.put(k, vals[i % 1000])
        out["lmdb_put_per_s"] = n / (time.perf_counter() - t)
        random.Random(1).shuffle(keys)
        t = time.perf_counter()
        with env.begin() as txn:
            for k in keys:
                txn.get(k)
        out["lmdb_get_per_s"] = n / (time.perf_counter() - t)
        env.close()
    raw = sum(map(len, bodies))
    plain = zstandard.ZstdCompressor(level=3)
    t = time.perf_counter()
    frames = [plain.compress(b) for b in bodies]
    out["zstd_compress_MB_s"] = raw / (time.perf_counter() - t) / 1e6
    out["zstd_alone_ratio"] = sum(map(len, frames)) / raw
    d = zstandard.ZstdDecompressor()
    t = time.perf_counter()
    for f in frames:
        d.decompress(f)
    out["zstd_decompress_MB_s"] = raw / (time.perf_counter() - t) / 1e6
    trained = codec.train(bodies[: n // 4])
    c = codec.Codec({codec.dict_key(trained): trained}.get)
    key = codec.dict_key(trained)
    t = time.perf_counter()
    enc = [c.encode(b, key) for b in bodies]
    out["zstd_dict_compress_MB_s"] = raw / (time.perf_counter() - t) / 1e6
    out["zstd_dict_ratio"] = sum(map(len, enc)) / raw
    t = time.perf_counter()
    for e in enc:
        c.decode(e, 1 << 24)
    out["zstd_dict_decompress_MB_s"] = raw / (time.perf_counter() - t) / 1e6
    t = time.perf_counter()
    for _ in range(3):
        codec.train(bodies[: 2000])
    out["dict_train_ms"] = (time.perf_counter() - t) / 3 * 1000
    return out


def replay_start(store: Path) -> tuple[float, float]:
    """Seconds from launch to the ready line, and RSS (MB) then, of `nfproxy --mode replay`."""
    from noisefloor.proxy.launch import start

    t = time.perf_counter()
    rep = start("--mode", "replay", "--strict", "--store", str(store), "-q", timeout=600)
    wall = time.perf_counter() - t
    rss = 0.0
    for line in Path(f"/proc/{rep.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    rep.stop()
    return wall, rss


def build_shard(n: int, store: Path, seed: int, prefix: str) -> dict[str, float]:
    """One store of n exchanges through the recorder, in this process: its raw bytes and CPU time."""
    shutil.rmtree(store, ignore_errors=True)
    cpu = time.process_time()
    with Store.open(store, write=True, create=True) as s:
        raw = record(s, n, seed=seed, prefix=prefix)
    return {**raw, "cpu_s": time.process_time() - cpu}


def build(n: int, where: Path, shards: int) -> dict[str, object]:
    """s{n}.lmdb built through the recorder: in this process, or as `shards` processes recording a
    shard each at once (2 cores), then `nfproxy merge` (the sharded-study case: merge measured)."""
    store = where / f"s{n}.lmdb"
    res: dict[str, object] = {"exchanges": n, "shards": shards}
    t = time.perf_counter()
    if shards == 1:
        raw = build_shard(n, store, 0, "run")
    else:
        parts = [where / f"s{n}.shard{i}.lmdb" for i in range(shards)]
        procs = [subprocess.Popen([sys.executable, __file__, "--build-shard", str(n // shards), "--seed", str(i),
                                   "--prefix", f"sh{i}", "--out", str(part)], stdout=subprocess.PIPE, text=True)
                 for i, part in enumerate(parts)]
        got = [json.loads(p.communicate()[0]) for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError("a shard build failed")
        raw = {k: sum(g[k] for g in got) for k in got[0]}
        res["shard_build_s"] = time.perf_counter() - t
        shutil.rmtree(store, ignore_errors=True)
        wall, peak = timed([str(BIN / "nfproxy"), "merge", str(store), *map(str, parts)])
        res["shard_merge_s"], res["shard_merge_rss_mb"], res["shard_merge_per_s"] = wall, peak, n / wall
        res["shard_merge_private_mb"] = PRIVATE.get("nfproxy merge", 0.0)
        res["shard_merge_per_cpu_s"] = n / max(CPU.get("nfproxy merge", 0.0), 1e-9)
        for part in parts:
            shutil.rmtree(part, ignore_errors=True)
    res["build_s"] = time.perf_counter() - t
    res["build_per_s"] = n / res["build_s"]
    res["build_cpu_us_per_exchange"] = raw["cpu_s"] / n * 1e6
    with Store.open(store, write=False) as s:
        live = s.tables.usage()
        records = sum(len(text) for _, text in s.records.texts())
    res["raw_bytes"] = raw_bytes = raw["bodies"] + records
    res["raw_per_exchange"] = raw_bytes / n
    res["live_used_x"] = live["used"] / raw_bytes
    res["live_file_x"] = live["file"] / raw_bytes
    (where / f"s{n}.build.json").write_text(json.dumps(res))
    return res


def hit_miss(store: Path, n: int, shards: int, queries: int = 100) -> dict[str, float]:
    """In this process: replay opened on the store (seconds, RSS after), then `queries` recorded
    requests (hits) and the same with one word of the last message changed (misses), through
    Replayer.answer: p50 / p95 milliseconds and CPU per request. These first requests also pay
    the process's first touch of the store's pages and of the code; `miss_warm_*` are `queries`
    other misses asked after them, what a replay that has been serving a while sees."""
    from bench.store_traffic import REQUEST_HEADERS
    from noisefloor.proxy.replay.replayer import Replayer
    from noisefloor.proxy.request.keys import Rules
    from noisefloor.proxy.request.labels import Labels
    from noisefloor.proxy.request.traffic import RequestData

    picked: list[tuple[str, bytes]] = []
    for name, turns in sessions(n // shards, seed=0, prefix="run" if shards == 1 else "sh0"):
        picked += [(name, req) for req, _ in turns]
        if len(picked) >= 2 * queries:
            break
    with Store.open(store, write=False) as s:
        t = time.perf_counter()
        rep = Replayer(s, Rules(), log=lambda build: None)
        out: dict[str, float] = {"replay_open_s": time.perf_counter() - t, "replay_open_rss_mb": _rss_mb()}
        for kind, asked in (("hit", picked[:queries]), ("miss", picked[:queries]), ("miss_warm", picked[queries:2 * queries])):
            walls, cpu = [], time.process_time()
            for q, (name, body) in enumerate(asked):
                if kind != "hit":
                    doc = json.loads(body)
                    doc["messages"][-1]["content"] = "Changed " + doc["messages"][-1]["content"]
                    body = json.dumps(doc).encode()
                req = RequestData("POST", "https://api.openai.com/v1/chat/completions", "api.openai.com",
                                  "/v1/chat/completions", REQUEST_HEADERS, body)
                t = time.perf_counter()
                a = rep.answer(req, Labels(f"{kind}{q}", replay_from=name))
                walls.append(time.perf_counter() - t)
                if (a.result == "miss") != (kind != "hit"):
                    raise RuntimeError(f"a {kind} query was answered {a.result}")
            walls.sort()
            out[f"{kind}_p50_ms"] = walls[len(walls) // 2] * 1000
            out[f"{kind}_p95_ms"] = walls[int(0.95 * (len(walls) - 1))] * 1000
            out[f"{kind}_cpu_ms"] = (time.process_time() - cpu) / len(walls) * 1000
    return out


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024


def measure(n: int, where: Path, reuse: bool = False, shards: int = 1, skip: frozenset[str] = frozenset()) -> dict[str, object]:
    store = where / f"s{n}.lmdb"
    res = json.loads((where / f"s{n}.build.json").read_text()) if reuse else build(n, where, shards)
    raw_bytes = res["raw_bytes"]
    print(json.dumps(res), flush=True)
    nf = [str(BIN / "nfproxy")]
    res["log_s"], res["log_rss_mb"] = timed([*nf, "log", "--store", str(store)])
    res["log_json_s"], res["log_json_rss_mb"] = timed([*nf, "log", "--json", "--store", str(store)])
    res["nfanalyze_s"], res["nfanalyze_rss_mb"] = timed([str(BIN / "nfanalyze"), str(store), "--json", "/dev/null"])
    # nfverify is measured by bench/verify_scale.py, on a store whose sessions are labelled with BFCL tasks
    res["replay_start_s"], res["replay_rss_mb"] = replay_start(store)
    got = subprocess.run([sys.executable, __file__, "--hit-miss", str(n), "--shards", str(shards), "--out", str(store)],
                         capture_output=True, text=True, check=True)
    res.update(json.loads(got.stdout))
    out = where / f"m{n}.lmdb"
    shutil.rmtree(out, ignore_errors=True)
    if "merge" not in skip:  # a sharded build has measured a merge already
        wall, peak = timed([*nf, "merge", str(out), str(store)])
        res["merge_s"], res["merge_rss_mb"], res["merge_per_s"] = wall, peak, n / wall
        res["merge_private_mb"], res["merge_per_cpu_s"] = PRIVATE["nfproxy merge"], n / max(CPU["nfproxy merge"], 1e-9)
        shutil.rmtree(out, ignore_errors=True)
    if "compact" not in skip:  # last: the readers above read the store as recorded
        res["compact_s"], res["compact_rss_mb"] = timed([*nf, "compact", "--store", str(store)])
        with Store.open(store, write=False) as s:
            after = s.tables.usage()
        res["compacted_used_x"] = after["used"] / raw_bytes
        res["compacted_file_x"] = after["file"] / raw_bytes
    res["private_mb"], res["cpu_s"] = dict(PRIVATE), dict(CPU)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000", help="comma-separated exchange counts")
    ap.add_argument("--keep", type=Path, help="build the stores here and keep them (default: a temp folder)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--no-limits", action="store_true")
    ap.add_argument("--reuse", action="store_true", help="measure the readers on the stores kept in --keep, unbuilt")
    ap.add_argument("--shards", type=int, default=1, help="build each store as this many shards at once, merged")
    ap.add_argument("--build-only", action="store_true", help="build (and keep: give --keep) without measuring")
    ap.add_argument("--skip", default="", help="comma-separated steps not to measure: merge, compact (at 1M each takes minutes)")
    ap.add_argument("--build-shard", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--prefix", default="run", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--hit-miss", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.hit_miss:  # replay latency on one store, in its own process (its RSS is its own)
        print(json.dumps(hit_miss(a.out, a.hit_miss, a.shards)))
        return
    if a.build_shard:  # one shard of --shards, in its own process
        print(json.dumps(build_shard(a.build_shard, a.out, a.seed, a.prefix)))
        return
    where = a.keep or Path(tempfile.mkdtemp(prefix="nf-store-scale-"))
    where.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {}
    try:
        if not a.no_limits:
            results["limits"] = limits()
            print(json.dumps({"limits": results["limits"]}), flush=True)
        for n in map(int, a.sizes.split(",")):
            r = build(n, where, a.shards) if a.build_only else measure(n, where, a.reuse, a.shards, frozenset(filter(None, a.skip.split(","))))
            results[str(n)] = r
            print(json.dumps(r), flush=True)
            if a.keep is None:
                for p in where.iterdir():
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
    finally:
        if a.keep is None:
            shutil.rmtree(where, ignore_errors=True)
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
