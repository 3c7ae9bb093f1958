"""Rerun and prompt-perturbation floors for repeated, matched runs (the BFCL audit's statistics).

Input per endpoint: a 0/1 matrix of instances x runs for the main arm (reruns at fixed settings)
and, for the perturbation arm, one such matrix per named prompt variant, all on the same matched
instances. Definitions (seed 003):
- run correlation: Pearson correlation across instances between two runs, averaged over run pairs
  (pairs where a run is constant have no correlation and are left out);
- always-correct / always-wrong / flip instances; ever-flip fraction = flip instances / N;
- marginal SD: SD (ddof=1) of the aggregate score across runs;
- rerun paired SD: the SD (ddof=1) of the matched paired differences s_a - s_b of aggregate scores
  over all run pairs a < b. Unlike a root-mean-square, it is not sqrt(2) x the marginal SD by
  construction, so the ratio paired / (sqrt(2) x marginal) can show dependent reruns (and, being
  signed, it depends on which run a flip fell in, as the seed's definition does);
- rerun unit paired SD: the SD of instance-level differences y_ia - y_ib over (instance, run pair);
- perturbation paired SD for variants L, R: SD (ddof=1) of y_L - y_R over matched (instance, run)
  units (per-unit scale, as the seed reports it), and on the aggregate scale the SD over matched
  runs of the run-level accuracy difference. The perturbation multiple is given on both scales
  and, for comparison with the seed's tables, as published (per-unit over aggregate, which grows
  like sqrt(N));
- bootstrap SD curve: the rerun paired SD recomputed on n instances drawn with replacement;
- fingerprint split: instance-level differences y_ir - y_is over run pairs, split by whether the
  two calls had the same known system fingerprint (a pair with an unknown one is in neither).
Every number gets an interval: a percentile instance bootstrap for SDs, correlations, ratios and
multiples (one set of instance draws for an endpoint's main arm and variants together), exact
Clopper-Pearson for the ever-flip fraction and the malformed share.
Pure functions: arrays in, frozen dataclasses out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from noisefloor.analyzer.bootstrap import FLOORS_RESAMPLES, index_blocks
from noisefloor.analyzer.intervals import FEW_VARYING, FlipBound, Interval, clopper_pearson, flip_bound, percentile
from noisefloor.errors import InputError

DEFAULT_RESAMPLES = FLOORS_RESAMPLES
CURVE_RESAMPLES = FLOORS_RESAMPLES


@dataclass(frozen=True)
class Resampled:
    """What the resamples of one statistic were: the share left out as undefined (0/0) and the
    share that was +inf (kept in the interval, which is then open above)."""

    undefined: float
    infinite: float


@dataclass(frozen=True)
class Dependence:
    """Do two reruns of one instance go together beyond chance?

    The paired / (sqrt(2) x marginal) ratio cannot say: with P run pairs, d the pairwise aggregate
    differences (mean dbar) and s the marginal SD, ratio^2 = P/(P-1) - P dbar^2 / (2 (P-1) s^2), so
    it is about 1 for any exchangeable runs however strongly they agree, and falls only with a
    trend across run order. This diagnostic asks the other question: the mean pairwise run
    correlation against its permutation distribution under independent runs (each run's outcomes
    shuffled across instances independently, keeping every run's accuracy).
    """

    mean_correlation: float | None
    ci: Interval | None  # instance bootstrap
    null: Interval | None  # central 95% of the permutation distribution
    null_mean: float | None
    p_value: float | None  # one-sided: (1 + #{permuted >= observed}) / (1 + permutations)
    permutations: int
    dependent: bool | None  # p_value < alpha; None when undefined
    reason: str  # the verdict in words, or why it is undefined


@dataclass(frozen=True)
class RerunFloor:
    instances: int
    runs: int
    accuracy: float
    mean_correlation: float | None
    always_correct: int
    always_wrong: int
    flip: int
    ever_flip_fraction: float
    marginal_sd: float
    paired_sd: float
    paired_to_marginal: float | None  # paired / (sqrt(2) * marginal)
    unit_paired_sd: float
    ci: Mapping[str, Interval]  # by field name: instance bootstrap, exact for ever_flip_fraction
    methods: Mapping[str, str] = field(default_factory=dict)  # how each interval in `ci` was made
    undefined: Mapping[str, str] = field(default_factory=dict)  # why a None field has no value
    resampled: Mapping[str, Resampled] = field(default_factory=dict)  # undefined / infinite resample shares
    bound: FlipBound | None = None  # the exact bound on the flip rate, where few instances flipped
    dependence: Dependence | None = None


@dataclass(frozen=True)
class PerturbationPair:
    left: str
    right: str
    left_accuracy: float
    right_accuracy: float
    matched: int  # (instance, run) units
    paired_sd: float  # per-unit scale
    aggregate_sd: float | None  # SD over matched runs of the accuracy difference; None with one run
    ci: Mapping[str, Interval]


@dataclass(frozen=True)
class PerturbationFloor:
    pairs: tuple[PerturbationPair, ...]
    median_paired_sd: float  # per-unit scale
    median_aggregate_sd: float | None
    multiple_unit_scale: float | None  # median per-unit perturbation SD / rerun unit paired SD
    multiple_aggregate_scale: float | None  # median aggregate perturbation SD / rerun paired SD
    multiple_as_published: float | None  # median per-unit SD / rerun (aggregate) paired SD, as seed 003
    ci: Mapping[str, Interval]  # a multiple's interval is open at inf when resampled reruns had SD 0
    undefined: Mapping[str, str] = field(default_factory=dict)  # why a None multiple has no value
    resampled: Mapping[str, Resampled] = field(default_factory=dict)  # undefined / infinite resample shares


@dataclass(frozen=True)
class CurvePoint:
    n: int
    mean: float
    ci: Interval
    resamples: int


@dataclass(frozen=True)
class FingerprintSplit:
    fingerprints: int
    within_pairs: int
    within_sd: float | None
    across_pairs: int
    across_sd: float | None
    unknown_pairs: int  # pairs where a fingerprint is missing: in neither group


def _matrix(y: np.ndarray) -> np.ndarray:
    m = np.asarray(y, dtype=float)
    if m.ndim != 2 or m.shape[1] < 2:
        raise InputError(f"need an instances x runs matrix with at least 2 runs, got shape {m.shape}")
    return m


def _pairs(r: int) -> tuple[np.ndarray, np.ndarray]:
    a, b = zip(*combinations(range(r), 2))
    return np.array(a), np.array(b)


def _sd(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """ddof=1 SD along `axis`; exactly 0 where every value is the same (numpy leaves float residue
    such as 3.4e-17 for identical aggregate scores, which would turn 0/0 into a number), and 0
    where there is a single value."""
    n = x.shape[axis]
    if n <= 1:
        return np.zeros(np.delete(x.shape, axis))
    same = x.max(axis=axis) == x.min(axis=axis)
    return np.where(same, 0.0, x.std(axis=axis, ddof=1))


# -- statistics on a stack of resampled matrices (..., N, R): the point estimate is the stack of one


def _paired_sd(m: np.ndarray) -> np.ndarray:
    scores = m.mean(axis=-2)  # (..., R)
    a, b = _pairs(m.shape[-1])
    return _sd(scores[..., a] - scores[..., b])


def _marginal_sd(m: np.ndarray) -> np.ndarray:
    return _sd(m.mean(axis=-2))


def _unit_paired_sd(m: np.ndarray) -> np.ndarray:
    a, b = _pairs(m.shape[-1])
    d = (m[..., a] - m[..., b]).reshape(*m.shape[:-2], -1)
    return _sd(d)


def _mean_correlation(m: np.ndarray) -> np.ndarray:
    """Mean Pearson correlation over run pairs, pairs with a constant run left out (NaN if none)."""
    a, b = _pairs(m.shape[-1])
    x, z = m[..., a], m[..., b]  # (..., N, P)
    xc, zc = x - x.mean(axis=-2, keepdims=True), z - z.mean(axis=-2, keepdims=True)
    den = np.sqrt((xc**2).sum(axis=-2) * (zc**2).sum(axis=-2))
    r = np.where(den > 0, (xc * zc).sum(axis=-2) / np.where(den > 0, den, 1), np.nan)
    return _nanmean(r)


def _nanmean(r: np.ndarray) -> np.ndarray:
    ok = ~np.isnan(r)
    count = ok.sum(axis=-1)
    total = np.where(ok, r, 0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den with the zero denominator kept honest: x / 0 is +inf for x > 0 (a perturbation
    floor over a rerun floor of exactly zero is infinitely larger), 0 / 0 is NaN (undefined)."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)
    return np.where((den == 0) & (num > 0), np.inf, q)


def _bootstrap(arrays: Mapping[str, np.ndarray], stat: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]],
               resamples: int, seed: int, alpha: float = 0.05) -> tuple[dict[str, Interval], dict[str, Resampled]]:
    """Percentile intervals of every statistic `stat` returns, with the instances (axis 0 of
    every array) drawn jointly: the same draw for the main arm and every variant. Undefined (NaN)
    resamples are left out and counted; infinite ones stay in."""
    n = next(iter(arrays.values())).shape[0]
    draws: dict[str, list[np.ndarray]] = {}
    cells = sum(int(np.prod(a.shape)) for a in arrays.values())
    for idx in index_blocks(n, resamples, seed, cells):
        for k, v in stat({name: arr[idx] for name, arr in arrays.items()}).items():
            draws.setdefault(k, []).append(np.asarray(v, dtype=float))
    out, notes = {}, {}
    for k, parts in draws.items():
        v = np.concatenate(parts)
        nan = np.isnan(v)
        v = v[~nan]
        notes[k] = Resampled(float(nan.mean()), float(np.isinf(v).sum() / nan.size))
        if v.size:
            out[k] = percentile(v, alpha)
    return out, notes


PERMUTATIONS = 1000


def dependence(m: np.ndarray, ci: Interval | None = None, permutations: int = PERMUTATIONS, seed: int = 0,
               alpha: float = 0.05) -> Dependence:
    """The permutation test of `Dependence` for an instances x runs matrix."""
    m = _matrix(m)
    n, r = m.shape
    obs = float(_mean_correlation(m))
    if np.isnan(obs):
        return Dependence(None, None, None, None, None, permutations, None,
                          "undefined: every run is constant across instances (no run pair has a correlation)")
    # shuffling a run across instances keeps its mean and SD, so only the cross products change:
    # r_ab = (x_a . x_b / N - mu_a mu_b) / (sd_a sd_b) over the run pairs with no constant run
    mu, sd = m.mean(axis=0), m.std(axis=0)
    a, b = np.triu_indices(r, 1)
    ok = (sd[a] > 0) & (sd[b] > 0)
    a, b = a[ok], b[ok]
    rng = np.random.default_rng(np.random.SeedSequence([seed, 3]))
    block = max(1, 4_000_000 // (n * r))
    vals = []
    done = 0
    while done < permutations:
        k = min(block, permutations - done)
        shuffled = rng.permuted(np.broadcast_to(m, (k, n, r)), axis=1)
        gram = np.matmul(shuffled.transpose(0, 2, 1), shuffled)
        vals.append(((gram[:, a, b] / n - mu[a] * mu[b]) / (sd[a] * sd[b])).mean(axis=1))
        done += k
    null = np.concatenate(vals)
    null = null[~np.isnan(null)]
    p = float((1 + (null >= obs - 1e-12).sum()) / (1 + null.size))
    dep = p < alpha
    why = (f"dependent: run correlation {obs:.3f} above independent runs' {percentile(null, alpha)[1]:.3f} "
           f"(permutation p = {p:.3g})" if dep else
           f"no evidence of dependence: run correlation {obs:.3f} within independent runs' range (p = {p:.3g})")
    return Dependence(obs, ci, percentile(null, alpha), float(null.mean()), p, int(null.size), dep, why)


def rerun_paired_sd(y: np.ndarray) -> float:
    return float(_paired_sd(_matrix(y)))


def _rerun_stats(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    m = arrays["main"]
    paired, marginal = _paired_sd(m), _marginal_sd(m)
    return {"mean_correlation": _mean_correlation(m), "marginal_sd": marginal, "paired_sd": paired,
            "paired_to_marginal": _ratio(paired, np.sqrt(2) * marginal), "unit_paired_sd": _unit_paired_sd(m)}


SD_FIELDS = ("marginal_sd", "paired_sd", "unit_paired_sd")


def _sd_bounds(b: FlipBound, n: int) -> dict[str, float]:
    """What each rerun SD would be for independent reruns whose mean flip variance sits at the
    exact bound v: marginal sqrt(v / N), aggregate paired sqrt(2 v / N), unit paired sqrt(2 v)."""
    v = b.variance_upper
    return {"marginal_sd": float(np.sqrt(v / n)), "paired_sd": float(np.sqrt(2 * v / n)),
            "unit_paired_sd": float(np.sqrt(2 * v))}


def rerun_floor(y: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                permutations: int = PERMUTATIONS) -> RerunFloor:
    m = _matrix(y)
    n, r = m.shape
    lo, hi = m.min(axis=1), m.max(axis=1)
    flip = int((lo != hi).sum())
    point = {k: float(v) for k, v in _rerun_stats({"main": m}).items()}
    ci, resampled = _bootstrap({"main": m}, _rerun_stats, resamples, seed) if n > 1 else ({}, {})
    methods = {k: "instance_bootstrap" for k in ci}
    ci["ever_flip_fraction"] = clopper_pearson(flip, n)
    methods["ever_flip_fraction"] = "clopper_pearson"
    bound = None
    if flip < FEW_VARYING:  # the SDs' bootstrap cannot see flips the runs missed: raise their upper ends
        bound = flip_bound(m)
        for k, up in _sd_bounds(bound, n).items():
            old = ci.get(k, Interval(0.0, 0.0))
            ci[k] = Interval(old.lo, max(old.hi, up))
            methods[k] = "exact_bound" if flip == 0 else "instance_bootstrap+exact_bound"
    undefined = {}
    if np.isnan(point["paired_to_marginal"]):
        undefined["paired_to_marginal"] = ("0/0: every run has the same aggregate score (marginal SD exactly 0), "
                                           "so the ratio is undefined, not 0")
    if np.isnan(point["mean_correlation"]):
        undefined["mean_correlation"] = "every run is constant across instances"
    dep = dependence(m, ci.get("mean_correlation"), permutations, seed) if permutations and n > 2 else None
    nan_none = {k: (None if np.isnan(v) else v) for k, v in point.items()}
    return RerunFloor(
        instances=n,
        runs=r,
        accuracy=float(m.mean()),
        mean_correlation=nan_none["mean_correlation"],
        always_correct=int((lo == 1).sum()),
        always_wrong=int((hi == 0).sum()),
        flip=flip,
        ever_flip_fraction=flip / n,
        marginal_sd=point["marginal_sd"],
        paired_sd=point["paired_sd"],
        paired_to_marginal=nan_none["paired_to_marginal"],
        unit_paired_sd=point["unit_paired_sd"],
        ci=ci,
        methods=methods,
        undefined=undefined,
        resampled={k: v for k, v in resampled.items() if v.undefined or v.infinite},
        bound=bound,
        dependence=dep,
    )


def _perturbation_stats(names: Sequence[str], with_main: bool) -> Callable[[Mapping[str, np.ndarray]], dict]:
    def stat(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        units, aggs = [], []
        for a, b in combinations(names, 2):
            d = arrays[a] - arrays[b]  # (..., N, R)
            unit = _sd(d.reshape(*d.shape[:-2], -1))
            agg = _sd(d.mean(axis=-2)) if d.shape[-1] > 1 else np.full(unit.shape, np.nan)
            out[f"{a}|{b}|paired_sd"], out[f"{a}|{b}|aggregate_sd"] = unit, agg
            units.append(unit)
            aggs.append(agg)
        med_unit = np.median(np.stack(units), axis=0)
        med_agg = np.median(np.stack(aggs), axis=0)
        out["median_paired_sd"], out["median_aggregate_sd"] = med_unit, med_agg
        if with_main:
            m = arrays["main"]
            out["multiple_unit_scale"] = _ratio(med_unit, _unit_paired_sd(m))
            out["multiple_aggregate_scale"] = _ratio(med_agg, _paired_sd(m))
            out["multiple_as_published"] = _ratio(med_unit, _paired_sd(m))
        return out

    return stat


def perturbation_floor(variants: Mapping[str, np.ndarray], main: np.ndarray | None = None,
                       resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> PerturbationFloor:
    """`variants`: name -> instances x runs, matched; `main`: the rerun arm on the same instances."""
    names = list(variants)
    arrays = {k: np.asarray(v, float) for k, v in variants.items()}
    shapes = {v.shape for v in arrays.values()}
    if len(shapes) != 1 or any(len(s) != 2 for s in shapes):
        raise InputError(f"variants are not matched instances x runs matrices: shapes {sorted(shapes)}")
    if main is not None:
        arrays["main"] = _matrix(main)
    stat = _perturbation_stats(names, main is not None)
    point = {k: float(v) for k, v in stat(arrays).items()}
    n = next(iter(arrays.values())).shape[0]
    ci, resampled = _bootstrap(arrays, stat, resamples, seed) if n > 1 else ({}, {})

    def val(k: str) -> float | None:
        v = point.get(k)
        return None if v is None or np.isnan(v) else v

    undefined = {}
    for k in ("multiple_unit_scale", "multiple_aggregate_scale", "multiple_as_published"):
        if k in point and np.isnan(point[k]):
            undefined[k] = "0/0: the perturbation SD and the rerun SD are both exactly 0"
    if "median_aggregate_sd" in point and np.isnan(point["median_aggregate_sd"]):
        undefined["median_aggregate_sd"] = "one run per variant: no SD over runs"

    pairs = []
    for a, b in combinations(names, 2):
        pre = f"{a}|{b}|"
        pairs.append(PerturbationPair(a, b, float(arrays[a].mean()), float(arrays[b].mean()), arrays[a].size,
                                      point[pre + "paired_sd"], val(pre + "aggregate_sd"),
                                      {k[len(pre):]: v for k, v in ci.items() if k.startswith(pre)}))
    return PerturbationFloor(tuple(pairs), point["median_paired_sd"], val("median_aggregate_sd"),
                             val("multiple_unit_scale"), val("multiple_aggregate_scale"), val("multiple_as_published"),
                             {k: v for k, v in ci.items() if "|" not in k}, undefined,
                             {k: v for k, v in resampled.items() if "|" not in k and (v.undefined or v.infinite)})


def sd_curve(y: np.ndarray, sizes: Sequence[int], resamples: int = CURVE_RESAMPLES, seed: int = 0,
             alpha: float = 0.05) -> tuple[CurvePoint, ...]:
    """The rerun paired SD on n instances drawn with replacement, per n. Each point has its own
    random stream (spawned from `seed`), so the points are independent estimates."""
    m = _matrix(y)
    out = []
    for n, ss in zip(sizes, np.random.SeedSequence(seed).spawn(len(sizes))):
        vals = np.concatenate([_paired_sd(m[idx]) for idx in
                               index_blocks(m.shape[0], resamples, ss, int(n) * m.shape[1], size=int(n))])
        out.append(CurvePoint(int(n), float(vals.mean()), percentile(vals, alpha), resamples))
    return tuple(out)


def curve_sizes(n: int, step: int = 25) -> list[int]:
    sizes = list(range(step, n, step))
    return [*sizes, n] if n not in sizes else sizes


def _known(x: object) -> bool:
    return x is not None and x == x and str(x).strip() != ""  # x == x: not NaN


def fingerprint_split(y: np.ndarray, fp: np.ndarray) -> FingerprintSplit:
    """`fp` holds one fingerprint label per (instance, run); '' or None where unknown. An unknown
    fingerprint is not a value: a pair with one is neither within nor across."""
    m = _matrix(y)
    f = np.asarray(fp, dtype=object)
    known = np.vectorize(_known, otypes=[bool])(f) if f.size else np.zeros(f.shape, bool)
    within, across, unknown = [], [], 0
    for a, b in combinations(range(m.shape[1]), 2):
        d = m[:, a] - m[:, b]
        both = known[:, a] & known[:, b]
        same = both & (f[:, a] == f[:, b])
        within.extend(d[same])
        across.extend(d[both & ~same])
        unknown += int((~both).sum())

    def sd(xs: list[float]) -> float | None:
        return float(np.std(xs, ddof=1)) if len(xs) > 1 else None

    labels = {x for x, k in zip(f.ravel(), known.ravel()) if k}
    return FingerprintSplit(len(labels), len(within), sd(within), len(across), sd(across), unknown)


TAXONOMY_CLASSES = ("wrong_function", "wrong_arguments", "malformed_output", "other")


@dataclass(frozen=True)
class Taxonomy:
    counts: Mapping[str, int]
    failures: int
    malformed_share: float | None
    malformed_ci: Interval | None


def taxonomy(rows: Sequence[tuple[int, str | None]]) -> Taxonomy:
    """Failure classes of the failed (instance, run) units: `(outcome, label)` pairs. A failure is
    decided by the outcome, not the label: a failed unit without a known label is `other`, a
    passing unit is never a failure whatever its label says."""
    counts = dict.fromkeys(TAXONOMY_CLASSES, 0)
    for outcome, label in rows:
        if outcome:
            continue
        counts[label if label in counts else "other"] += 1
    total = sum(counts.values())
    malformed = counts["malformed_output"]
    return Taxonomy({k: v for k, v in counts.items() if v}, total, malformed / total if total else None,
                    clopper_pearson(malformed, total) if total else None)
