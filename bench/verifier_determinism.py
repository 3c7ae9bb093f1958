"""The verifier's own replay variance: every canonical HumanEval+ and MBPP+ solution graded
`--reruns` times at the 120-input cap, with the per-candidate verdicts compared across reruns
(and timed: wall seconds per full pass with `-j` workers).

    python bench/verifier_determinism.py [--reruns 5] [-j 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reruns", type=int, default=5)
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--suites", default="humaneval+,mbpp+")
    a = ap.parse_args()
    os.environ.setdefault("NF_CACHE_DIR", tempfile.mkdtemp(prefix="nfdet-"))
    from noisefloor.verifier.datasets import load_code_tasks, locate, sha256_file
    from noisefloor.verifier.differential import Differential
    from noisefloor.verifier.sandbox import Sandbox

    for suite in a.suites.split(","):
        path = locate(suite)
        d = Differential(load_code_tasks(suite, path, 120), Sandbox(a.j), sha256_file(path), 120)
        start = time.perf_counter()
        d.expected()
        ref = time.perf_counter() - start
        items = [(t.task_id, t.canonical) for t in d.tasks.values()]
        runs, walls = [], []
        for _ in range(1 + a.reruns):
            start = time.perf_counter()
            runs.append([(v.outcome, v.failure) for v in d.grade_many(items, programs=True)])
            walls.append(time.perf_counter() - start)
        passed = sum(o for o, _ in runs[0])
        changed = [i for i in range(len(items)) if len({run[i] for run in runs}) > 1]
        flips = len(changed)
        for i in changed:
            print(f"  {items[i][0]} changed: {[run[i] for run in runs]}")
        print(f"{suite}: {passed}/{len(items)} canonical solutions pass; {1 + a.reruns} runs; "
              f"{flips} candidates changed verdict across runs; reference outputs {ref:.1f} s; "
              f"per run {min(walls):.1f}-{max(walls):.1f} s with {a.j} workers")


if __name__ == "__main__":
    main()
