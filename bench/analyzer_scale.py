"""nfanalyze at paper scale and at a million rows, as whole processes, against a straightforward
per-resample loop computed in the same run.

    python bench/analyzer_scale.py [--skip-million]
"""

from __future__ import annotations

import argparse
import csv
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from noisefloor.analyzer.outcomes import load  # noqa: E402


def write_outcomes(path: Path, tasks: int, replicates: int, conditions: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    rows = 0
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["task_id", "condition", "replicate", "outcome"])
        for c in range(conditions):
            p = np.where(rng.random(tasks) < 0.3, rng.uniform(0.1, 0.9, tasks), (rng.random(tasks) < 0.7) * 1.0)
            y = (rng.random((tasks, replicates)) < p[:, None]).astype(int)
            for i in range(tasks):
                for r in range(replicates):
                    w.writerow([f"T/{i}", f"c{c}", r, y[i, r]])
                    rows += 1
    return rows


def run_nfanalyze(path: Path, resamples: int) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one nfanalyze process."""
    exe = Path(sys.executable).with_name("nfanalyze")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    subprocess.run([str(exe), "--outcomes", str(path), "--bootstrap", str(resamples), "--json", "/dev/null", "-q",
                    "--no-progress"], check=True)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024


def loop_bootstrap(path: Path, resamples: int) -> float:
    """The straightforward way: per resample, per condition, recompute w from the resampled rows."""
    start = time.perf_counter()
    data = load(path)
    rng = np.random.default_rng(0)
    n = len(data.tasks)
    mats = [d.outcomes.astype(float) for d in data.conditions.values()]
    for _ in range(resamples):
        idx = rng.integers(0, n, n)
        for y in mats:
            y[idx].var(axis=1, ddof=1).mean()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-million", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nfanalyze-bench-"))
    paper = tmp / "paper.csv"
    rows = write_outcomes(paper, 364, 20, 7)
    wall, rss = run_nfanalyze(paper, 20_000)
    base = loop_bootstrap(paper, 20_000)
    print(f"paper scale: 364 tasks x 20 replicates x 7 conditions = {rows} rows, 20,000 resamples")
    print(f"  nfanalyze process: {wall:.2f} s wall, peak RSS {rss:.0f} MB (target < 3 s)")
    print(f"  straightforward per-resample loop (same data, same resamples, bootstrap only): {base:.2f} s "
          f"-> nfanalyze is {base / wall:.1f}x faster end to end")
    if not args.skip_million:
        big = tmp / "million.csv"
        rows = write_outcomes(big, 5000, 20, 10)
        wall, rss = run_nfanalyze(big, 20_000)
        base = loop_bootstrap(big, 200)
        print(f"\n1,000,000 rows: 5000 tasks x 20 replicates x 10 conditions = {rows} rows, 20,000 resamples")
        print(f"  nfanalyze process: {wall:.2f} s wall, peak RSS {rss:.0f} MB (targets < 20 s, < 2048 MB)")
        print(f"  straightforward loop, 200 resamples only: {base:.2f} s (x100 for 20,000: ~{base * 100:.0f} s)")


if __name__ == "__main__":
    main()
