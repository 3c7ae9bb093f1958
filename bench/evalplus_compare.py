"""nfverify against the EvalPlus evaluator itself, on the same HumanEval+ or MBPP+ tasks capped at
120 inputs: wall and CPU time for every canonical solution (the same number of workers each), cold
once and then warm in interleaved rounds, and per-candidate agreement on mutated canonical solutions.

EvalPlus pulls in large dependencies, so it lives in its own virtual environment:

    python3 -m venv /tmp/evalvenv && /tmp/evalvenv/bin/pip install evalplus==0.3.1
    python bench/evalplus_compare.py --evalplus-python /tmp/evalvenv/bin/python --suite mbpp+ --rounds 3

Each warm round runs both tools one after the other, the order alternating between rounds; CPU is
the tool's process and every process it waited for (getrusage of this script's children), and the
load average is printed with each round: on a shared machine compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import os
import resource
import statistics
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
            if isinstance(r["plus_input"], list):  # MBPP+ has one task whose plus_input is {}
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


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall, CPU) seconds of a command and the processes it waited for."""
    c0, start = _children_cpu(), time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, _children_cpu() - c0


def run_nfverify(suite: str, samples: Path, dataset: Path, out: Path, workers: int, env: dict) -> tuple[float, float]:
    out.unlink(missing_ok=True)
    return _timed([str(Path(sys.executable).with_name("nfverify")), suite, "--samples", str(samples),
                   "--dataset", str(dataset), "--outcomes", str(out), "-j", str(workers)], env)


def run_evalplus(py: str, suite: str, samples: Path, dataset: Path, workers: int,
                 env: dict) -> tuple[float, float, dict]:
    result = Path(str(samples).replace(".jsonl", "_eval_results.json"))
    result.unlink(missing_ok=True)  # otherwise EvalPlus stops to ask whether to overwrite it
    name, override = EVALPLUS[suite]
    wall, cpu = _timed([py, "-m", "evalplus.evaluate", "--dataset", name, "--samples", str(samples),
                        "--parallel", str(workers), "--i-just-wanna-run"], {**env, override: str(dataset)})
    return wall, cpu, json.loads(result.read_text())["eval"]


EVALPLUS = {"humaneval+": ("humaneval", "HUMANEVAL_OVERRIDE_PATH"), "mbpp+": ("mbpp", "MBPP_OVERRIDE_PATH")}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--evalplus-python", required=True)
    ap.add_argument("--suite", choices=sorted(EVALPLUS), default="humaneval+")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cap", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=3, help="warm rounds, each tool once a round, interleaved")
    ap.add_argument("--no-agreement", action="store_true", help="skip the mutants' per-candidate agreement")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nf-evalplus-"))
    env = {**os.environ, "NF_CACHE_DIR": str(tmp / "nfcache"), "XDG_CACHE_HOME": str(tmp / "xdg")}
    dataset = tmp / f"{a.suite.rstrip('+')}-cap.jsonl.gz"
    rows = capped_dataset(locate(a.suite), dataset, a.cap)
    canon = [(r["task_id"], (r["prompt"] if a.suite == "humaneval+" else "") + r["canonical_solution"]) for r in rows]

    samples = tmp / "canonical.jsonl"
    write_samples(samples, canon)
    print(f"{len(canon)} canonical {a.suite} solutions, {a.cap}-input cap, {a.workers} workers; load {_load()}")
    nf = run_nfverify(a.suite, samples, dataset, tmp / "nf.jsonl", a.workers, env)
    ep = run_evalplus(a.evalplus_python, a.suite, samples, dataset, a.workers, env)[:2]
    print(f"  cold (reference outputs computed): nfverify {nf[0]:.1f} s wall {nf[1]:.1f} CPU-s, EvalPlus "
          f"{ep[0]:.1f} s wall {ep[1]:.1f} CPU-s, ratio wall {nf[0] / ep[0]:.2f} CPU {nf[1] / ep[1]:.2f}; load {_load()}")
    warm: dict[str, list[tuple[float, float]]] = {"nfverify": [], "EvalPlus": []}
    passed: dict[str, int] = {}
    for rnd in range(a.rounds):  # warm: both tools reuse their reference outputs
        order = ["nfverify", "EvalPlus"] if rnd % 2 == 0 else ["EvalPlus", "nfverify"]
        for tool in order:
            if tool == "nfverify":
                warm[tool].append(run_nfverify(a.suite, samples, dataset, tmp / "nf.jsonl", a.workers, env))
                passed[tool] = sum(json.loads(line)["outcome"] for line in (tmp / "nf.jsonl").read_text().splitlines())
            else:
                wall, cpu, ev = run_evalplus(a.evalplus_python, a.suite, samples, dataset, a.workers, env)
                warm[tool].append((wall, cpu))
                passed[tool] = sum(r["base_status"] == "pass" and r["plus_status"] == "pass"
                                   for rs in ev.values() for r in rs)
        n, e = warm["nfverify"][-1], warm["EvalPlus"][-1]
        print(f"  warm round {rnd + 1} ({order[0]} first): nfverify {n[0]:.1f} s wall {n[1]:.1f} CPU-s "
              f"({passed['nfverify']} pass), EvalPlus {e[0]:.1f} s wall {e[1]:.1f} CPU-s ({passed['EvalPlus']} pass), "
              f"ratio wall {n[0] / e[0]:.2f} CPU {n[1] / e[1]:.2f}; load {_load()}")
    med = {t: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for t, v in warm.items()}
    print(f"  warm medians: nfverify {med['nfverify'][0]:.1f} s wall {med['nfverify'][1]:.1f} CPU-s, EvalPlus "
          f"{med['EvalPlus'][0]:.1f} s wall {med['EvalPlus'][1]:.1f} CPU-s; ratio wall "
          f"{med['nfverify'][0] / med['EvalPlus'][0]:.2f}, CPU {med['nfverify'][1] / med['EvalPlus'][1]:.2f}")
    if a.no_agreement:
        return

    kinds, pool = [], list(canon)
    for tid, code in canon:
        for kind, m in mutants(code):
            pool.append((tid, m))
            kinds.append(kind)
    kinds = ["canonical"] * len(canon) + kinds
    samples = tmp / "mutants.jsonl"
    write_samples(samples, pool)
    run_nfverify(a.suite, samples, dataset, tmp / "nfm.jsonl", a.workers, env)
    ours = [json.loads(line) for line in (tmp / "nfm.jsonl").read_text().splitlines()]
    theirs = run_evalplus(a.evalplus_python, a.suite, samples, dataset, a.workers, env)[2]
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
