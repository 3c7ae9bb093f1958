"""The gate's time on a suite: verdicts plus operating characteristics (per-case and suite
risks, and the repeats per run that bring the suite's false-block rate under 5%), against the
verdicts alone in the same run.

    python bench/gate_speed.py [--cases 10 50 200] [--seed 0]

Each suite has cases at pass rates drawn from U(0.1, 0.95), three runs of k=8 each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from noisefloor.analyzer import gate as g  # noqa: E402
from noisefloor.analyzer import gate_run  # noqa: E402


def suite(cases: int, rng: np.random.Generator) -> list[dict[str, g.CaseCounts]]:
    rates = rng.uniform(0.1, 0.95, cases)
    return [{f"c{i}": g.CaseCounts(int(rng.binomial(8, r)), 8) for i, r in enumerate(rates)} for _ in range(3)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, nargs="+", default=[10, 50, 200])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    g.case_verdict("warm", g.CaseCounts(1, 2), g.CaseCounts(1, 2), g.CaseCounts(1, 2))  # scipy's import, once
    print("| cases | verdicts alone (s) | gate with operating characteristics (s) | ratio | repeats for 5% |")
    print("|---|---|---|---|---|")
    for n in a.cases:
        a_, b_, c_ = suite(n, rng)
        t0 = time.perf_counter()
        g.gate(a_, b_, c_)
        t1 = time.perf_counter()
        if hasattr(g, "_risk"):
            g._risk.cache_clear()  # each suite from cold
        res = gate_run.run_counts(a_, b_, c_, g.GateSettings())
        t2 = time.perf_counter()
        print(f"| {n} | {t1 - t0:.3f} | {t2 - t1:.3f} | {(t2 - t1) / (t1 - t0):.0f} | "
              f"{res.operating_characteristics.repeats_for_target} |", flush=True)


if __name__ == "__main__":
    main()
