"""`nfproxy merge` before and after: one `nfproxy merge OUT STORE` process per kept store, run from
this checkout and from another revision of the code (`--baseline`, unpacked and put first on the
import path, as bench/readers_scale.py does), interleaved round by round so both see the same load.

    python bench/store_scale.py --sizes 10000,100000 --build-only --keep DIR
    python bench/merge_scale.py --keep DIR --sizes 10000,100000 --baseline main [--rounds 2]
    python bench/merge_scale.py --keep DIR --sizes 10000,100000 --shards 2   # shards built with
        store_scale.py --build-shard N --seed I --prefix shI --out DIR/sN.shardI.lmdb, I = 0, 1
    python bench/merge_scale.py --keep DIR --this-keep DIR5 ...   # this checkout merges DIR5's
        copies (`nfproxy migrate`d to its format), the baseline DIR's
    python bench/merge_scale.py ... --jobs 1   # this checkout's merge in one process (default: 2 on 2+ CPUs)
    python bench/merge_scale.py --keep DIR --sequential 20 --shard 10000 --baseline main
        # 20 shards of 10k (built once into DIR by store_scale.py's recorder, s10000.seqI.lmdb),
        # merged one at a time into one OUT per revision, the two revisions interleaved step by step

Per run: wall seconds, CPU seconds (user + system, worker processes included), exchanges per
wall second and per CPU second, the megabytes it wrote to disk, and the most private memory seen (RssAnon of the merging process,
and of it and its workers summed: forked workers share its pages, so the sum counts those twice).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.readers_scale import unpack  # noqa: E402
from bench.store_scale import _status_kb, _tree  # noqa: E402


def merge_run(stores: list[Path], out: Path, code: Path | None, exchanges: int, jobs: int | None = None,
              keep_out: bool = False) -> dict[str, float]:
    """`nfproxy merge [--jobs N] out stores...`, its code from `code` (None: this checkout); no
    --jobs: the revision's default (one process before 2 became the default on two CPUs).
    `keep_out`: into OUT as it is (the sequential merges), left there afterwards."""
    if not keep_out:
        shutil.rmtree(out, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if code is not None:
        env["PYTHONPATH"] = str(code)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "from noisefloor.proxy.cli import main; main()", "merge",
                             *(["--jobs", str(jobs)] if jobs is not None else []), str(out), *map(str, stores)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    main_kb = all_kb = 0
    while proc.poll() is None:
        pids = _tree(proc.pid)
        sizes = [_status_kb(p, "RssAnon:") for p in pids]
        main_kb, all_kb = max(main_kb, sizes[0]), max(all_kb, sum(sizes))
        time.sleep(0.05)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not keep_out:
        shutil.rmtree(out, ignore_errors=True)
    if proc.returncode:
        raise RuntimeError(f"nfproxy merge {' '.join(map(str, stores))} exited {proc.returncode}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"wall_s": wall, "cpu_s": cpu, "per_wall_s": exchanges / wall, "per_cpu_s": exchanges / cpu,
            "written_mb": (after.ru_oublock - before.ru_oublock) * 512 / 1e6,  # to disk (512-byte blocks)
            "private_mb": main_kb / 1024, "private_with_workers_mb": all_kb / 1024,
            "load": float(Path("/proc/loadavg").read_text().split()[0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, required=True, help="the folder bench/store_scale.py --keep built")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--baseline", default="main", help="git revision to compare with")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--shards", type=int, default=0,
                    help="merge the K shards s{n}.shard{i}.lmdb of each size (n exchanges each) instead of s{n}.lmdb")
    ap.add_argument("--this-keep", type=Path, help="this checkout's copies of the stores, where they differ "
                    "(the shards migrated to today's format: `nfproxy migrate`); default --keep")
    ap.add_argument("--jobs", type=int, help="this checkout's merge with --jobs N (default: its default; the "
                    "baseline's always its own default)")
    ap.add_argument("--sequential", type=int, default=0, help="merge this many shards one at a time into one "
                    "OUT (each revision its own), printing each step")
    ap.add_argument("--shard", type=int, default=10000, help="exchanges a shard of --sequential")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.sequential:
        sequential(a.keep, a.sequential, a.shard, a.baseline, a.jobs, a.json)
        return
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="nf-merge-scale-") as tmp:
        base = unpack(a.baseline, Path(tmp) / "base")
        for round_ in range(a.rounds):
            for n in map(int, a.sizes.split(",")):
                names = [f"s{n}.shard{i}.lmdb" for i in range(a.shards)] or [f"s{n}.lmdb"]
                for label, code in ((a.baseline, base), ("this", None)):
                    stores = [(a.this_keep if code is None and a.this_keep else a.keep) / name for name in names]
                    # n exchanges in all: one store of n, or --shards stores of n / shards each
                    r = {"round": round_, "exchanges": n, "code": label,
                         **merge_run(stores, Path(tmp) / "out.lmdb", code, n, a.jobs if code is None else None)}
                    results.append(r)
                    print(json.dumps(r), flush=True)
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))


def sequential(keep: Path, k: int, n: int, baseline: str, jobs: int | None, out_json: Path | None) -> None:
    """K shards of n exchanges merged one at a time into one OUT, by the baseline and by this
    checkout (each into its own OUT), step by step interleaved so both see the same load: per
    step wall and CPU seconds and how many exchanges OUT held before it. A merge whose cost
    follows what is merged takes the same at every step."""
    from bench.store_scale import build_shard

    keep.mkdir(parents=True, exist_ok=True)
    shards = [keep / f"s{n}.seq{i}.lmdb" for i in range(k)]
    for i, shard in enumerate(shards):
        if not (shard / "data.mdb").exists():  # recorded by this checkout's recorder, each its own sessions
            print(json.dumps({"built": str(shard), **build_shard(n, shard, 1000 + i, f"seq{i}")}), flush=True)
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="nf-merge-seq-") as tmp:
        base = unpack(baseline, Path(tmp) / "base")
        outs = {baseline: Path(tmp) / "base-out.lmdb", "this": Path(tmp) / "this-out.lmdb"}
        for step, shard in enumerate(shards):
            for label, code in ((baseline, base), ("this", None)):
                r = {"step": step + 1, "out_before": step * n, "code": label,
                     **merge_run([shard], outs[label], code, n, jobs if code is None else None, keep_out=True)}
                results.append(r)
                print(json.dumps(r), flush=True)
    if out_json:
        out_json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
