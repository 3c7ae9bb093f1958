"""Time BFCL grading per candidate on the official-verdict corpus (tests/data/bfcl_official_verdicts.jsonl.gz).

    NF_SHARED_DATA=../shared/data python bench/bfcl_grading.py [--old-rev REV --old-sample 10]

Prints the median, 99th percentile and maximum of each candidate's grading CPU time (the response
body through its task's `TaskGrader`, compiled once per task before the clock starts, as nfverify
grades a log), the same for the candidates of the 6- and
8-call parallel tasks, and, with --old-rev, how long the grader at that git revision takes on a
sample of the failing 8-call candidates (it tried every ordering).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from noisefloor.verifier.bfcl import Rules, TaskGrader, grade_response
from noisefloor.verifier.datasets import ToolTask, load_bfcl

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "bfcl_official_verdicts.jsonl.gz"


def body(calls: list[list[str]]) -> dict:
    return {"choices": [{"finish_reason": "tool_calls", "message": {"tool_calls": [
        {"function": {"name": n, "arguments": a}} for n, a in calls]}}]}


def timed(fn, *args) -> float:
    """CPU time of this thread: on a shared machine wall time measures the neighbours' load."""
    t0 = time.thread_time()
    fn(*args)
    return time.thread_time() - t0


def summary(label: str, times: list[float]) -> None:
    times = sorted(times)
    p99 = times[int(0.99 * (len(times) - 1))]
    print(f"{label}: {len(times)} candidates, median {statistics.median(times) * 1e3:.3f} ms, "
          f"p99 {p99 * 1e3:.3f} ms, max {times[-1] * 1e3:.3f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-rev", help="git revision whose verifier/bfcl.py to time on failing 8-call candidates")
    ap.add_argument("--old-sample", type=int, default=10)
    args = ap.parse_args()
    gc.disable()  # a collection pause belongs to no one candidate
    tasks: dict[str, ToolTask] = {t.task_id: t for c in ("multiple", "parallel") for t in load_bfcl(c)}
    with gzip.open(CORPUS, "rt") as fh:
        rows = [r for r in map(json.loads, fh) if r["id"] in tasks]
    for rules in (Rules(), Rules(parallel="bipartite")):
        all_t, big_t = [], []
        graders = {tid: TaskGrader(task, rules) for tid, task in tasks.items()}
        for r in rows:
            t = timed(graders[r["id"]].grade_response, body(r["calls"]))
            all_t.append(t)
            if len(tasks[r["id"]].ground_truth) >= 6:
                big_t.append(t)
        summary(f"{rules.parallel} all", all_t)
        summary(f"{rules.parallel} 6-8-call tasks", big_t)
    if args.old_rev:
        src = subprocess.run(["git", "show", f"{args.old_rev}:verifier/bfcl.py"], capture_output=True, text=True,
                             check=True).stdout
        path = Path(tempfile.mkdtemp()) / "old_bfcl.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location("old_bfcl", path)
        old = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["old_bfcl"] = old
        spec.loader.exec_module(old)  # type: ignore[union-attr]
        failing = [r for r in rows if len(tasks[r["id"]].ground_truth) == 8 and not r["fc"]
                   and len(r["calls"]) == 8 and r["m"].startswith("var")][: args.old_sample]
        summary(f"old ({args.old_rev}) failing 8-call", [timed(old.grade_response, tasks[r["id"]], body(r["calls"]))
                                                         for r in failing])
        summary("first-fit same candidates (compiling included)",
                [timed(grade_response, tasks[r["id"]], body(r["calls"])) for r in failing])


if __name__ == "__main__":
    main()
