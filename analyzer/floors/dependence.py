"""Do two reruns of one instance go together beyond chance? A permutation test of the mean run
correlation; not a report section of its own (the rerun floor shows it)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from noisefloor.analyzer.bootstrap import block_sizes
from noisefloor.analyzer.floors import arrays
from noisefloor.analyzer.intervals import Interval, percentile
from noisefloor.analyzer.matrices import runs_matrix

PERMUTATIONS = 1000


@dataclass(frozen=True)
class Dependence:
    """The paired / (sqrt(2) x marginal) ratio cannot say whether reruns depend on each other:
    with P run pairs, d the pairwise aggregate differences (mean dbar) and s the marginal SD,
    ratio^2 = P/(P-1) - P dbar^2 / (2 (P-1) s^2), so it is about 1 for any exchangeable runs however
    strongly they agree, and falls only with a trend across run order. This asks the other
    question: the mean pairwise run correlation against its permutation distribution under
    independent runs (each run's outcomes shuffled across instances independently, keeping every
    run's accuracy)."""

    mean_correlation: float | None
    ci: Interval | None  # instance bootstrap
    null: Interval | None  # central 95% of the permutation distribution
    null_mean: float | None
    p_value: float | None  # one-sided: (1 + #{permuted >= observed}) / (1 + permutations)
    permutations: int
    dependent: bool | None  # p_value < alpha; None when undefined
    reason: str  # the verdict in words, or why it is undefined


def _null(m: np.ndarray, permutations: int, seed: int) -> np.ndarray:
    """The mean run correlation of `permutations` independent shuffles of every run. Shuffling a
    run across instances keeps its mean and SD, so only the cross products change:
    r_ab = (x_a . x_b / N - mu_a mu_b) / (sd_a sd_b) over the run pairs with no constant run."""
    n, r = m.shape
    mu, sd = m.mean(axis=0), m.std(axis=0)
    a, b = np.triu_indices(r, 1)
    ok = (sd[a] > 0) & (sd[b] > 0)
    a, b = a[ok], b[ok]
    rng = np.random.default_rng(np.random.SeedSequence([seed, 3]))
    vals = []
    for k in block_sizes(permutations, n * r):
        shuffled = rng.permuted(np.broadcast_to(m, (k, n, r)), axis=1)
        gram = np.matmul(shuffled.transpose(0, 2, 1), shuffled)
        vals.append(((gram[:, a, b] / n - mu[a] * mu[b]) / (sd[a] * sd[b])).mean(axis=1))
    null = np.concatenate(vals)
    return null[~np.isnan(null)]


def dependence(m: np.ndarray, ci: Interval | None = None, permutations: int = PERMUTATIONS, seed: int = 0,
               alpha: float = 0.05) -> Dependence:
    """The permutation test of `Dependence` for an instances x runs matrix."""
    m = runs_matrix(m, 2)
    obs = float(arrays.mean_correlation(m))
    if np.isnan(obs):
        return Dependence(None, None, None, None, None, permutations, None,
                          "undefined: every run is constant across instances (no run pair has a correlation)")
    null = _null(m, permutations, seed)
    p = float((1 + (null >= obs - 1e-12).sum()) / (1 + null.size))
    dep = p < alpha
    band = percentile(null, alpha)
    why = (f"dependent: run correlation {obs:.3f} above independent runs' {band.high:.3f} "
           f"(permutation p = {p:.3g})" if dep else
           f"no evidence of dependence: run correlation {obs:.3f} within independent runs' range (p = {p:.3g})")
    return Dependence(obs, ci, band, float(null.mean()), p, int(null.size), dep, why)
