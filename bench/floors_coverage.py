"""Coverage of the floors' rerun SD intervals (the instance bootstrap centred on its estimate,
beside the plain percentile interval of the same draws) in simulated reruns with known truth.

Each study has N instances x R runs; 30% of instances pass with a probability from U(0.2, 0.8),
the rest always pass (70%) or always fail. Two targets, each the mean of the statistic over 3,000
simulated studies: fixed instances (one drawn set of instances, reruns random) and the instance
population (instances drawn afresh each study).

    python bench/floors_coverage.py [--n 150] [--runs 10] [--studies 200] [--resamples 500]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from noisefloor.analyzer.bootstrap import canonical_order, index_blocks, instance_bootstrap  # noqa: E402
from noisefloor.analyzer.floors import arrays  # noqa: E402
from noisefloor.analyzer.intervals import percentile  # noqa: E402

STATS = {"paired_sd": arrays.paired_sd, "unit_paired_sd": arrays.unit_paired_sd}


def stat(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: f(a["main"]) for k, f in STATS.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=150)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--studies", type=int, default=200)
    ap.add_argument("--resamples", type=int, default=500)
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)

    def rates() -> np.ndarray:
        return np.where(rng.random(a.n) < 0.3, rng.uniform(0.2, 0.8, a.n), (rng.random(a.n) < 0.7).astype(float))

    def sim(p: np.ndarray) -> np.ndarray:
        return (rng.random((a.n, a.runs)) < p[:, None]).astype(float)

    fixed = rates()
    truth = {"fixed": {k: np.mean([float(stat({"main": sim(fixed)})[k]) for _ in range(3000)]) for k in STATS},
             "population": {k: np.mean([float(stat({"main": sim(rates())})[k]) for _ in range(3000)]) for k in STATS}}
    hits = {(t, k, m): 0 for t in truth for k in STATS for m in ("centred", "percentile")}
    for i in range(a.studies):
        for target in truth:
            y = sim(fixed if target == "fixed" else rates())
            ci, _ = instance_bootstrap({"main": y}, stat, a.resamples, i)
            ys = y[canonical_order(y)]  # the same draws instance_bootstrap made
            draws = {k: np.concatenate([stat({"main": ys[idx]})[k] for idx in index_blocks(a.n, a.resamples, i, y.size)])
                     for k in STATS}
            for k in STATS:
                hits[(target, k, "centred")] += ci[k].covers(truth[target][k])
                hits[(target, k, "percentile")] += percentile(draws[k]).covers(truth[target][k])
    print(f"{a.n} x {a.runs}, {a.studies} studies, {a.resamples} resamples; Monte-Carlo SE about "
          f"{np.sqrt(0.95 * 0.05 / a.studies):.3f}")
    print("| statistic | target | centred (reported) | plain percentile |")
    print("|---|---|---|---|")
    for k in STATS:
        for t in truth:
            print(f"| {k} | {t} | {hits[(t, k, 'centred')] / a.studies:.3f} | {hits[(t, k, 'percentile')] / a.studies:.3f} |")


if __name__ == "__main__":
    main()
