"""Sandbox throughput on quickly failing candidates: what grading costs when the tests are cheap.

492 candidates (the 164 HumanEval+ tasks x 3 wrong bodies that fail on the first input) graded
through the real sandbox with 2 workers (fork server, namespaces as root), against a baseline in
the same run: starting a fresh Python interpreter per candidate on 2 workers, which is what each
candidate cost before the fork server.

    python bench/sandbox_throughput.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from noisefloor.verifier.datasets import locate
from noisefloor.verifier.grading import GradeOptions, code_grader

WRONG = ("    return None\n", "    raise ValueError('wrong')\n", "    return 'not it'\n")


def candidates(diff) -> list[tuple[str, str]]:
    return [(t.task_id, t.prompt + body) for t in diff.tasks.values() for body in WRONG]


def interpreter_starts(n: int, workers: int) -> float:
    """Fresh interpreters per second, `workers` at a time (the old per-candidate cost)."""
    start = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda _: subprocess.run([sys.executable, "-I", "-c", "import json, math"], check=True),
                      range(n)))
    return n / (time.monotonic() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    diff = code_grader("humaneval+", locate("humaneval+"), GradeOptions(jobs=a.workers))
    diff.expected()  # reference outputs once, outside the timing
    items = candidates(diff)
    rates, base = [], []
    for r in range(a.rounds):
        start = time.monotonic()
        verdicts = diff.grade_many(items, programs=True)
        rates.append(len(items) / (time.monotonic() - start))
        assert not any(v.outcome for v in verdicts), "a wrong candidate passed"
        base.append(interpreter_starts(len(items) // 4, a.workers))
        print(f"round {r + 1}: sandbox {rates[-1]:.1f} candidates/s; fresh interpreters {base[-1]:.1f}/s",
              flush=True)
    diff.sandbox.close()
    ratio = [x / y for x, y in zip(rates, base)]
    print(f"\n{len(items)} quickly failing candidates, {a.workers} workers, isolation {diff.sandbox.mode}: "
          f"median {statistics.median(rates):.1f} candidates/s (target >= 50); "
          f"{statistics.median(ratio):.1f}x the rate of starting a fresh interpreter per candidate")


if __name__ == "__main__":
    main()
