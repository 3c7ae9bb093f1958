"""nfverify against the EvalPlus evaluator itself, on the same HumanEval+ tasks capped at 120 inputs:
wall time for the 164 canonical solutions (2 workers each), and per-candidate agreement on
mutated canonical solutions.

EvalPlus pulls in large dependencies, so it lives in its own virtual environment:

    python3 -m venv /tmp/evalvenv && /tmp/evalvenv/bin/pip install evalplus==0.3.1
    python bench/evalplus_compare.py --evalplus-python /tmp/evalvenv/bin/python
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from noisefloor.verifier.datasets import locate  # noqa: E402


def capped_dataset(src: Path, dst: Path, cap: int) -> list[dict]:
    """The same tasks with base inputs first and plus inputs cut so that both tools see `cap`."""
    rows = [json.loads(line) for line in gzip.open(src, "rt")]
    with gzip.open(dst, "wt") as fh:
        for r in rows:
            room = max(0, cap - len(r["base_input"]))
            r["base_input"] = r["base_input"][:cap]
            r["plus_input"] = r["plus_input"][:room]
            fh.write(json.dumps(r) + "\n")
    return rows


def mutants(code: str) -> list[tuple[str, str]]:
    out = []

    class Wrap(ast.NodeTransformer):
        def visit_Return(self, node: ast.Return) -> ast.Return:
            if node.value is not None:
                node.value = ast.List([node.value], ast.Load())
            return node

    out.append(("wrapped", ast.unparse(Wrap().visit(ast.parse(code)))))
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value in (0, 1, 2):
            node.value += 1
            out.append(("off_by_one", ast.unparse(tree)))
            break
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            node.test = ast.UnaryOp(ast.Not(), node.test)
            out.append(("negated_if", ast.unparse(tree)))
            break
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.Lt, ast.Gt, ast.LtE, ast.GtE)):
            swap = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
            node.ops[0] = swap[type(node.ops[0])]()
            out.append(("boundary", ast.unparse(tree)))
            break
    return out


def write_samples(path: Path, samples: list[tuple[str, str]]) -> None:
    with path.open("w") as fh:
        for tid, sol in samples:
            fh.write(json.dumps({"task_id": tid, "solution": sol}) + "\n")


def run_nfverify(samples: Path, dataset: Path, out: Path, workers: int, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([str(Path(sys.executable).with_name("nfverify")), "humaneval+", "--samples", str(samples),
                    "--dataset", str(dataset), "--outcomes", str(out), "-j", str(workers)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def run_evalplus(py: str, samples: Path, dataset: Path, workers: int, env: dict) -> tuple[float, dict]:
    result = Path(str(samples).replace(".jsonl", "_eval_results.json"))
    result.unlink(missing_ok=True)  # otherwise EvalPlus stops to ask whether to overwrite it
    start = time.perf_counter()
    subprocess.run([py, "-m", "evalplus.evaluate", "--dataset", "humaneval", "--samples", str(samples),
                    "--parallel", str(workers), "--i-just-wanna-run"], check=True,
                   env={**env, "HUMANEVAL_OVERRIDE_PATH": str(dataset)}, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    return wall, json.loads(result.read_text())["eval"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--evalplus-python", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cap", type=int, default=120)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nf-evalplus-"))
    env = {**os.environ, "NF_CACHE_DIR": str(tmp / "nfcache"), "XDG_CACHE_HOME": str(tmp / "xdg")}
    dataset = tmp / "HumanEvalPlus-cap.jsonl.gz"
    rows = capped_dataset(locate("humaneval+"), dataset, a.cap)
    canon = [(r["task_id"], r["prompt"] + r["canonical_solution"]) for r in rows]

    samples = tmp / "canonical.jsonl"
    write_samples(samples, canon)
    times = {}
    for label in ("cold", "warm"):  # cold: reference outputs computed; warm: both tools reuse their caches
        times[("nfverify", label)] = run_nfverify(samples, dataset, tmp / "nf.jsonl", a.workers, env)
        times[("evalplus", label)], _ = run_evalplus(a.evalplus_python, samples, dataset, a.workers, env)
    print(f"164 canonical HumanEval+ solutions, {a.cap}-input cap, {a.workers} workers, wall seconds")
    for label in ("cold", "warm"):
        nf, ep = times[("nfverify", label)], times[("evalplus", label)]
        print(f"  {label}: nfverify {nf:.1f} s, EvalPlus {ep:.1f} s, ratio nfverify/EvalPlus {nf / ep:.2f}")

    kinds, pool = [], list(canon)
    for tid, code in canon:
        for kind, m in mutants(code):
            pool.append((tid, m))
            kinds.append(kind)
    kinds = ["canonical"] * len(canon) + kinds
    samples = tmp / "mutants.jsonl"
    write_samples(samples, pool)
    run_nfverify(samples, dataset, tmp / "nfm.jsonl", a.workers, env)
    ours = [json.loads(line) for line in (tmp / "nfm.jsonl").read_text().splitlines()]
    _, theirs = run_evalplus(a.evalplus_python, samples, dataset, a.workers, env)
    seen: dict[str, int] = {}
    agree, rows_out = 0, []
    for (tid, _), kind, mine in zip(pool, kinds, ours):
        k = seen.get(tid, 0)
        seen[tid] = k + 1
        ep = theirs[tid][k]
        ep_pass = ep["base_status"] == "pass" and ep["plus_status"] == "pass"
        same = bool(mine["outcome"]) == ep_pass
        agree += same
        if not same:
            rows_out.append((tid, kind, mine["failure"], ep["base_status"], ep["plus_status"]))
    print(f"\nper-candidate agreement on {len(pool)} candidates ({len(canon)} canonical + mutants): "
          f"{agree}/{len(pool)} = {agree / len(pool):.4f}")
    for r in rows_out:
        print("  disagreement:", *r)


if __name__ == "__main__":
    main()
