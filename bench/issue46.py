"""Every comparison of the performance round, side by side, in one command.

Each step is one of the comparison benches, run as its own process with this interpreter (give
another with `--python`, e.g. a Python 3.13 virtual environment for the mitmproxy 12 line); each
bench itself interleaves its two sides round by round and prints CPU and wall. This runner prints
the load average before and after every step and the step's exit status, and writes what each
printed to `--out`:

    python bench/issue46.py --out /tmp/issue46 [--only record,stream] [--python .venv313/bin/python]
        [--gorilla-git DIR] [--evalplus-python PY]

A step whose prerequisite is absent (the official BFCL checker's checkout, EvalPlus's venv) is
skipped with the reason. Steps, in order:

  record    nfproxy record vs `mitmdump -w` vs passthrough: CPU per request and p50 (proxy_latency)
  stream    a replayed stream's first chunk vs a direct connection (stream_latency)
  merge     20 sequential merges of 10k-exchange shards, each against the first (merge_scale)
  bfcl      BFCL grading vs the official checker, CPU and verdicts (bfcl_vs_official)
  mbpp      MBPP+ warm wall vs EvalPlus at equal workers (evalplus_compare)
  analyzer  nfanalyze on 1M and 2M rows of every shape vs a baseline revision (analyzer_scale)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def steps(args: argparse.Namespace) -> dict[str, tuple[list[str], str | None]]:
    """Each step's argv after the interpreter, and why it cannot run here (None: it can)."""
    gorilla = args.gorilla_git
    evalplus = args.evalplus_python
    return {
        "record": (["bench/proxy_latency.py", "--only", "direct,mitmdump -w,nfproxy passthrough,nfproxy record",
                    "--baseline", args.baseline, "--rounds", "8", "--requests", "2400", "--concurrency", "0"], None),
        "stream": (["bench/stream_latency.py", "--rounds", "40"], None),
        "merge": (["bench/merge_scale.py", "--keep", str(args.out / "merge"), "--sequential", "20", "--shard", "10000",
                   "--baseline", args.baseline], None),
        "bfcl": (["bench/bfcl_vs_official.py", "--gorilla-git", str(gorilla), "--scratch", str(args.out / "bfcl"),
                  "--rounds", "3"],
                 None if gorilla and Path(gorilla).is_dir() else "no --gorilla-git checkout of the official checker"),
        "mbpp": (["bench/evalplus_compare.py", "--evalplus-python", str(evalplus), "--suite", "mbpp+", "--rounds", "3"],
                 None if evalplus and Path(evalplus).exists() else "no --evalplus-python with EvalPlus installed"),
        "analyzer": (["bench/analyzer_scale.py", "--baseline", args.baseline, "--rounds", "2"], None),
    }


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="a folder for each step's output")
    ap.add_argument("--only", help="comma-separated steps (default: all)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter each bench runs under")
    ap.add_argument("--gorilla-git", help="a checkout of ShishirPatil/gorilla (the official BFCL checker)")
    ap.add_argument("--evalplus-python", help="an interpreter with evalplus installed")
    ap.add_argument("--baseline", default="main", help="the git revision the record, merge and analyzer steps "
                                                       "run beside this checkout")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    table = steps(args)
    chosen = args.only.split(",") if args.only else list(table)
    unknown = [s for s in chosen if s not in table]
    if unknown:
        ap.error(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(table)}")
    failed = 0
    for name in chosen:
        argv, missing = table[name]
        if missing:
            print(f"== {name}: skipped ({missing})", flush=True)
            continue
        print(f"== {name}: {' '.join(argv)}  (load {_load()})", flush=True)
        started = time.monotonic()
        with (args.out / f"{name}.txt").open("w") as log:
            proc = subprocess.Popen([args.python, *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
            assert proc.stdout is not None
            for line in proc.stdout:  # shown as it comes: a step takes minutes
                print(f"   {line}", end="", flush=True)
                log.write(line)
            rc = proc.wait()
        failed += rc != 0
        print(f"== {name}: exit {rc} after {time.monotonic() - started:.0f} s  (load {_load()})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
