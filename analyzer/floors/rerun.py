"""The rerun floor of one endpoint: how much its score moves between reruns at fixed settings.

- run correlation: Pearson correlation across instances between two runs, averaged over run pairs
  (pairs where a run is constant have no correlation and are left out);
- always-correct / always-wrong / flip instances; ever-flip fraction = flip instances / N;
- marginal SD: SD (ddof=1) of the aggregate score across runs;
- rerun paired SD: the SD (ddof=1) of the matched paired differences s_a - s_b of aggregate scores
  over all run pairs a < b. Unlike a root-mean-square, it is not sqrt(2) x the marginal SD by
  construction, so paired / (sqrt(2) x marginal) can show a trend across run order (and, being
  signed, it depends on which run a flip fell in);
- rerun unit paired SD: the SD of instance-level differences y_ia - y_ib over (instance, run pair).
Intervals: an instance bootstrap centred on each estimate, exact Clopper-Pearson for the ever-flip fraction, and
the SDs' upper ends raised to an exact bound where few instances flipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from noisefloor.analyzer.bootstrap import DEFAULT_RESAMPLES, Resampled, instance_bootstrap
from noisefloor.analyzer.floors import arrays
from noisefloor.analyzer.floors.dependence import PERMUTATIONS, Dependence, dependence
from noisefloor.analyzer.floors.registry import Arms, FloorSettings, Line, Statistic, field_text, number, register
from noisefloor.analyzer.intervals import FEW_VARYING, FlipBound, Interval, clopper_pearson, flip_bound, fmt_ci
from noisefloor.analyzer.matrices import runs_matrix


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


def rerun_paired_sd(y: np.ndarray) -> float:
    return float(arrays.paired_sd(runs_matrix(y, 2)))


def _stats(a: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    m = a["main"]
    paired, marginal = arrays.paired_sd(m), arrays.marginal_sd(m)
    return {"mean_correlation": arrays.mean_correlation(m), "marginal_sd": marginal, "paired_sd": paired,
            "paired_to_marginal": arrays.ratio(paired, np.sqrt(2) * marginal),
            "unit_paired_sd": arrays.unit_paired_sd(m)}


def _sd_bounds(b: FlipBound, n: int) -> dict[str, float]:
    """What each rerun SD would be for independent reruns whose mean flip variance sits at the
    exact bound v: marginal sqrt(v / N), aggregate paired sqrt(2 v / N), unit paired sqrt(2 v)."""
    v = b.variance_upper
    return {"marginal_sd": float(np.sqrt(v / n)), "paired_sd": float(np.sqrt(2 * v / n)),
            "unit_paired_sd": float(np.sqrt(2 * v))}


def _undefined(point: Mapping[str, float]) -> dict[str, str]:
    out = {}
    if np.isnan(point["paired_to_marginal"]):
        out["paired_to_marginal"] = ("0/0: every run has the same aggregate score (marginal SD exactly 0), "
                                     "so the ratio is undefined, not 0")
    if np.isnan(point["mean_correlation"]):
        out["mean_correlation"] = "every run is constant across instances"
    return out


def rerun_floor(y: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                permutations: int = PERMUTATIONS) -> RerunFloor:
    m = runs_matrix(y, 2)
    n, r = m.shape
    lo, hi = m.min(axis=1), m.max(axis=1)
    flip = int((lo != hi).sum())
    point = {k: float(v) for k, v in _stats({"main": m}).items()}
    ci, resampled = instance_bootstrap({"main": m}, _stats, resamples, seed) if n > 1 else ({}, {})
    methods = {k: "instance_bootstrap" for k in ci}
    ci["ever_flip_fraction"] = clopper_pearson(flip, n)
    methods["ever_flip_fraction"] = "clopper_pearson"
    bound = None
    if flip < FEW_VARYING:  # the SDs' bootstrap cannot see flips the runs missed: raise their upper ends
        bound = flip_bound(m)
        for k, up in _sd_bounds(bound, n).items():
            old = ci.get(k, Interval(0.0, 0.0))
            ci[k] = Interval(old.low, max(old.high, up))
            methods[k] = "exact_bound" if flip == 0 else "instance_bootstrap+exact_bound"
    dep = dependence(m, ci.get("mean_correlation"), permutations, seed) if permutations and n > 2 else None
    known = {k: (None if np.isnan(v) else v) for k, v in point.items()}
    return RerunFloor(
        instances=n, runs=r, accuracy=float(m.mean()), mean_correlation=known["mean_correlation"],
        always_correct=int((lo == 1).sum()), always_wrong=int((hi == 0).sum()), flip=flip,
        ever_flip_fraction=flip / n, marginal_sd=point["marginal_sd"], paired_sd=point["paired_sd"],
        paired_to_marginal=known["paired_to_marginal"], unit_paired_sd=point["unit_paired_sd"],
        ci=ci, methods=methods, undefined=_undefined(point),
        resampled={k: v for k, v in resampled.items() if v.undefined or v.infinite},
        bound=bound, dependence=dep,
    )


def _compute(arms: Arms, s: FloorSettings) -> RerunFloor | None:
    return None if arms.main is None else rerun_floor(arms.main, s.resamples, s.seed)


def _lines(r: RerunFloor) -> list[Line]:
    rn = partial(field_text, r)
    out = [
        Line(f"reruns: {r.runs} runs, accuracy {r.accuracy:.4f}, run correlation {rn('mean_correlation', '.3f')}"),
        Line(f"always right / wrong / flip: {r.always_correct} / {r.always_wrong} / {r.flip}; ever-flip "
             f"{number(r.ever_flip_fraction, r.ci.get('ever_flip_fraction'), '.2%')}"),
        Line(f"marginal SD {rn('marginal_sd')}; rerun paired SD {rn('paired_sd')} (aggregate scale); "
             f"unit paired SD {rn('unit_paired_sd')} (per instance)"),
        Line(f"trend across run order: paired / (sqrt2 x marginal) {rn('paired_to_marginal', '.3f')} "
             f"(about 1 for exchangeable runs however dependent; below 1 with a drift across runs)"),
    ]
    if r.dependence is not None:
        d = r.dependence
        checks = "; ".join(f"{c.name.replace('_', ' ')} {c.observed:.4g} (shuffled within instances "
                           f"{fmt_ci(c.null, '.4g')}, p = {c.p_value:.3g})" for c in d.checks)
        out.append(Line(f"dependence between reruns: {d.reason} ({d.permutations} permutations)"
                        + (f": {checks}" if checks else "")))
    if r.bound is not None:
        out.append(Line(f"few flips: {r.bound.sentence()}; SD upper ends raised to what independent "
                        f"reruns at that rate would give"))
    return out


register(Statistic("rerun", _compute, _lines, order=10))
