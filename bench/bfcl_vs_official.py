"""nfverify's BFCL grading against the official checker, side by side on the same candidates.

    # gorilla as a bare git dir (the fetch tool: github:ShishirPatil/gorilla); its checker is copied
    # into --scratch at run time, never into this repository
    NF_SHARED_DATA=/work/shared/data python bench/bfcl_vs_official.py \
        --gorilla-git /work/.mirror/ShishirPatil+gorilla/repo --scratch /tmp/bfcl_official --rounds 5

Every candidate of tests/data/bfcl_official_verdicts.jsonl.gz is graded by both, each round in
alternating order (official first in odd rounds): the official path is what BFCL does for an FC
model (each call's arguments through json.loads, the output-format check, `ast_checker` with the
"fc" config), nfverify's is `TaskGrader.grade_response` on the candidate as an OpenAI chat completion (the
body is built before the clock starts; its arguments are the same strings), each task compiled at
its first candidate within the round, as nfverify does it (the compiling is in the figure). Both see the same
Python objects, in the same process, with the collector off. Prints each round's CPU and wall
seconds for both, the ratio of medians, the load average before and after, and the number of
verdicts that differ (must be 0).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "bfcl_official_verdicts.jsonl.gz"

from noisefloor.verifier.bfcl import TaskGrader  # noqa: E402
from noisefloor.verifier.datasets import ToolTask, load_bfcl  # noqa: E402


def _official_setup(git_dir: str, scratch: str) -> Any:
    spec = importlib.util.spec_from_file_location("bfcl_official_corpus", ROOT / "bench" / "bfcl_official_corpus.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.setup(git_dir, scratch)


def _body(calls: list[list[str]]) -> dict:
    return {"choices": [{"finish_reason": "tool_calls", "message": {"tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)]}}]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gorilla-git", required=True)
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    ast_checker, language, is_fc_format = _official_setup(args.gorilla_git, args.scratch)
    tasks: dict[str, ToolTask] = {t.task_id: t for c in ("multiple", "parallel") for t in load_bfcl(c)}
    with gzip.open(CORPUS, "rt", encoding="utf-8") as fh:
        rows = [r for r in map(json.loads, fh) if r["id"] in tasks]
    # the inputs each side gets, made before any clock starts
    official_in = [(tasks[r["id"]].functions, tasks[r["id"]].ground_truth, tasks[r["id"]].category, r["calls"])
                   for r in rows]
    bodies = [(r["id"], _body(r["calls"])) for r in rows]

    def official() -> list[bool]:
        out = []
        for functions, gt, category, calls in official_in:
            try:
                decoded = [{name: json.loads(a)} for name, a in calls]
            except ValueError:
                out.append(False)
                continue
            if not is_fc_format(decoded):
                out.append(False)
                continue
            try:
                out.append(bool(ast_checker(functions, decoded, gt, language.PYTHON, category, "fc_model")["valid"]))
            except Exception:  # noqa: BLE001 - the official checker crashing is a False here (the corpus has none)
                out.append(False)
        return out

    def ours() -> list[bool]:
        graders: dict[str, TaskGrader] = {}  # as nfverify grades: each task compiled at its first candidate
        out = []
        for tid, body in bodies:
            grader = graders.get(tid)
            if grader is None:
                grader = graders[tid] = TaskGrader(tasks[tid])
            out.append(bool(grader.grade_response(body).outcome))
        return out

    def timed(fn: Any) -> tuple[float, float, list[bool]]:
        gc.collect()
        c0, w0 = time.process_time(), time.perf_counter()
        verdicts = fn()
        return time.process_time() - c0, time.perf_counter() - w0, verdicts

    print(f"{len(rows)} candidates; load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    gc.disable()
    cpu: dict[str, list[float]] = {"official": [], "nfverify": []}
    wall: dict[str, list[float]] = {"official": [], "nfverify": []}
    differ = 0
    for rnd in range(args.rounds):
        order = [("official", official), ("nfverify", ours)]
        if rnd % 2:
            order.reverse()
        got = {}
        for name, fn in order:
            c, w, v = timed(fn)
            cpu[name].append(c)
            wall[name].append(w)
            got[name] = v
        differ = max(differ, sum(a != b for a, b in zip(got["official"], got["nfverify"], strict=True)))
        print(f"round {rnd + 1}: official {cpu['official'][-1]:.3f} CPU-s {wall['official'][-1]:.3f} s, "
              f"nfverify {cpu['nfverify'][-1]:.3f} CPU-s {wall['nfverify'][-1]:.3f} s, "
              f"load {os.getloadavg()[0]:.2f}")
    gc.enable()
    co, cn = statistics.median(cpu["official"]), statistics.median(cpu["nfverify"])
    wo, wn = statistics.median(wall["official"]), statistics.median(wall["nfverify"])
    print(f"median CPU: official {co:.3f} s ({co / len(rows) * 1e6:.1f} us/candidate), nfverify {cn:.3f} s "
          f"({cn / len(rows) * 1e6:.1f} us/candidate), ratio {cn / co:.2f}")
    print(f"median wall: official {wo:.3f} s, nfverify {wn:.3f} s, ratio {wn / wo:.2f}")
    print(f"verdicts that differ: {differ} of {len(rows)}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
