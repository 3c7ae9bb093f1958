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
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from noisefloor.analyzer.intervals import Interval, clopper_pearson, percentile
from noisefloor.errors import InputError

DEFAULT_RESAMPLES = 2000  # floors intervals: the 2.5% ends rest on 50 resamples each
CURVE_RESAMPLES = 2000
_CHUNK = 250  # bootstrap resamples per block: bounds memory at CHUNK x N x R


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
    ci: Mapping[str, Interval]


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
    """ddof=1 SD along `axis`; 0 where there is a single value."""
    n = x.shape[axis]
    return x.std(axis=axis, ddof=1) if n > 1 else np.zeros(np.delete(x.shape, axis))


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
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def _bootstrap(arrays: Mapping[str, np.ndarray], stat: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]],
               resamples: int, seed: int, alpha: float = 0.05) -> dict[str, Interval]:
    """Percentile intervals of every statistic `stat` returns, with the instances (axis 0 of
    every array) drawn jointly: the same draw for the main arm and every variant."""
    n = next(iter(arrays.values())).shape[0]
    rng = np.random.default_rng(seed)
    draws: dict[str, list[np.ndarray]] = {}
    done = 0
    while done < resamples:
        b = min(_CHUNK, resamples - done)
        idx = rng.integers(0, n, size=(b, n))
        for k, v in stat({name: arr[idx] for name, arr in arrays.items()}).items():
            draws.setdefault(k, []).append(np.asarray(v, dtype=float))
        done += b
    out = {}
    for k, parts in draws.items():
        v = np.concatenate(parts)
        v = v[~np.isnan(v)]
        if v.size:
            out[k] = percentile(v, alpha)
    return out


def rerun_paired_sd(y: np.ndarray) -> float:
    return float(_paired_sd(_matrix(y)))


def _rerun_stats(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    m = arrays["main"]
    paired, marginal = _paired_sd(m), _marginal_sd(m)
    return {"mean_correlation": _mean_correlation(m), "marginal_sd": marginal, "paired_sd": paired,
            "paired_to_marginal": _ratio(paired, np.sqrt(2) * marginal), "unit_paired_sd": _unit_paired_sd(m)}


def rerun_floor(y: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> RerunFloor:
    m = _matrix(y)
    n, r = m.shape
    lo, hi = m.min(axis=1), m.max(axis=1)
    flip = int((lo != hi).sum())
    point = {k: float(v) for k, v in _rerun_stats({"main": m}).items()}
    ci = _bootstrap({"main": m}, _rerun_stats, resamples, seed) if n > 1 else {}
    ci["ever_flip_fraction"] = clopper_pearson(flip, n)
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
    ci = _bootstrap(arrays, stat, resamples, seed) if n > 1 else {}

    def val(k: str) -> float | None:
        v = point.get(k)
        return None if v is None or np.isnan(v) else v

    pairs = []
    for a, b in combinations(names, 2):
        pre = f"{a}|{b}|"
        pairs.append(PerturbationPair(a, b, float(arrays[a].mean()), float(arrays[b].mean()), arrays[a].size,
                                      point[pre + "paired_sd"], val(pre + "aggregate_sd"),
                                      {k[len(pre):]: v for k, v in ci.items() if k.startswith(pre)}))
    return PerturbationFloor(tuple(pairs), point["median_paired_sd"], val("median_aggregate_sd"),
                             val("multiple_unit_scale"), val("multiple_aggregate_scale"), val("multiple_as_published"),
                             {k: v for k, v in ci.items() if "|" not in k})


def sd_curve(y: np.ndarray, sizes: Sequence[int], resamples: int = CURVE_RESAMPLES, seed: int = 0,
             alpha: float = 0.05) -> tuple[CurvePoint, ...]:
    """The rerun paired SD on n instances drawn with replacement, per n. Each point has its own
    random stream (spawned from `seed`), so the points are independent estimates."""
    m = _matrix(y)
    out = []
    for n, ss in zip(sizes, np.random.SeedSequence(seed).spawn(len(sizes))):
        rng = np.random.default_rng(ss)
        vals = np.concatenate([_paired_sd(m[rng.integers(0, m.shape[0], (min(_CHUNK, resamples - i), n))])
                               for i in range(0, resamples, _CHUNK)])
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
