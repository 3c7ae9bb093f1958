"""Array helpers the floors statistics share: run pairs, an SD that is exactly 0 for equal
values, a ratio that keeps x/0 and 0/0 apart, and the mean run correlation. Every function works
on a stack of resampled matrices (..., N, R); the point estimate is the stack of one."""

from __future__ import annotations

from itertools import combinations

import numpy as np


def pairs(r: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (a, b) of every run pair a < b."""
    a, b = zip(*combinations(range(r), 2))
    return np.array(a), np.array(b)


def sd(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """ddof=1 SD along `axis`; exactly 0 where every value is the same (numpy leaves float residue
    such as 3.4e-17 for identical aggregate scores, which would turn 0/0 into a number), and 0
    where there is a single value."""
    n = x.shape[axis]
    if n <= 1:
        return np.zeros(np.delete(x.shape, axis))
    same = x.max(axis=axis) == x.min(axis=axis)
    return np.where(same, 0.0, x.std(axis=axis, ddof=1))


def sd_from_sums(x: np.ndarray) -> np.ndarray:
    """`sd` along the last axis from the sums of x and x^2 (one pass, no deviations array), for
    whole-number values such as 0/1 outcome differences: n sum x^2 - (sum x)^2 is then computed
    exactly, so it is exactly 0 when every value is the same."""
    n = x.shape[-1]
    if n <= 1:
        return np.zeros(x.shape[:-1])
    s1, s2 = x.sum(axis=-1), (x * x).sum(axis=-1)
    return _sd_of_sums(s1, s2, n)


def _sd_of_sums(s1: np.ndarray, s2: np.ndarray, n: int) -> np.ndarray:
    num = n * s2 - s1 * s1  # n (n - 1) var: exact for whole-number data
    return np.where(num > 0, np.sqrt(np.maximum(num, 0.0) / (n * (n - 1))), 0.0)


def paired_sd(m: np.ndarray) -> np.ndarray:
    """SD of the aggregate-score differences over run pairs."""
    scores = m.mean(axis=-2)  # (..., R)
    a, b = pairs(m.shape[-1])
    return sd(scores[..., a] - scores[..., b])


def marginal_sd(m: np.ndarray) -> np.ndarray:
    return sd(m.mean(axis=-2))


def unit_paired_sd(m: np.ndarray) -> np.ndarray:
    """SD of the instance-level differences d = y_ia - y_ib over (instance, run pair), from each
    instance's sums (no N x P array): over pairs a < b, sum d = y @ (R-1-2j) and sum d^2 =
    R sum y^2 - (sum y)^2. For 0/1 outcomes both sums are whole numbers, so the SD is exactly 0
    where every difference is equal."""
    r = m.shape[-1]
    units = m.shape[-2] * r * (r - 1) // 2
    if units <= 1:
        return np.zeros(m.shape[:-2])
    s1 = (m @ (r - 1 - 2 * np.arange(r, dtype=float))).sum(axis=-1)
    total = m.sum(axis=-1)
    s2 = (r * (m * m).sum(axis=-1) - total * total).sum(axis=-1)
    return _sd_of_sums(s1, s2, units)


def mean_correlation(m: np.ndarray) -> np.ndarray:
    """Mean Pearson correlation over run pairs, pairs with a constant run left out (NaN if none),
    from the runs' sums and cross products (an R x R Gram matrix per resample)."""
    n, r = m.shape[-2], m.shape[-1]
    a, b = pairs(r)
    s1 = m.sum(axis=-2)  # (..., R)
    gram = np.swapaxes(m, -1, -2) @ m  # (..., R, R)
    var = n * np.diagonal(gram, axis1=-2, axis2=-1) - s1**2
    constant = m.max(axis=-2) == m.min(axis=-2)
    ok = ~constant[..., a] & ~constant[..., b]
    cov = n * gram[..., a, b] - s1[..., a] * s1[..., b]
    den = np.sqrt(np.maximum(var[..., a], 0) * np.maximum(var[..., b], 0))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(ok & (den > 0), cov / np.where(den > 0, den, 1), np.nan)
    count = (~np.isnan(rho)).sum(axis=-1)
    total = np.where(np.isnan(rho), 0, rho).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den with the zero denominator kept honest: x / 0 is +inf for x > 0 (a perturbation
    floor over a rerun floor of exactly zero is infinitely larger), 0 / 0 is NaN (undefined)."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)
    return np.where((den == 0) & (num > 0), np.inf, q)
