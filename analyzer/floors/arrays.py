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


def paired_sd(m: np.ndarray) -> np.ndarray:
    """SD of the aggregate-score differences over run pairs."""
    scores = m.mean(axis=-2)  # (..., R)
    a, b = pairs(m.shape[-1])
    return sd(scores[..., a] - scores[..., b])


def marginal_sd(m: np.ndarray) -> np.ndarray:
    return sd(m.mean(axis=-2))


def unit_paired_sd(m: np.ndarray) -> np.ndarray:
    """SD of the instance-level differences over (instance, run pair)."""
    a, b = pairs(m.shape[-1])
    d = (m[..., a] - m[..., b]).reshape(*m.shape[:-2], -1)
    return sd(d)


def mean_correlation(m: np.ndarray) -> np.ndarray:
    """Mean Pearson correlation over run pairs, pairs with a constant run left out (NaN if none)."""
    a, b = pairs(m.shape[-1])
    x, z = m[..., a], m[..., b]  # (..., N, P)
    xc, zc = x - x.mean(axis=-2, keepdims=True), z - z.mean(axis=-2, keepdims=True)
    den = np.sqrt((xc**2).sum(axis=-2) * (zc**2).sum(axis=-2))
    r = np.where(den > 0, (xc * zc).sum(axis=-2) / np.where(den > 0, den, 1), np.nan)
    ok = ~np.isnan(r)
    count = ok.sum(axis=-1)
    total = np.where(ok, r, 0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den with the zero denominator kept honest: x / 0 is +inf for x > 0 (a perturbation
    floor over a rerun floor of exactly zero is infinitely larger), 0 / 0 is NaN (undefined)."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)
    return np.where((den == 0) & (num > 0), np.inf, q)
