"""The interval type every statistic reports, the ways this package makes one, and how an
interval with an infinite end is written.

- the percentile interval of bootstrap draws, with +-inf draws kept (a resample whose ratio has
  a zero denominator and a positive numerator is an infinite ratio, not a missing one: dropping
  it would make the interval conditional on the denominator being positive), and the same
  interval centred on its estimate (`centred`) for statistics resampling biases;
- the exact binomial (Clopper-Pearson) interval (scipy's `binomtest(...).proportion_ci("exact")`),
  and its one-sided upper end, used to bound what a finite set of reruns could have missed.

JSON has no infinity: an infinite end is written as the string "Infinity" (or "-Infinity"), which
Python's float() and JavaScript's Number() both read back as the infinite value; text prints an
open end as `[15.1, inf)`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from noisefloor.analyzer.matrices import runs_matrix
from noisefloor.errors import InputError


@dataclass(frozen=True, eq=False)
class Interval:
    """A two-sided interval, named as scipy.stats names its `ConfidenceInterval` (`low`, `high`).
    It unpacks as `low, high = ci` and indexes as `ci[0]`, so code that held a pair keeps working;
    `to_json` writes it as [low, high] with an infinite end as "Infinity"."""

    low: float
    high: float

    def __iter__(self) -> Iterator[float]:
        return iter((self.low, self.high))

    def __getitem__(self, i: int) -> float:
        return (self.low, self.high)[i]

    def __len__(self) -> int:
        return 2

    def __eq__(self, other: object) -> bool:
        """Equal to another interval, or to a (low, high) pair, with the same ends."""
        if isinstance(other, (Interval, tuple, list)) and len(other) == 2:
            return (self.low, self.high) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.low, self.high))

    def covers(self, x: float) -> bool:
        return self.low <= x <= self.high

    def to_json(self) -> list[float | str | None]:
        return [jsonable(self.low), jsonable(self.high)]


def percentile(draws: np.ndarray, alpha: float = 0.05) -> Interval:
    """Linear-interpolation percentiles (numpy's default), exact at infinite draws: a quantile
    that touches an infinite draw is that infinity (numpy would give NaN for inf - inf)."""
    x = np.asarray(draws, dtype=float).ravel()
    if x.size == 0:
        raise InputError("no draws to take a percentile of")
    if np.isnan(x).any():
        raise InputError("draws contain NaN (undefined values): leave them out and count them first")
    if np.isfinite(x).all():  # numpy's own arithmetic (it partitions: no sort), so it matches np.percentile to the bit
        lo, hi = np.percentile(x, [100 * alpha / 2, 100 * (1 - alpha / 2)])
        return Interval(float(lo), float(hi))
    x = np.sort(x)
    return Interval(_quantile(x, alpha / 2), _quantile(x, 1 - alpha / 2))


def percentiles(draws: np.ndarray, alpha: float = 0.05) -> list[Interval]:
    """`percentile` of each row of a (columns, draws) array, the finite rows in one numpy call
    (the same interpolation, so the same bits as one call per row)."""
    x = np.asarray(draws, dtype=float)
    if x.ndim != 2 or x.shape[1] == 0:
        raise InputError("no draws to take a percentile of")
    finite = np.isfinite(x).all(axis=1)
    out: list[Interval | None] = [None] * x.shape[0]
    if finite.any():
        ends = np.percentile(x[finite], [100 * alpha / 2, 100 * (1 - alpha / 2)], axis=1)
        for i, lo, hi in zip(np.flatnonzero(finite), ends[0], ends[1], strict=True):
            out[i] = Interval(float(lo), float(hi))
    for i in np.flatnonzero(~finite):
        out[i] = percentile(x[i], alpha)  # NaN refused there; +-inf interpolated as `percentile` does
    return [ci for ci in out if ci is not None]


def centred(draws: np.ndarray, estimate: float, alpha: float = 0.05) -> Interval:
    """The percentile interval of bootstrap draws moved so that the draws' median sits on the
    estimate: scaled by estimate / median when both are positive (the bias of an SD, a ratio or a
    multiple under resampling is a factor: resampled instances with replacement inflate an SD over
    runs by about sqrt(2)), from 0 to the draws' upper end for a nonnegative statistic estimated
    at 0, shifted by estimate - median otherwise (never below 0 when no draw is). Either way the
    estimate lies inside, as the percentile interval's own median does. With half or more of the draws infinite
    the median is infinite: the interval is then [min(low, estimate), inf)."""
    ci = percentile(draws, alpha)
    x = np.sort(np.asarray(draws, dtype=float).ravel())
    med = _quantile(x, 0.5)
    if not math.isfinite(estimate):
        return ci
    if math.isinf(med):
        return Interval(min(ci.low, estimate), ci.high) if med > 0 else Interval(ci.low, max(ci.high, estimate))
    nonnegative = x[0] >= 0 and estimate >= 0  # an SD, a ratio of SDs, a multiple: the interval stays >= 0
    if estimate > 0 and med > 0:
        f = estimate / med
        lo, hi = ci.low * f, ci.high * f
    elif estimate == 0 and nonnegative:  # nothing to scale: the draws' upper end, from 0
        lo, hi = 0.0, ci.high
    else:
        lo, hi = ci.low + (estimate - med), ci.high + (estimate - med)
    if nonnegative:
        lo = max(lo, 0.0)
    return Interval(min(lo, estimate), max(hi, estimate))  # min / max: only the last bit of the float arithmetic


def _quantile(x: np.ndarray, q: float) -> float:
    pos = q * (x.size - 1)
    i = int(math.floor(pos))
    j = min(i + 1, x.size - 1)
    t = pos - i
    a, b = float(x[i]), float(x[j])
    if t == 0 or a == b:
        return a
    if b == math.inf:  # some weight on +inf
        return b
    if a == -math.inf:
        return a
    return a + (b - a) * t


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> Interval:
    """Exact binomial interval for k successes in n trials: the beta quantiles that scipy's
    `binomtest(k, n).proportion_ci(method="exact")` finds by root search, taken from the inverse
    incomplete beta directly (scipy.special, not scipy.stats: that import alone costs every
    nfladder and nfanalyze process about 1.5 s of CPU)."""
    if n <= 0 or not 0 <= k <= n:
        raise InputError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    from scipy import special

    low = 0.0 if k == 0 else float(special.betaincinv(k, n - k + 1, alpha / 2))
    high = 1.0 if k == n else float(special.betaincinv(k + 1, n - k, 1 - alpha / 2))
    return Interval(low, high)


def clopper_pearson_upper(k: int, n: int, level: float) -> float:
    """One-sided exact upper bound on a binomial probability after k successes in n trials: the p
    with P(Bin(n, p) <= k) = 1 - level (1 when k = n). For k = 0 it is 1 - (1 - level)^(1/n)."""
    if n <= 0 or not 0 <= k <= n:
        raise InputError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    if k == n:
        return 1.0
    from scipy import special  # here, not at import: see clopper_pearson

    return float(special.betaincinv(k + 1, n - k, level))


def jsonable(x: float | None) -> float | str | None:
    """One number as JSON can hold it: +-inf as "Infinity" / "-Infinity", NaN as null."""
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def ci_json(ci: Interval | tuple[float, float] | None) -> list[float | str | None] | None:
    return None if ci is None else [jsonable(ci[0]), jsonable(ci[1])]


def fmt_num(x: float, fmt: str) -> str:
    return ("inf" if x > 0 else "-inf") if math.isinf(x) else f"{x:{fmt}}"


def fmt_ci(ci: Interval | tuple[float, float], fmt: str = ".5f") -> str:
    """`[lo, hi]`, with an infinite end shown open: `[15.1, inf)`."""
    lo, hi = ci
    left = "(" if math.isinf(lo) else "["
    right = ")" if math.isinf(hi) else "]"
    return f"{left}{fmt_num(lo, fmt)}, {fmt_num(hi, fmt)}{right}"


FEW_VARYING = 10  # below this many varying tasks the task bootstrap alone under-covers (bench/coverage.py)


def variance_per_varying(replicates: int) -> float:
    """The largest p(1-p) / P(a task with pass probability p varies in R replicates) over p:
    1 / 2 at R = 2; for R >= 3 it is reached at p = 1/2, 1 / (4 (1 - 2^(1-R))). A task population
    whose tasks vary (in R replicates) with probability q has mean p(1-p) at most this times q."""
    if replicates < 2:
        raise InputError(f"need at least 2 replicates, got {replicates}")
    return 0.25 / (1 - 2.0 ** (1 - replicates))


@dataclass(frozen=True)
class FlipBound:
    """Exact upper bounds on the per-replicate variance of a set of 0/1 reruns, for two targets.

    The study's own tasks: for task i with pass probability p_i, its minority probability is
    m_i = min(p_i, 1 - p_i), and the count of minority outcomes over the N x R cells is a sum of
    independent Bernoulli cells with mean R * sum(m_i). The observed count `minority` =
    sum_i min(k_i, R - k_i) is that count whenever no task shows its minority outcome in more than
    half its replicates, which is the nearly deterministic case this bound is for (tasks that vary
    a lot are seen anyway). The one-sided Clopper-Pearson upper end of minority / cells bounds
    mean(m_i) (Hoeffding 1956: a sum of unequal Bernoulli cells is no more spread than the binomial
    with their mean), and, p(1-p) = m(1-m) being concave, mean(p_i (1 - p_i)) <= rate_upper (1 - rate_upper).

    The task population the tasks were drawn from: the cell bound tightens as R grows whatever
    the tasks drawn, so it cannot speak for flipping tasks the draw left out. Each drawn task
    varies in its R replicates independently with one probability q, so the one-sided
    Clopper-Pearson upper end of varying / N bounds q, and the population's mean p(1-p) is at most
    `variance_per_varying(R)` x that.
    """

    varying: int  # tasks whose outcome changed
    tasks: int
    replicates: int
    minority: int  # sum over tasks of min(passes, fails)
    level: float  # one-sided confidence of rate_upper and share_upper
    rate_upper: float
    share_upper: float = 1.0  # upper end for the population share of tasks that vary in R replicates

    @property
    def variance_upper(self) -> float:
        """Upper bound on the mean within-task variance p(1-p) of these tasks."""
        m = min(self.rate_upper, 0.5)
        return m * (1 - m)

    @property
    def population_variance_upper(self) -> float:
        """Upper bound on the task population's mean p(1-p): also what the draw may have missed."""
        return max(self.variance_upper, min(0.25, variance_per_varying(self.replicates) * self.share_upper))

    def json_extra(self) -> dict[str, float | str]:
        """What JSON carries beside the fields: the variance bounds and the sentence."""
        return {"variance_upper": self.variance_upper, "population_variance_upper": self.population_variance_upper,
                "sentence": self.sentence()}

    def sentence(self) -> str:
        cells = self.tasks * self.replicates
        what = (f"no task varied in {self.tasks} x {self.replicates} outcomes" if self.varying == 0 else
                f"{self.varying} of {self.tasks} tasks varied ({self.minority} minority outcomes in "
                f"{self.tasks} x {self.replicates})")
        return (f"{what}: per-replicate flip rate <= {self.rate_upper:.3g} of {cells}, share of tasks that vary "
                f"<= {self.share_upper:.3g} (exact, one-sided {self.level:.1%})")


def flip_bound(outcomes: np.ndarray, alpha: float = 0.05) -> FlipBound:
    """The exact bounds of `FlipBound` at one-sided level 1 - alpha/2 (the upper end of a
    two-sided 1 - alpha interval) for an (N, R) 0/1 matrix."""
    y = runs_matrix(outcomes)
    n, r = y.shape
    k = y.sum(axis=1)
    minority = int(np.minimum(k, r - k).sum())
    varying = int((y.min(axis=1) != y.max(axis=1)).sum())
    level = 1 - alpha / 2
    return FlipBound(varying, n, r, minority, level, clopper_pearson_upper(minority, n * r, level),
                     clopper_pearson_upper(varying, n, level))
