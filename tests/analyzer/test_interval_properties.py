"""The statistics' invariants over generated data (hypothesis): every estimate lies inside its
own interval, w and its interval are never negative, exact bounds widen as the data shrink, and
neither the tasks' names nor their order changes any number."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from noisefloor.analyzer import floors
from noisefloor.analyzer.analysis import Settings, analyze
from noisefloor.analyzer.gate import wilson_lower, wilson_upper
from noisefloor.analyzer.intervals import centred, flip_bound, percentile, percentiles
from noisefloor.analyzer.ladder import w_interval
from noisefloor.analyzer.outcomes import Row, build
from noisefloor.errors import InputError

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def outcome_matrix(draw: st.DrawFn, min_n: int = 2, max_n: int = 20, max_r: int = 7) -> np.ndarray:
    """An (N, R) 0/1 matrix whose tasks have their own pass rates (some always pass or fail)."""
    n = draw(st.integers(min_n, max_n))
    r = draw(st.integers(2, max_r))
    rates = draw(arrays(np.float64, n, elements=st.sampled_from([0.0, 0.0, 1.0, 0.1, 0.5, 0.9])))
    noise = draw(arrays(np.float64, (n, r), elements=st.floats(0, 1, exclude_max=True)))
    return (noise < rates[:, None]).astype(float)


def rows_of(y: np.ndarray, condition: str, names: list[str]) -> list[Row]:
    return [Row(names[i], condition, j, int(y[i, j])) for i in range(y.shape[0]) for j in range(y.shape[1])]


def analysis_of(a: np.ndarray, b: np.ndarray, names: list[str]):  # noqa: ANN201
    return analyze(build(rows_of(a, "live", names) + rows_of(b, "t0", names)), Settings(resamples=200, seed=3))


@st.composite
def two_conditions(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    a = draw(outcome_matrix())
    b = draw(arrays(np.float64, a.shape, elements=st.sampled_from([0.0, 1.0])))
    return a, b


@FAST
@given(two_conditions())
def test_ladder_estimates_lie_inside_their_intervals_and_w_is_never_negative(ab):
    a, b = ab
    res = analysis_of(a, b, [f"t{i:03d}" for i in range(a.shape[0])])
    for c in res.conditions:
        s = c.stats
        assert s.w >= 0 and c.w_ci.low >= 0
        assert c.w_ci.low - 1e-12 <= s.w <= c.w_ci.high + 1e-12
        assert c.score_ci.low - 1e-12 <= s.score <= c.score_ci.high + 1e-12
        assert c.budget_ci.low <= s.budget <= c.budget_ci.high
        share = s.variable_tasks / s.tasks
        assert s.variable_tasks_ci.low <= share <= s.variable_tasks_ci.high
    for k in res.contrasts:
        assert k.ci.low - 1e-12 <= k.estimate <= k.ci.high + 1e-12


@FAST
@given(outcome_matrix(min_n=3, max_n=25, max_r=6))
def test_floors_estimates_lie_inside_their_intervals(y):
    f = floors.rerun_floor(y, resamples=200, permutations=0)
    for key, ci in f.ci.items():
        est = getattr(f, key)
        assert est is not None and ci.low - 1e-12 <= est <= ci.high + 1e-12, (key, est, ci)
    variants = {"v1": np.roll(y, 1, axis=0), "v2": 1 - y, "v3": y[::-1]}
    p = floors.perturbation_floor(variants, y, resamples=200)
    for key, ci in p.ci.items():
        est = getattr(p, key)
        assert est is not None and ci.low - 1e-12 <= est <= ci.high + 1e-12, (key, est, ci)
    for q in p.pairs:
        for key, ci in q.ci.items():
            est = getattr(q, key)
            assert est is not None and ci.low - 1e-12 <= est <= ci.high + 1e-12, (key, est, ci)


@FAST
@given(arrays(np.float64, st.integers(1, 300), elements=st.floats(0, 50) | st.just(math.inf)),
       st.floats(0, 50))
def test_a_centred_interval_holds_its_estimate_whatever_the_draws(draws, estimate):
    ci = centred(draws, estimate)
    assert ci.low <= estimate <= ci.high


@FAST
@given(outcome_matrix(min_n=1, max_n=15))
def test_exact_bounds_narrow_as_data_grow(y):
    """The same tasks twice (or every replicate twice) can only tighten the exact bounds, and the
    Wilson bounds of the gate narrow as its repeats grow at one pass rate."""
    one, two = flip_bound(y), flip_bound(np.vstack([y, y]))
    assert two.rate_upper <= one.rate_upper and two.share_upper <= one.share_upper
    assert two.population_variance_upper <= one.population_variance_upper
    const = np.zeros_like(y)
    wide = w_interval(const, (0.0, 0.0)).ci.high
    assert w_interval(np.vstack([const, const]), (0.0, 0.0)).ci.high <= wide
    assert w_interval(np.hstack([const, const]), (0.0, 0.0)).ci.high <= wide
    k, n = int(y.sum()), y.size
    assert wilson_lower(k, n) <= wilson_lower(2 * k, 2 * n) <= k / n <= wilson_upper(2 * k, 2 * n) <= wilson_upper(k, n)


@FAST
@given(two_conditions(), st.randoms(use_true_random=False))
def test_task_names_and_order_change_nothing(ab, rnd):
    a, b = ab
    n = a.shape[0]
    names = [f"t{i:03d}" for i in range(n)]
    other = names[:]
    rnd.shuffle(other)  # task i is now called other[i]: a different order once sorted by name
    x, y = analysis_of(a, b, names), analysis_of(a, b, other)

    def numbers(res) -> list[float]:  # noqa: ANN001
        out = []
        for c in res.conditions:
            s = c.stats
            out += [s.score, s.w, s.budget, s.variable_tasks, s.mde, *c.w_ci, *c.score_ci, *c.budget_ci]
        for k in res.contrasts:
            out += [k.estimate, *k.ci]
        return out

    # equal up to the order of a float sum over tasks (the last bit), not up to resampling noise
    assert numbers(x) == pytest.approx(numbers(y), rel=1e-12, abs=1e-15)
    perm = np.array(rnd.sample(range(n), n))
    fx = floors.rerun_floor(a, resamples=100, permutations=0)
    fy = floors.rerun_floor(a[perm], resamples=100, permutations=0)
    assert {k: tuple(v) for k, v in fx.ci.items()} == {k: tuple(v) for k, v in fy.ci.items()}


def test_centred_closed_forms():
    draws = np.array([2.0, 3.0, 4.0, 5.0, 6.0])
    lo, hi = np.percentile(draws, [2.5, 97.5])
    assert tuple(centred(draws, 2.0)) == pytest.approx((lo * 0.5, hi * 0.5))  # scaled: median 4 onto 2
    assert tuple(centred(draws, 0.0)) == (0.0, hi)  # a nonnegative statistic at 0
    assert tuple(centred(draws - 4.0, -1.0)) == pytest.approx((lo - 5.0, hi - 5.0))  # shifted
    assert tuple(centred(np.array([1.0, math.inf, math.inf]), 0.5)) == (0.5, math.inf)


@FAST
@given(arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 60)),
              elements=st.one_of(st.floats(-5, 5), st.sampled_from([math.inf, -math.inf, 0.0, 1.0]))),
       st.sampled_from([0.05, 0.1, 0.5]))
def test_percentiles_of_rows_are_percentile_of_each_row_to_the_bit(draws: np.ndarray, alpha: float) -> None:
    together = percentiles(draws, alpha)
    one_by_one = [percentile(row, alpha) for row in draws]
    assert [(c.low, c.high) for c in together] == [(c.low, c.high) for c in one_by_one]


def test_percentiles_refuse_nan_and_empty_draws() -> None:
    with pytest.raises(InputError, match="NaN"):
        percentiles(np.array([[1.0, 2.0], [np.nan, 1.0]]))
    with pytest.raises(InputError, match="no draws"):
        percentiles(np.empty((2, 0)))
