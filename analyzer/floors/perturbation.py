"""The prompt-perturbation floor of one endpoint: how much its score moves between named
rewordings of the same prompts, against how much it moves between reruns.

Perturbation paired SD for variants L, R: SD (ddof=1) of y_L - y_R over matched (instance, run)
units (per-unit scale), and on the aggregate scale the SD over matched runs of the run-level
accuracy difference. The perturbation multiple is the median perturbation SD over the rerun SD on
both scales, and, for comparison with published tables, per-unit over aggregate (which grows like
sqrt(N)). Intervals: one instance bootstrap for the main arm and every variant together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import combinations

import numpy as np

from noisefloor.analyzer.bootstrap import DEFAULT_RESAMPLES, Resampled, instance_bootstrap
from noisefloor.analyzer.floors import arrays
from noisefloor.analyzer.floors.registry import Arms, FloorSettings, Line, Statistic, field_text, number, register
from noisefloor.analyzer.intervals import Interval
from noisefloor.analyzer.matrices import runs_matrix
from noisefloor.display import visible
from noisefloor.errors import InputError

MULTIPLES = ("multiple_unit_scale", "multiple_aggregate_scale", "multiple_as_published")


@dataclass(frozen=True)
class PairKey:
    """A statistic of one variant pair, as a bootstrap key (the endpoint-wide ones are plain names)."""

    left: str
    right: str
    stat: str  # paired_sd / aggregate_sd


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
    multiple_as_published: float | None  # median per-unit SD / rerun (aggregate) paired SD
    ci: Mapping[str, Interval]  # a multiple's interval is open at inf when resampled reruns had SD 0
    undefined: Mapping[str, str] = field(default_factory=dict)  # why a None multiple has no value
    resampled: Mapping[str, Resampled] = field(default_factory=dict)  # undefined / infinite resample shares


Key = str | PairKey


def _stats(names: Sequence[str], with_main: bool) -> Callable[[Mapping[str, np.ndarray]], dict[Key, np.ndarray]]:
    def stat(a: Mapping[str, np.ndarray]) -> dict[Key, np.ndarray]:
        out: dict[Key, np.ndarray] = {}
        units, aggs = [], []
        scores = {v: a[v].mean(axis=-2) for v in names}  # (..., R): a pair's run-level difference is theirs
        for left, right in combinations(names, 2):
            d = a[left] - a[right]  # (..., N, R)
            unit = arrays.sd_from_sums(d.reshape(*d.shape[:-2], -1))
            agg = arrays.sd(scores[left] - scores[right]) if d.shape[-1] > 1 else np.full(unit.shape, np.nan)
            out[PairKey(left, right, "paired_sd")], out[PairKey(left, right, "aggregate_sd")] = unit, agg
            units.append(unit)
            aggs.append(agg)
        med_unit, med_agg = np.median(np.stack(units), axis=0), np.median(np.stack(aggs), axis=0)
        out["median_paired_sd"], out["median_aggregate_sd"] = med_unit, med_agg
        if with_main:
            m = a["main"]
            out["multiple_unit_scale"] = arrays.ratio(med_unit, arrays.unit_paired_sd(m))
            out["multiple_aggregate_scale"] = arrays.ratio(med_agg, arrays.paired_sd(m))
            out["multiple_as_published"] = arrays.ratio(med_unit, arrays.paired_sd(m))
        return out

    return stat


def _undefined(point: Mapping[Key, float]) -> dict[str, str]:
    out = {k: "0/0: the perturbation SD and the rerun SD are both exactly 0"
           for k in MULTIPLES if k in point and np.isnan(point[k])}
    if np.isnan(point["median_aggregate_sd"]):
        out["median_aggregate_sd"] = "one run per variant: no SD over runs"
    return out


def perturbation_floor(variants: Mapping[str, np.ndarray], main: np.ndarray | None = None,
                       resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> PerturbationFloor:
    """`variants`: name -> instances x runs, matched; `main`: the rerun arm on the same instances."""
    names = list(variants)
    mats = {k: np.asarray(v, float) for k, v in variants.items()}
    shapes = {v.shape for v in mats.values()}
    if len(shapes) != 1 or any(len(s) != 2 for s in shapes):
        raise InputError(f"variants are not matched instances x runs matrices: shapes {sorted(shapes)}")
    if main is not None:
        mats["main"] = runs_matrix(main, 2)
    stat = _stats(names, main is not None)
    point = {k: float(v) for k, v in stat(mats).items()}
    n = next(iter(mats.values())).shape[0]
    ci, resampled = instance_bootstrap(mats, stat, resamples, seed) if n > 1 else ({}, {})

    def val(k: str) -> float | None:
        v = point.get(k)
        return None if v is None or np.isnan(v) else v

    pairs = tuple(PerturbationPair(a, b, float(mats[a].mean()), float(mats[b].mean()), mats[a].size,
                                   point[PairKey(a, b, "paired_sd")], val(PairKey(a, b, "aggregate_sd")),  # type: ignore[arg-type]
                                   {k.stat: v for k, v in ci.items() if isinstance(k, PairKey) and (k.left, k.right) == (a, b)})
                  for a, b in combinations(names, 2))
    return PerturbationFloor(pairs, point["median_paired_sd"], val("median_aggregate_sd"),
                             val("multiple_unit_scale"), val("multiple_aggregate_scale"), val("multiple_as_published"),
                             {k: v for k, v in ci.items() if isinstance(k, str)}, _undefined(point),
                             {k: v for k, v in resampled.items() if isinstance(k, str) and (v.undefined or v.infinite)})


def _compute(arms: Arms, s: FloorSettings) -> PerturbationFloor | None:
    if len(arms.variants) < 2 or not arms.instances:
        return None
    return perturbation_floor(arms.variants, arms.main, s.resamples, s.seed)


def _lines(p: PerturbationFloor) -> list[Line]:
    pn = partial(field_text, p)
    pairs = tuple(Line(f"{visible(q.left)} vs {visible(q.right)}: accuracy {q.left_accuracy:.3f} / "
                       f"{q.right_accuracy:.3f}, {q.matched} matched units, paired SD "
                       f"{number(q.paired_sd, q.ci.get('paired_sd'))}") for q in p.pairs)
    return [Line(f"perturbations: median paired SD {pn('median_paired_sd')} per unit, "
                 f"{pn('median_aggregate_sd')} on the aggregate scale"),
            Line(f"perturbation / rerun multiple: {pn('multiple_unit_scale', '.1f')}x per unit, "
                 f"{pn('multiple_aggregate_scale', '.1f')}x aggregate; as published (per-unit over aggregate, "
                 f"grows like sqrt(N)) {pn('multiple_as_published', '.1f')}x", pairs)]


register(Statistic("perturbation", _compute, _lines, order=20))
