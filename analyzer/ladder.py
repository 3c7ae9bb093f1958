"""Point statistics of the determinism ladder (ladder paper, Eq. 1/A1, A2, A3).

All functions are pure: arrays in, numbers or frozen dataclasses out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from noisefloor.analyzer.intervals import FEW_VARYING, FlipBound, Interval, clopper_pearson, flip_bound
from noisefloor.analyzer.matrices import runs_matrix
from noisefloor.errors import InputError


@dataclass(frozen=True)
class Planning:
    """The settings that turn a variance into a rerun budget."""

    delta: float = 0.02
    alpha: float = 0.05
    power: float = 0.8

    def __post_init__(self) -> None:
        if not self.delta > 0:
            raise InputError(f"delta must be a positive difference, got {self.delta}")
        if not 0 < self.alpha < 1:
            raise InputError(f"alpha must be in (0, 1), got {self.alpha}")
        if not 0 < self.power < 1:
            raise InputError(f"power must be in (0, 1), got {self.power}")

    @property
    def z(self) -> float:
        """z_{1-alpha/2} + z_{power}."""
        from scipy import special  # here, not at import: every CLI start would pay for scipy

        return float(special.ndtri(1 - self.alpha / 2) + special.ndtri(self.power))


@dataclass(frozen=True)
class ConditionStats:
    tasks: int
    replicates: int
    score: float
    w: float
    variable_tasks: int
    variable_tasks_ci: Interval
    budget: int
    mde: float


def task_variances(outcomes: np.ndarray) -> np.ndarray:
    """Per-task sample variance across replicates (ddof=1); outcomes is (N, R) with R >= 2."""
    y = runs_matrix(outcomes, 2)
    return np.where(y.min(axis=1) == y.max(axis=1), 0.0, y.var(axis=1, ddof=1))  # exact 0, no float residue


def within_variance(outcomes: np.ndarray) -> float:
    """w_c: the mean over tasks of the within-task sample variance."""
    return float(task_variances(outcomes).mean())


def variable_mask(outcomes: np.ndarray) -> np.ndarray:
    """Tasks whose outcome changed at least once across replicates."""
    y = np.asarray(outcomes)
    return y.min(axis=1) != y.max(axis=1)


def budget(w: float | np.ndarray, n_tasks: int, plan: Planning = Planning()) -> int | np.ndarray:
    """Smallest R >= 1 with delta >= z * sqrt(2 w / (N R)) (Eq. A3); vectorized over w."""
    if n_tasks <= 0:
        raise InputError("the number of tasks must be positive")
    need = 2.0 * np.asarray(w, dtype=float) * plan.z**2 / (n_tasks * plan.delta**2)
    # round away float noise before ceil, so an exact integer requirement is not bumped up by one
    r = np.maximum(1, np.ceil(np.round(need, 9))).astype(int)
    return int(r) if r.ndim == 0 else r


def mde(w: float, n_tasks: int, replicates: int, plan: Planning = Planning()) -> float:
    """Minimum detectable effect of a symmetric contrast at the observed R."""
    return plan.z * math.sqrt(2.0 * w / (n_tasks * replicates))


def condition_stats(outcomes: np.ndarray, plan: Planning = Planning()) -> ConditionStats:
    y = np.asarray(outcomes)
    n, r = y.shape
    w = within_variance(y)
    k = int(variable_mask(y).sum())
    return ConditionStats(
        tasks=n,
        replicates=r,
        score=float(y.mean()),
        w=w,
        variable_tasks=k,
        variable_tasks_ci=clopper_pearson(k, n, plan.alpha),
        budget=int(budget(w, n, plan)),
        mde=mde(w, n, r, plan),
    )


TASK_BOOTSTRAP = "task_bootstrap"
WIDENED = "task_bootstrap+exact_bound"
EXACT = "exact_bound"


@dataclass(frozen=True)
class WInterval:
    """An interval for w and how it was made.

    The task bootstrap resamples the observed rows; when few tasks varied it misses what R
    replicates could not show (a task that flips 5% of the time looks deterministic in 5 runs)
    and, with none varying, returns [0, 0] (seed 000 App. A.2 says as much); nor can it see flipping
    tasks the draw of N left out. Then the upper end is raised to the exact population bound of
    `intervals.flip_bound`: `method` names which happened.
    """

    ci: Interval
    method: str  # task_bootstrap / task_bootstrap+exact_bound / exact_bound
    bootstrap: Interval
    bound: FlipBound
    note: str  # one sentence saying how the interval was made
    flag: str = ""  # a known shortfall of this interval's coverage, else ""

    @property
    def exact_upper(self) -> float:
        return self.bound.population_variance_upper


def w_interval(outcomes: np.ndarray, bootstrap: Interval, alpha: float = 0.05,
               few: int = FEW_VARYING) -> WInterval:
    """The w interval: the task-bootstrap percentile interval when at least `few` tasks varied;
    otherwise its upper end raised to the exact bound (and, with no task varying, [0, bound])."""
    b = flip_bound(outcomes, alpha)
    boot = Interval(float(bootstrap[0]), float(bootstrap[1]))
    level = f"{1 - alpha:.0%}"
    if b.varying >= few:
        flag = ""
        if b.varying < 2 * few:
            flag = (f"only {b.varying} tasks varied: the percentile task bootstrap may cover the task-population w "
                    f"less often than {level} (0.93 at 37 x 20 with about 10 varying tasks, bench/coverage.py); "
                    f"for these tasks themselves it holds")
        return WInterval(boot, TASK_BOOTSTRAP, boot, b,
                         f"{level} task bootstrap ({b.varying} of {b.tasks} tasks varied)", flag)
    up = b.population_variance_upper
    if b.varying == 0:
        return WInterval(Interval(0.0, up), EXACT, boot, b,
                         f"no task varied in {b.tasks} x {b.replicates} outcomes: w <= {up:.3g} at {level} "
                         f"(exact binomial bounds on the per-replicate flip rate and on the share of tasks that "
                         f"vary; the task bootstrap gives [0, 0])")
    return WInterval(Interval(boot.low, max(boot.high, up)), WIDENED, boot, b,
                     f"only {b.varying} of {b.tasks} tasks varied (< {few}): task bootstrap lower end, upper end "
                     f"the larger of the bootstrap's and the exact bound w <= {up:.3g} on what {b.replicates} "
                     f"replicates and the draw of {b.tasks} tasks could have missed")


@dataclass(frozen=True)
class LeaveOneOut:
    """Which tasks carry a condition's w, and what w and the contrasts become without each."""

    task: str
    share: float  # fraction of N * w contributed by this task
    w_without: float


def leave_one_out(task_ids: tuple[str, ...], s2: np.ndarray, top: int = 5) -> tuple[LeaveOneOut, ...]:
    """Closed form: w without task j is (N w - s2_j) / (N - 1)."""
    n = len(s2)
    total = float(s2.sum())
    if n < 2 or total == 0:
        return ()
    order = np.argsort(-s2, kind="stable")[:top]
    return tuple(
        LeaveOneOut(task_ids[j], float(s2[j] / total), float((total - s2[j]) / (n - 1))) for j in order if s2[j] > 0
    )
