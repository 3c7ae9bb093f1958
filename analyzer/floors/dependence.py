"""Do reruns depend on each other beyond what each instance's own pass rate explains? A
permutation test whose null keeps every instance's outcomes (so its pass rate) and only their
order across runs: not a report section of its own (the rerun floor shows it)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from noisefloor.analyzer.bootstrap import block_sizes
from noisefloor.analyzer.floors import arrays
from noisefloor.analyzer.intervals import Interval
from noisefloor.analyzer.matrices import runs_matrix

PERMUTATIONS = 1000

# the statistics, each large under one kind of run-level dependence
SPREAD = "run_spread"  # variance of the runs' accuracies: a shared run effect (a good or bad run, a drift)
DUPLICATE = "closest_pair"  # the most outcomes any two runs share: a duplicated run
STICKY = "adjacent_agreement"  # outcomes shared by consecutive runs: a rerun that repeats the one before
KINDS = (SPREAD, DUPLICATE, STICKY)


@dataclass(frozen=True)
class DependenceCheck:
    """One statistic against its permutation distribution."""

    name: str
    observed: float
    null_mean: float
    null: Interval  # central 95% of the permutation distribution
    p_value: float  # one-sided: (1 + #{permuted >= observed}) / (1 + permutations)


@dataclass(frozen=True)
class Dependence:
    """Whether an instances x runs matrix shows run-level dependence.

    The null is exchangeable runs given the instance: each instance's outcomes are permuted across
    runs independently, which keeps every instance's pass rate (easy and hard instances are not
    dependence). Three statistics see three departures: the spread of the runs' accuracies (a run
    effect shared by the instances), the largest agreement of any two runs (a duplicated run) and
    the agreement of consecutive runs (sticky reruns). Their permutation p-values are combined by
    their minimum, itself referred to the minimum's permutation distribution, so the combined test
    keeps its level. The mean run correlation is reported beside it; under this null it is fixed
    by the instances' pass rates and says how much instances differ, not whether runs depend.
    """

    mean_correlation: float | None
    ci: Interval | None  # instance bootstrap of the mean run correlation
    checks: tuple[DependenceCheck, ...]
    p_value: float | None  # the combined (min-p) permutation p-value
    permutations: int
    dependent: bool | None  # p_value < alpha; None when undefined
    reason: str  # the verdict in words, or why it is undefined


def statistics(m: np.ndarray) -> np.ndarray:
    """The three statistics of KINDS for a stack (..., N, R) of 0/1 matrices, shape (..., 3)."""
    n, r = m.shape[-2:]
    acc = m.mean(axis=-2)
    spread = acc.var(axis=-1)
    gram = np.matmul(np.swapaxes(m, -1, -2), m)  # (..., R, R): both-pass counts
    s = m.sum(axis=-2)
    agree = n - s[..., :, None] - s[..., None, :] + 2 * gram  # (..., R, R): cells where runs a and b agree
    a, b = np.triu_indices(r, 1)
    closest = agree[..., a, b].max(axis=-1)
    adjacent = (m[..., :, 1:] == m[..., :, :-1]).sum(axis=(-2, -1))
    return np.stack([spread, closest, adjacent.astype(float)], axis=-1)


def _permuted(m: np.ndarray, permutations: int, seed: int) -> np.ndarray:
    """The statistics of `permutations` matrices whose every row is shuffled on its own; rows that
    never vary are the same under any shuffle and are left as they are."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 3]))
    vals = []
    varying = m.min(axis=1) != m.max(axis=1)
    for k in block_sizes(permutations, m.size):
        stack = np.broadcast_to(m, (k, *m.shape)).copy()
        stack[:, varying] = rng.permuted(stack[:, varying], axis=2)
        vals.append(statistics(stack))
    return np.concatenate(vals)


def _upper_p(null: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(1 + #{null >= x}) / (1 + len(null)) for each x, with a tolerance for float ties."""
    s = np.sort(null)
    return (1 + s.size - np.searchsorted(s, x - 1e-9, side="left")) / (1 + s.size)


def dependence(m: np.ndarray, ci: Interval | None = None, permutations: int = PERMUTATIONS, seed: int = 0,
               alpha: float = 0.05) -> Dependence:
    """The permutation test of `Dependence` for an instances x runs matrix."""
    m = runs_matrix(m, 2)
    corr = float(arrays.mean_correlation(m))
    known = None if np.isnan(corr) else corr
    if not (m.min(axis=1) != m.max(axis=1)).any():
        return Dependence(known, ci, (), None, permutations, None,
                          "undefined: no instance's outcome changed across runs, so no order of them can differ")
    obs = statistics(m)
    null = _permuted(m, permutations, seed)  # (B, 3)
    p_obs = np.array([_upper_p(null[:, j], obs[j]) for j in range(len(KINDS))])
    p_null = np.column_stack([_upper_p(null[:, j], null[:, j]) for j in range(len(KINDS))]).min(axis=1)
    p = float((1 + (p_null <= p_obs.min() + 1e-12).sum()) / (1 + null.shape[0]))
    checks = tuple(DependenceCheck(name, float(obs[j]), float(null[:, j].mean()),
                                   Interval(*map(float, np.percentile(null[:, j], [2.5, 97.5]))), float(p_obs[j]))
                   for j, name in enumerate(KINDS))
    dep = p < alpha
    words = {SPREAD: "the runs' accuracies spread more than shuffles do (a run effect)",
             DUPLICATE: "two runs agree more than shuffles do (a duplicated run)",
             STICKY: "consecutive runs agree more than shuffles do (sticky reruns)"}
    if dep:
        worst = min(checks, key=lambda c: c.p_value)
        why = f"dependent: {words[worst.name]} (combined permutation p = {p:.3g})"
    else:
        why = f"no evidence of run-level dependence given each instance's pass rate (combined permutation p = {p:.3g})"
    return Dependence(known, ci, checks, p, int(null.shape[0]), dep, why)
