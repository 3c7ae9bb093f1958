"""Replay coupling (seed 000, Proposition 1 and App. A.4) and the two contrasts a compare study
reports beside each other.

A candidate B replayed strictly against a baseline A's recorded run is *coupled* to it when every
request B issued was answered from the recording (no miss), none out of the recorded order, and B
issued the same multiset of normalized requests as A recorded. Then B - A on that task is a
paired contrast conditional on the recording: it says what B's downstream changes do under A's
fixed responses, not what B would score over fresh generation. Where coupling breaks, the first
request where B left the recording is named, and that task's comparison needs fresh, independent
streams (Eq. 2: SE = sqrt((w_A + w_B) / (N R))).

Pure: sequences and arrays in, frozen dataclasses out. The ladder reads them from a log.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from noisefloor.analyzer.bootstrap import DEFAULT_RESAMPLES, task_bootstrap
from noisefloor.analyzer.intervals import Interval
from noisefloor.analyzer.ladder import Planning, task_variances
from noisefloor.analyzer.matrices import runs_matrix
from noisefloor.errors import InputError

HIT = "hit"
CONDITIONAL = "conditional on the recording: what the candidate's downstream changes do under the baseline's fixed responses"
FRESH = "over fresh generation: both agents sampled anew (independent streams), on these tasks"


@dataclass(frozen=True)
class PairVerdict:
    """One replayed run of B against one recorded run of A."""

    coupled: bool
    recorded_steps: int  # requests in A's recorded run
    replayed_steps: int  # requests B issued
    step: int | None = None  # broken: B's first request (0-based) that left the recording
    reason: str | None = None  # broken: miss / order_violation / fewer requests / other requests
    unreachable: int = 0  # A's recorded requests that B never reached (recorded steps cut off)
    path: str | None = None  # broken: the first JSON path where B's request differs from A's at `step`


def pair_verdict(recorded: Sequence[str], replayed: Sequence[str], results: Sequence[str]) -> PairVerdict:
    """The coupling of one replayed run: `recorded` A's normalized request keys in recorded order,
    `replayed` B's in the order B sent them and `results` each of B's replay results (hit, miss,
    order_violation)."""
    if len(replayed) != len(results):
        raise InputError(f"{len(replayed)} replayed requests but {len(results)} replay results")
    a, b = list(recorded), list(replayed)
    reached = Counter(k for k, res in zip(b, results) if res == HIT) & Counter(a)
    unreachable = len(a) - sum(reached.values())
    first_bad = next((i for i, res in enumerate(results) if res != HIT), None)
    if first_bad is not None:
        return PairVerdict(False, len(a), len(b), first_bad, str(results[first_bad]), unreachable)
    if Counter(a) == Counter(b):
        return PairVerdict(True, len(a), len(b))
    if len(b) < len(a) and Counter(b) <= Counter(a):  # stopped early: the first recorded step never asked
        return PairVerdict(False, len(a), len(b), len(b), "fewer requests", unreachable)
    extra = Counter(b) - Counter(a)  # every request a hit, yet one the recording holds fewer of
    step = next((i for i, k in enumerate(b) if extra.get(k)), len(b))
    return PairVerdict(False, len(a), len(b), step, "other requests", unreachable)


@dataclass(frozen=True)
class TaskCoupling:
    """A task's verdict over its R replayed runs: coupled only when every run is."""

    task_id: str
    pairs: tuple[PairVerdict, ...]

    @property
    def coupled(self) -> bool:
        return bool(self.pairs) and all(p.coupled for p in self.pairs)

    @property
    def first_broken(self) -> tuple[int, PairVerdict] | None:
        """(replicate, verdict) of the first broken run."""
        return next(((r, p) for r, p in enumerate(self.pairs) if not p.coupled), None)


@dataclass(frozen=True)
class PairedContrast:
    """B - A on coupled tasks, each task's mean over its R paired runs; the interval resamples tasks."""

    tasks: int
    replicates: int
    mean_a: float
    mean_b: float
    estimate: float
    ci: Interval
    per_task: tuple[float, ...]
    resamples: int
    claim: str = CONDITIONAL


def paired_contrast(a: np.ndarray, b: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                    alpha: float = 0.05) -> PairedContrast:
    """`a` and `b` (N, R): replicate r of B replayed A's recorded replicate r of the same task."""
    ya, yb = runs_matrix(a), runs_matrix(b)
    if ya.shape != yb.shape:
        raise InputError(f"paired outcomes need the same shape, got {ya.shape} and {yb.shape}")
    d = (yb - ya).mean(axis=1)
    draws = task_bootstrap({"d": d}, resamples, seed)
    return PairedContrast(int(ya.shape[0]), int(ya.shape[1]), float(ya.mean()), float(yb.mean()), float(d.mean()),
                          draws.ci("d", alpha), tuple(float(x) for x in d), resamples)


@dataclass(frozen=True)
class IndependentContrast:
    """B - A from independent streams on the same N tasks (Eq. 2), with the rerun budget that would
    detect `delta` (Eq. A3 with w_A + w_B in place of 2w)."""

    tasks: int
    replicates_a: int
    replicates_b: int
    mean_a: float
    mean_b: float
    estimate: float
    w_a: float
    w_b: float
    se: float
    ci: Interval
    delta: float
    budget: int  # replicates per arm for 80% power at `delta` (normal approximation)
    mde: float  # the difference detectable at this run's replicates
    claim: str = FRESH


def independent_contrast(a: np.ndarray, b: np.ndarray, plan: Planning | None = None) -> IndependentContrast:
    """`a` (N, R_A) and `b` (N, R_B), task i in the same row of both, R >= 2 each; the normal
    interval uses SE = sqrt(w_A / (N R_A) + w_B / (N R_B)) (Eq. 2 when R_A = R_B)."""
    plan = plan or Planning()
    ya, yb = runs_matrix(a, 2), runs_matrix(b, 2)
    if ya.shape[0] != yb.shape[0]:
        raise InputError(f"both arms need the same tasks, got {ya.shape[0]} and {yb.shape[0]} rows")
    n, ra, rb = ya.shape[0], ya.shape[1], yb.shape[1]
    wa, wb = float(task_variances(ya).mean()), float(task_variances(yb).mean())
    se = math.sqrt(wa / (n * ra) + wb / (n * rb))
    est = float(yb.mean() - ya.mean())
    from scipy import special

    z = float(special.ndtri(1 - plan.alpha / 2))
    need = (wa + wb) * plan.z**2 / (n * plan.delta**2)
    budget = max(1, math.ceil(round(need, 9)))
    mde = plan.z * math.sqrt((wa + wb) / (n * min(ra, rb)))
    return IndependentContrast(n, ra, rb, float(ya.mean()), float(yb.mean()), est, wa, wb, se,
                               Interval(est - z * se, est + z * se), plan.delta, budget, mde)
