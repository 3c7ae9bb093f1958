"""nfanalyze on outcome files of every shape, this checkout against another revision, side by side.

    python bench/analyzer_scale.py --baseline main --rounds 2 [--baseline-timeout 120] [--shapes ...]

Shapes (tasks x replicates x conditions, 20,000 resamples, one contrast asked: `--contrast c0:c1`):
paper scale (364 x 20 x 7), 1M rows as 3 conditions x 16,667 tasks x 20 replicates, 1M rows as
2,000 conditions x 250 tasks x 2 replicates, and 2M rows as 2,000 conditions x 500 tasks x 2 (the
shape that did not finish). Each nfanalyze is its own process (`readers_scale.measure`'s way:
CPU user + system, wall, peak RSS), its code from this checkout or from `--baseline` unpacked to
a temporary folder, the two interleaved round by round (the order alternating) so both see the
same load; the load average is printed with each. A baseline run past --baseline-timeout is
stopped and shown as such, with the CPU it had used by then. Where both finish, whether their JSON reports are byte for byte equal.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from readers_scale import unpack  # noqa: E402

SHAPES = {"paper": (364, 20, 7), "1M-3c": (16_667, 20, 3), "1M-2000c": (250, 2, 2000), "2M-2000c": (500, 2, 2000)}


def write_outcomes(path: Path, tasks: int, replicates: int, conditions: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    rows = 0
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["task_id", "condition", "replicate", "outcome"])
        for c in range(conditions):
            p = np.where(rng.random(tasks) < 0.3, rng.uniform(0.1, 0.9, tasks), (rng.random(tasks) < 0.7) * 1.0)
            y = (rng.random((tasks, replicates)) < p[:, None]).astype(int)
            w.writerows([f"T/{i}", f"c{c}", r, y[i, r]] for i in range(tasks) for r in range(replicates))
            rows += tasks * replicates
    return rows


def run(path: Path, out: Path, code: Path | None, timeout: float) -> dict[str, float]:
    """One nfanalyze process: CPU s, wall s, peak RSS MB; `stopped` 1.0 when it ran past `timeout`
    wall seconds (then its figures are what it had used when it was stopped)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    argv = [sys.executable, "-c", "from noisefloor.analyzer.cli import main; main()", "--outcomes", str(path),
            "--contrast", "c0:c1", "--json", str(out), "-q", "--no-progress"]
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    while True:
        pid, status, use = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - t > timeout:
            proc.kill()
            _, _, use = os.wait4(proc.pid, 0)
            return {"cpu": use.ru_utime + use.ru_stime, "wall": time.perf_counter() - t, "rss": use.ru_maxrss / 1024,
                    "stopped": 1.0}
        time.sleep(0.05)
    if status:
        raise RuntimeError(f"nfanalyze failed on {path}: {proc.stderr.read().decode()[-500:] if proc.stderr else ''}")
    return {"cpu": use.ru_utime + use.ru_stime, "wall": time.perf_counter() - t, "rss": use.ru_maxrss / 1024}


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _fmt(r: dict[str, float], timeout: float) -> str:
    stopped = f" (stopped at {timeout:.0f} s wall: not finished)" if r.get("stopped") else ""
    return f"{r['cpu']:.2f} CPU-s, {r['wall']:.2f} s wall, {r['rss']:.0f} MB{stopped}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default="main", help="git revision to compare against")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--baseline-timeout", type=float, default=120.0)
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nfanalyze-bench-") as tmp:
        base = unpack(a.baseline, Path(tmp) / "baseline")
        for shape in a.shapes.split(","):
            tasks, reps, conds = SHAPES[shape]
            path = Path(tmp) / f"{shape}.csv"
            n = write_outcomes(path, tasks, reps, conds)
            print(f"{shape}: {conds} conditions x {tasks} tasks x {reps} replicates = {n:,} rows", flush=True)
            for rnd in range(a.rounds):
                order = [("this", None), (a.baseline, base)]
                if rnd % 2:
                    order.reverse()
                got = {}
                for name, code in order:
                    limit = a.baseline_timeout if code is not None else 1800
                    got[name] = run(path, Path(tmp) / f"{name}.json", code, limit)
                    print(f"  round {rnd + 1} {name}: {_fmt(got[name], limit)}; load {_load()}", flush=True)
                mine, theirs = got["this"], got[a.baseline]
                if not mine.get("stopped") and not theirs.get("stopped"):
                    same = (Path(tmp) / "this.json").read_bytes() == (Path(tmp) / f"{a.baseline}.json").read_bytes()
                    print(f"  round {rnd + 1}: CPU ratio this/{a.baseline} {mine['cpu'] / theirs['cpu']:.2f}, wall "
                          f"{mine['wall'] / theirs['wall']:.2f}; reports {'identical' if same else 'DIFFER'}",
                          flush=True)


if __name__ == "__main__":
    main()
