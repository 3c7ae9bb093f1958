"""The interval type every statistic reports, and the two ways this package makes one: the
percentile interval of bootstrap draws and the exact binomial (Clopper-Pearson) interval, which
is scipy's `binomtest(...).proportion_ci(method="exact")`."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats

from noisefloor.errors import InputError


class Interval(NamedTuple):
    """A two-sided interval; a tuple, so it unpacks as (lo, hi) and serializes as [lo, hi]."""

    lo: float
    hi: float


def percentile(draws: np.ndarray, alpha: float = 0.05) -> Interval:
    lo, hi = np.percentile(draws, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return Interval(float(lo), float(hi))


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> Interval:
    """Exact binomial interval for k successes in n trials."""
    if n <= 0 or not 0 <= k <= n:
        raise InputError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=1 - alpha, method="exact")
    return Interval(float(ci.low), float(ci.high))
