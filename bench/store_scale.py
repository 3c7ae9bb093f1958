"""The store at scale: stores of 10k / 100k / 1M exchanges built through the real recorder
(bench/store_traffic.py: ~5 kB raw per exchange, multi-turn sessions), and what each reader and
writer costs on them, as whole processes, next to the limits of the parts underneath (raw LMDB
put/get, zstd on these very bodies).

    python bench/store_scale.py --sizes 10000,100000 [--keep DIR] [--json out.json]

Per size: build rate; bytes used and on disk against the raw bytes (bodies + records), live and
after `nfproxy compact`; `nfproxy log` (plain and --json), `nfanalyze STORE`, `nfverify` and
`nfproxy merge` (wall seconds and peak RSS of the process); replay start-up (to its ready line)
with its RSS. Peak RSS is the kernel's high-water mark, which counts the store's pages a reader
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
from noisefloor.proxy import codec  # noqa: E402
from noisefloor.proxy.store import Store  # noqa: E402

BIN = Path(sys.executable).parent


PRIVATE: dict[str, float] = {}  # command -> the most private (anonymous) memory seen, MB
CPU: dict[str, float] = {}  # command -> user + system CPU seconds (moves less than wall time on a busy machine)


def timed(argv: list[str], cwd: Path | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one process, its stdout discarded. Peak RSS counts the
    store's pages the process mapped; its private memory (RssAnon, sampled every 50 ms) is kept
    in PRIVATE under the command's first argument."""
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd)
    anon = peak = 0
    status = Path(f"/proc/{proc.pid}/status")
    while proc.poll() is None:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("RssAnon:"):
                    anon = max(anon, int(line.split()[1]))
                elif line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
        time.sleep(0.05)
    wall = time.perf_counter() - start
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} exited {proc.returncode}: {err[-500:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    name = " ".join(Path(a).name for a in argv[:3] if not a.startswith("/tmp"))
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


def measure(n: int, where: Path, reuse: bool = False) -> dict[str, object]:
    store = where / f"s{n}.lmdb"
    res: dict[str, object] = {"exchanges": n}
    if not reuse:
        shutil.rmtree(store, ignore_errors=True)
        t = time.perf_counter()
        with Store.open(store, write=True, create=True) as s:
            raw = record(s, n)
            live = s.usage()
        res["build_s"] = time.perf_counter() - t
        res["build_per_s"] = n / res["build_s"]
        with Store.open(store, write=False) as s:
            records = sum(len(text) for _, text in s.record_texts())
        res["raw_bytes"] = raw_bytes = raw["bodies"] + records
        res["raw_per_exchange"] = raw_bytes / n
        res["live_used_x"] = live["used"] / raw_bytes
        res["live_file_x"] = live["file"] / raw_bytes
    else:  # the readers again, on a store kept from an earlier run (--keep)
        raw_bytes = None
    nf = [str(BIN / "nfproxy")]
    res["log_s"], res["log_rss_mb"] = timed([*nf, "log", "--store", str(store)])
    res["log_json_s"], res["log_json_rss_mb"] = timed([*nf, "log", "--json", "--store", str(store)])
    res["nfanalyze_s"], res["nfanalyze_rss_mb"] = timed([str(BIN / "nfanalyze"), str(store), "--json", "/dev/null"])
    shared = os.environ.get("NF_SHARED_DATA")
    if shared and (Path(shared) / "bfcl").is_dir():
        res["nfverify_s"], res["nfverify_rss_mb"] = timed([str(BIN / "nfverify"), "bfcl", str(store), "--outcomes",
                                                           str(where / "o.jsonl")])
    res["replay_start_s"], res["replay_rss_mb"] = replay_start(store)
    out = where / f"m{n}.lmdb"
    shutil.rmtree(out, ignore_errors=True)
    wall, peak = timed([*nf, "merge", str(out), str(store)])
    res["merge_s"], res["merge_rss_mb"], res["merge_per_s"] = wall, peak, n / wall
    shutil.rmtree(out, ignore_errors=True)
    if raw_bytes is not None:
        res["compact_s"], res["compact_rss_mb"] = timed([*nf, "compact", "--store", str(store)])
        with Store.open(store, write=False) as s:
            after = s.usage()
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
    a = ap.parse_args()
    where = a.keep or Path(tempfile.mkdtemp(prefix="nf-store-scale-"))
    where.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {}
    try:
        if not a.no_limits:
            results["limits"] = limits()
            print(json.dumps({"limits": results["limits"]}), flush=True)
        for n in map(int, a.sizes.split(",")):
            r = measure(n, where, a.reuse)
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
