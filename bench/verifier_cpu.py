"""CPU per graded candidate on the whole of HumanEval+ (164 tasks, 120 inputs each, base first):
the reference outputs, the 164 canonical solutions, and their mutants (result wrapped in a list,
an off-by-one constant, a negated `if`, a flipped comparison boundary). CPU is the verifier's
own plus every sandbox process's (each phase's fork servers are closed, so their candidates'
CPU is counted); wall times on a shared machine say little, CPU-s do.

    NF_SHARED_DATA=/work/shared/data python bench/verifier_cpu.py [-j 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evalplus_compare import mutants  # noqa: E402

from noisefloor.verifier.datasets import locate  # noqa: E402
from noisefloor.verifier.grading import GradeOptions, code_grader  # noqa: E402


def cpu_s() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def phase(name: str, jobs: int, items_of) -> list:
    """One grader (its sandbox closed at the end, so its candidates' CPU is counted) grading the
    candidates `items_of(grader)` gives, or computing the reference outputs when that is None."""
    c0, t0 = cpu_s(), time.monotonic()
    d = code_grader("humaneval+", locate("humaneval+"), GradeOptions(jobs=jobs))
    try:
        items = items_of(d)
        if items is None:
            d.expected()
        verdicts = [] if items is None else d.grade_many(items, programs=True)
    finally:
        d.sandbox.close()
    used, wall = cpu_s() - c0, time.monotonic() - t0
    n = len(d.tasks) if items is None else len(items)
    print(f"{name}: {n} runs, {used:.1f} CPU-s ({n / used:.2f} per CPU-s), {wall:.1f} s wall", flush=True)
    return verdicts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-j", "--jobs", type=int, default=2)
    a = ap.parse_args()
    os.environ["NF_CACHE_DIR"] = tempfile.mkdtemp(prefix="nfverify-cpu-")  # references computed here, once
    phase("reference outputs", a.jobs, lambda d: None)
    canon = phase("canonical solutions", a.jobs, lambda d: [(t.task_id, t.canonical) for t in d.tasks.values()])
    assert all(v.outcome == 1 for v in canon), [v for v in canon if v.outcome != 1][:3]
    verdicts = phase("mutants", a.jobs, lambda d: [(t.task_id, code) for t in d.tasks.values()
                                                   for _, code in mutants(t.canonical)])
    print("mutant verdicts:", dict(Counter(v.failure for v in verdicts)), "load", os.getloadavg())


if __name__ == "__main__":
    main()
