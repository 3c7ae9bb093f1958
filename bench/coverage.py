"""Coverage of the analyzer's 95% intervals for w (and one contrast) in simulated studies with
known truth, where the task bootstrap alone fails: nearly deterministic conditions.

Each study draws N tasks: with probability `share` a task passes with probability p (a rare
flipper), otherwise it always passes (70%) or always fails. R replicates per task. Two targets:
- population: w = share x p (1 - p), the mean within-task variance of the task population;
- fixed tasks: the mean p_i (1 - p_i) of the study's own N tasks (replicates random, tasks fixed).
Methods: the joint task bootstrap alone (percentile, as seed 000 App. A.2), and noisefloor's
interval (`ladder.w_interval`: the bootstrap, its upper end raised, when fewer than 10 tasks
varied, to the larger of the exact flip-rate bound over the cells and the exact bound on the
share of tasks that vary times the largest variance per varying task). The contrast column is A (the regime) minus B (a replay-like
condition on the same tasks that never varies), whose truth is A's w; it uses the analysis'
rule for contrasts with a degenerate side (`analysis.contrast_bounds`). Budget intervals are budgets of the w interval's ends
(monotone in w), so their coverage is the w column's.

    python bench/coverage.py [--studies 1000] [--resamples 2000] [--seed 0] [--dependence 200] [--regimes I ...]

The second table validates the dependence diagnostic (its false alarms on reruns that are
independent given the instance, however much instances differ, and its power against run-level
dependence) beside the paired ratio, which only sees a drift.

Rates under 0.93 (0.90 in issue 43's rare-flipper regimes) are flagged with `!`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from noisefloor.analyzer.analysis import contrast_bounds  # noqa: E402
from noisefloor.analyzer.bootstrap import task_bootstrap  # noqa: E402
from noisefloor.analyzer.intervals import FEW_VARYING, percentile  # noqa: E402
from noisefloor.analyzer.ladder import TASK_BOOTSTRAP, task_variances, w_interval  # noqa: E402
from noisefloor.analyzer.simulate import RERUN_KINDS, reruns  # noqa: E402

# (N, R, share of flipping tasks, their pass probability): the four regimes of issue 26, then
# three with more variation, then issue 43's rare flippers that flip often when they exist
# (a study may draw none of them: the interval must still bound the population)
REGIMES = [(10, 5, 0.05, 0.05), (37, 7, 0.05, 0.05), (37, 20, 0.05, 0.05), (150, 10, 0.05, 0.05),
           (37, 7, 0.3, 0.3), (150, 10, 0.2, 0.05), (37, 20, 0.3, 0.1),
           *((n, 20, share, p) for n in (37, 364) for p in (0.3, 0.5) for share in (0.008, 0.02, 0.05))]
RARE = 7  # REGIMES[RARE:] are issue 43's: at least 0.90 there, 0.93 in the others


def study(n: int, r: int, share: float, p: float, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    flippy = rng.random(n) < share
    probs = np.where(flippy, p, (rng.random(n) < 0.7).astype(float))
    y = (rng.random((n, r)) < probs[:, None]).astype(float)
    return y, float((probs * (1 - probs)).mean())


def run(regime: tuple[int, int, float, float], studies: int, resamples: int, seed: int,
        few: int = FEW_VARYING) -> dict[str, float]:
    n, r, share, p = regime
    rng = np.random.default_rng([seed, n, r, round(share * 1000), round(p * 100)])
    pop = share * p * (1 - p)
    hits = dict.fromkeys(("boot_pop", "boot_fixed", "nf_pop", "nf_fixed", "boot_contrast", "nf_contrast"), 0)
    zero = widened = 0
    for i in range(studies):
        y, fixed = study(n, r, share, p, rng)
        replay = np.repeat(y[:, :1], r, axis=1)  # the same tasks, one recorded outcome each, never varying
        s2a, s2b = task_variances(y), task_variances(replay)
        draws = task_bootstrap({"a": s2a, "b": s2b}, resamples, seed=i)
        boot = draws.ci("a")
        wi, wb = w_interval(y, boot, few=few), w_interval(replay, draws.ci("b"), few=few)
        cboot = percentile(draws.values["a"] - draws.values["b"])
        if wi.method == TASK_BOOTSTRAP and wb.method == TASK_BOOTSTRAP:
            cnf = cboot
        else:
            cnf = contrast_bounds(cboot, wi, wb)
        for name, ci, truth in (("boot_pop", boot, pop), ("boot_fixed", boot, fixed), ("nf_pop", wi.ci, pop),
                                ("nf_fixed", wi.ci, fixed), ("boot_contrast", cboot, pop), ("nf_contrast", cnf, pop)):
            hits[name] += ci.low <= truth <= ci.high
        zero += boot == (0.0, 0.0)
        widened += wi.method != TASK_BOOTSTRAP
    out = {k: v / studies for k, v in hits.items()}
    out.update(zero=zero / studies, widened=widened / studies, truth=pop)
    return out


def dependence_table(studies: int, seed: int) -> None:
    """How often the permutation diagnostic calls the reruns dependent, and the trend ratio."""
    from noisefloor.analyzer import floors

    print(f"\nDependence diagnostic, 150 x 10 reruns, {studies} studies per kind (1,000 permutations each):")
    print("| runs | dependent between runs | mean run correlation | called dependent (p < 0.05) "
          "| paired / (sqrt2 x marginal), mean [5%, 95%] |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(seed)
    for kind, (what, truth) in RERUN_KINDS.items():
        dep, corr, ratio = [], [], []
        for i in range(studies):
            f = floors.rerun_floor(reruns(kind, rng), resamples=1, seed=i)
            dep.append(bool(f.dependence.dependent))
            corr.append(f.dependence.mean_correlation)
            ratio.append(f.paired_to_marginal)
        lo, hi = np.percentile(ratio, [5, 95])
        print(f"| {kind}: {what} | {'yes' if truth else 'no'} | {np.mean(corr):.3f} | {np.mean(dep):.1%} "
              f"| {np.mean(ratio):.3f} [{lo:.3f}, {hi:.3f}] |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--studies", type=int, default=1000, help="studies per regime for the coverage table (0: skip)")
    ap.add_argument("--resamples", type=int, default=2000, help="task-bootstrap resamples per study")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dependence", type=int, default=200, help="studies per kind for the dependence table (0: skip)")
    ap.add_argument("--regimes", type=int, nargs="*", help="indices into REGIMES to run (default: all)")
    ap.add_argument("--few", type=int, default=FEW_VARYING, help="varying tasks below which the exact bound joins in")
    a = ap.parse_args()
    start = time.perf_counter()
    if a.studies:
        coverage_table(a)
    if a.dependence:
        dependence_table(a.dependence, a.seed)
    print(f"({time.perf_counter() - start:.0f} s)")


def coverage_table(a: argparse.Namespace) -> None:
    print(f"{a.studies} studies per regime, {a.resamples} task-bootstrap resamples each; 95% intervals; "
          f"Monte-Carlo SE about {np.sqrt(0.95 * 0.05 / a.studies):.3f}")
    print("| N x R | flippers (share, p) | true w | bootstrap [0,0] | widened | bootstrap: population / fixed "
          "| noisefloor: population / fixed | contrast vs replay: bootstrap / noisefloor |")
    print("|---|---|---|---|---|---|---|---|")
    for i in a.regimes if a.regimes is not None else range(len(REGIMES)):
        regime = REGIMES[i]
        o = run(regime, a.studies, a.resamples, a.seed, a.few)
        n, r, share, p = regime
        need = 0.90 if i >= RARE else 0.93

        def c(x: float, need: float = need) -> str:
            return f"{x:.3f}" + ("" if x >= need else " !")

        print(f"| {n} x {r} | {share:g}, {p:g} | {o['truth']:.5f} | {o['zero']:.0%} | {o['widened']:.0%} "
              f"| {o['boot_pop']:.3f} / {o['boot_fixed']:.3f} | {c(o['nf_pop'])} / {c(o['nf_fixed'])} "
              f"| {o['boot_contrast']:.3f} / {c(o['nf_contrast'])} |", flush=True)


if __name__ == "__main__":
    main()
