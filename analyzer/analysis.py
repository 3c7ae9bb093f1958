"""The whole analysis of one outcome set: per-condition statistics, joint intervals, contrasts,
leave-one-task-out sensitivity and the judge section. Pure: an OutcomeSet in, an Analysis out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from noisefloor.analyzer.bootstrap import DEFAULT_RESAMPLES, canonical_order, task_bootstrap
from noisefloor.analyzer.intervals import Interval, ci_json, percentile
from noisefloor.analyzer.judge import JudgeStats, judge_columns, judge_stats
from noisefloor.analyzer.ladder import (
    TASK_BOOTSTRAP,
    ConditionStats,
    LeaveOneOut,
    Planning,
    WInterval,
    budget,
    condition_stats,
    leave_one_out,
    task_variances,
    w_interval,
)
from noisefloor.analyzer.outcomes import OutcomeSet
from noisefloor.errors import InputError


@dataclass(frozen=True)
class Settings:
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0
    plan: Planning = field(default_factory=Planning)
    contrasts: tuple[tuple[str, str], ...] = ()  # empty: every pair in ladder order
    batches: tuple[str, str] | None = None
    top_tasks: int = 5


@dataclass(frozen=True)
class ConditionResult:
    name: str
    stats: ConditionStats
    w_interval: WInterval
    score_ci: Interval | None  # None from one task: no interval over tasks
    budget_ci: Interval | None  # whole numbers of reruns; None from one task
    carriers: tuple[LeaveOneOut, ...]
    failures: dict[str, int]
    trimmed_from: tuple[int, int] | None

    @property
    def w_ci(self) -> Interval | None:
        """The w interval; None from one task (a task bootstrap of one task is a point, and no
        exact bound speaks for a population from one draw)."""
        return self.w_interval.ci if self.stats.tasks > 1 else None


CONTRAST_WIDENED = "task_bootstrap+condition_bounds"


@dataclass(frozen=True)
class Contrast:
    a: str
    b: str
    estimate: float
    ci: Interval | None  # None from one task
    leave_one_out: tuple[tuple[str, float], ...]  # (task, estimate without it), the tasks that move it most first
    method: str = TASK_BOOTSTRAP  # or task_bootstrap+condition_bounds when a side's w interval is not the bootstrap's
    note: str = ""
    bootstrap: Interval | None = None  # the joint task-bootstrap interval, when `ci` is wider


@dataclass(frozen=True)
class Analysis:
    tasks: tuple[str, ...]
    conditions: tuple[ConditionResult, ...]
    contrasts: tuple[Contrast, ...]
    batches: Contrast | None
    judge: dict[str, JudgeStats]
    settings: Settings
    warnings: tuple[str, ...]
    dropped_tasks: dict[str, tuple[str, ...]]

    def condition(self, name: str) -> ConditionResult:
        return next(c for c in self.conditions if c.name == name)

    def to_json(self) -> dict[str, Any]:
        conds = {}
        for c in self.conditions:
            s = c.stats
            conds[c.name] = {
                "tasks": s.tasks,
                "replicates": s.replicates,
                "score": s.score,
                "score_ci": ci_json(c.score_ci),
                "w": s.w,
                "w_ci": ci_json(c.w_ci),
                "w_ci_method": c.w_interval.method if c.w_ci is not None else "undefined",
                "w_ci_note": c.w_interval.note if c.w_ci is not None else "one task: no interval over tasks",
                "w_ci_flag": c.w_interval.flag or None,
                "w_exact_upper": c.w_interval.exact_upper,
                "w_bootstrap_ci": ci_json(c.w_interval.bootstrap) if c.w_ci is not None else None,
                "variable_tasks": s.variable_tasks,
                "variable_tasks_ci": list(s.variable_tasks_ci),
                "budget": s.budget,
                "budget_ci": None if c.budget_ci is None else [int(x) for x in c.budget_ci],
                "mde": s.mde,
                "top_tasks": [asdict(x) for x in c.carriers],
                "failures": c.failures,
                "trimmed_from": list(c.trimmed_from) if c.trimmed_from else None,
            }
        return {
            "conditions": conds,
            "contrasts": [_contrast_json(c) for c in self.contrasts],
            "batches": _contrast_json(self.batches) if self.batches else None,
            "judge": {k: v.to_json() for k, v in self.judge.items()},
            "settings": {
                "bootstrap": self.settings.resamples,
                "seed": self.settings.seed,
                "delta": self.settings.plan.delta,
                "alpha": self.settings.plan.alpha,
                "power": self.settings.plan.power,
                "tasks": len(self.tasks),
            },
            "warnings": list(self.warnings),
            "dropped_tasks": {k: list(v) for k, v in self.dropped_tasks.items()},
        }


def _contrast_json(c: Contrast) -> dict[str, Any]:
    return {
        "a": c.a,
        "b": c.b,
        "estimate": c.estimate,
        "ci": ci_json(c.ci),
        "ci_method": c.method,
        "ci_note": c.note,
        "bootstrap_ci": ci_json(c.bootstrap if c.bootstrap is not None else c.ci),
        "leave_one_out": [{"task": t, "estimate": e} for t, e in c.leave_one_out],
    }


DEFAULT_PAIRS_UP_TO = 20  # conditions up to which every pair is contrasted when none is asked for (190 pairs)
DRAWS_HELD = 1 << 23  # resampled means held at once (64 MB), beyond the draws the contrasts need


def analyze(
    data: OutcomeSet, settings: Settings = Settings(), progress: Callable[[int, int], None] | None = None
) -> Analysis:
    names = list(data.conditions)
    judged_names = [c for c, d in data.conditions.items() if d.reference is not None]
    pairs = _pairs(names, settings, judged_names)
    s2 = {c: task_variances(d.outcomes) for c, d in data.conditions.items()}
    judged = {c: judge_columns(d.outcomes, d.reference) for c, d in data.conditions.items() if d.reference is not None}
    contrasted = [x for pair in [*pairs, *([settings.batches] if settings.batches else [])] for x in pair]
    draws = _draws(_columns(data, s2, judged), [f"w:{c}" for c in dict.fromkeys(contrasted)], settings, progress)
    results = [_condition(data, c, s2[c], draws, settings) for c in data.conditions]
    by_name = {r.name: r for r in results}

    def contrast(a: str, b: str) -> Contrast:
        return _contrast(data.tasks, by_name[a], by_name[b], s2, draws, settings)

    judge = {
        c: judge_stats(j, draws.cis[f"judge:{c}"], data.conditions[c].confidence) for c, j in judged.items()
    }
    return Analysis(
        tasks=data.tasks,
        conditions=tuple(results),
        contrasts=tuple(contrast(a, b) for a, b in pairs),
        batches=contrast(*settings.batches) if settings.batches else None,
        judge=judge,
        settings=settings,
        warnings=data.warnings + _unpaired(names, settings, judged_names),
        dropped_tasks=dict(data.dropped_tasks),
    )


@dataclass(frozen=True)
class _Intervals:
    """Every column's percentile interval, and the draws themselves of the columns contrasts need."""

    cis: dict[str, Interval]  # at the settings' alpha
    values: dict[str, np.ndarray]


_ORDER = "\0order"  # a group's first column in grouped runs: each task's rank in the whole set's order


def _draws(columns: dict[str, np.ndarray], keep: Sequence[str], settings: Settings,
           progress: Callable[[int, int], None] | None) -> _Intervals:
    """The joint task bootstrap of `columns`, in groups that hold at most DRAWS_HELD resampled means
    (the `keep` columns first, and their draws kept), so that memory does not grow with the number
    of conditions. The bootstrap puts the tasks in an order of the values it is given
    (`bootstrap.canonical_order`): each group is given first every task's rank in the order of all
    the columns, so every group puts the tasks in that one order and draws the same multiplicities
    of the same tasks from the same seed: every column sees the same resamples, as in one group."""
    b, alpha = settings.resamples, settings.plan.alpha
    size = max(2, DRAWS_HELD // b)
    lead: dict[str, np.ndarray] = {}
    if len(columns) <= size:  # one group, in the columns' own order
        groups = [list(columns)]
    else:
        whole = np.column_stack([np.asarray(v, dtype=float) for v in columns.values()])
        rank = np.empty(len(whole))
        rank[canonical_order(whole)] = np.arange(len(whole))
        lead = {_ORDER: rank}
        rest = [k for k in columns if k not in set(keep)]
        groups = ([list(keep)] if keep else []) + [rest[i:i + size - 1] for i in range(0, len(rest), size - 1)]
    cis: dict[str, Interval] = {}
    values: dict[str, np.ndarray] = {}
    for g, group in enumerate(groups):
        def step(done: int, total: int, g: int = g) -> None:
            if progress is not None:
                progress(g * total + done, len(groups) * total)

        draws = task_bootstrap(lead | {k: columns[k] for k in group}, b, settings.seed, step)
        cis.update(draws.cis(group, alpha))
        if g == 0:
            values.update({k: draws.values[k] for k in keep})
    return _Intervals(cis, values)


def _unpaired(names: Sequence[str], settings: Settings, judged: Sequence[str]) -> tuple[str, ...]:
    """A line saying that no contrast was computed because none was asked for among many conditions."""
    if settings.contrasts or len(names) <= DEFAULT_PAIRS_UP_TO:
        return ()
    n = len(names) - len(judged)
    return (f"{len(names)} conditions: contrasts are computed only when asked for (--contrast A:B; every pair, "
            f"{n * (n - 1) // 2 + len(judged) * (len(judged) - 1) // 2}, is the default up to "
            f"{DEFAULT_PAIRS_UP_TO} conditions)",)


def _columns(data: OutcomeSet, s2: dict[str, np.ndarray], judged: dict[str, Any]) -> dict[str, np.ndarray]:
    """The per-task columns resampled jointly: every condition's w and score, every judge's disagreement."""
    columns: dict[str, np.ndarray] = {}
    for c, d in data.conditions.items():
        columns[f"w:{c}"] = s2[c]
        columns[f"score:{c}"] = d.outcomes.mean(axis=1)
    for c, j in judged.items():
        columns[f"judge:{c}"] = j.disagree
    return columns


def _condition(data: OutcomeSet, c: str, s2: np.ndarray, draws: _Intervals, settings: Settings) -> ConditionResult:
    d = data.conditions[c]
    alpha, plan, n = settings.plan.alpha, settings.plan, len(data.tasks)
    wi = w_interval(d.outcomes, draws.cis[f"w:{c}"], alpha)
    one = n < 2  # one task: every interval over tasks is undefined
    return ConditionResult(
        name=c,
        stats=condition_stats(d.outcomes, plan),
        w_interval=wi,
        score_ci=None if one else draws.cis[f"score:{c}"],
        budget_ci=None if one else Interval(int(budget(wi.ci[0], n, plan)), int(budget(wi.ci[1], n, plan))),
        carriers=leave_one_out(data.tasks, s2, settings.top_tasks),
        failures=dict(d.failures),
        trimmed_from=d.trimmed_from,
    )


def _contrast(tasks: Sequence[str], ra: ConditionResult, rb: ConditionResult, s2: dict[str, np.ndarray], draws: _Intervals,
              settings: Settings) -> Contrast:
    a, b = ra.name, rb.name
    boot = percentile(draws.values[f"w:{a}"] - draws.values[f"w:{b}"], settings.plan.alpha)
    loo = _contrast_loo(tasks, s2[a], s2[b], settings.top_tasks)
    est = float(s2[a].mean() - s2[b].mean())
    wa, wb = ra.w_interval, rb.w_interval
    if len(tasks) < 2:
        return Contrast(a, b, est, None, loo, "undefined", "one task: no interval over tasks")
    if wa.method == TASK_BOOTSTRAP and wb.method == TASK_BOOTSTRAP:
        return Contrast(a, b, est, boot, loo)
    # a side whose bootstrap cannot see what its replicates missed: what the exact bound added
    # to A's upper end may raise the contrast, what it added to B's may lower it
    few = ", ".join(f"{x.name} ({x.w_interval.method})" for x in (ra, rb) if x.w_interval.method != TASK_BOOTSTRAP)
    return Contrast(a, b, est, contrast_bounds(boot, wa, wb), loo, CONTRAST_WIDENED,
                    f"few tasks varied in {few}: the joint task-bootstrap interval widened by what the exact "
                    f"bound added to each side's upper end", boot)


def contrast_bounds(boot: Interval, wa: WInterval, wb: WInterval) -> Interval:
    """The joint bootstrap interval of w_A - w_B, its upper end raised by what A's exact bound
    added above A's bootstrap interval and its lower end lowered by what B's added."""
    return Interval(boot[0] - (wb.ci.high - wb.bootstrap.high), boot[1] + (wa.ci.high - wa.bootstrap.high))


def _pairs(names: Sequence[str], settings: Settings, judged: Sequence[str] = ()) -> list[tuple[str, str]]:
    """The contrasts asked for, else (up to DEFAULT_PAIRS_UP_TO conditions) every pair of comparable
    conditions: generation conditions with each other, judge conditions (rows with a reference)
    with each other, never across (a judge's verdict variance and an agent's outcome variance are
    different quantities). Past that many conditions every pair would grow with their square: only
    the contrasts asked for are computed (`_unpaired` says so in the report)."""
    gen = [n for n in names if n not in judged]
    jud = [n for n in names if n in judged]
    every = [*combinations(gen, 2), *combinations(jud, 2)] if len(names) <= DEFAULT_PAIRS_UP_TO else []
    wanted = list(settings.contrasts) or every
    if settings.batches:
        wanted = [p for p in wanted if set(p) != set(settings.batches)]
    for a, b in [*wanted, *([settings.batches] if settings.batches else [])]:
        for x in (a, b):
            if x not in names:
                raise InputError(f"condition {x!r} is not in the outcomes (have: {', '.join(names)})")
    return wanted


def _contrast_loo(tasks: Sequence[str], sa: np.ndarray, sb: np.ndarray, top: int) -> tuple[tuple[str, float], ...]:
    """The contrast without each task that carries either side or moves it most, most influential first.

    Closed form: (sum(d) - d_j) / (N - 1) with d = s2_A - s2_B, so dropping task j moves the
    estimate by (dbar - d_j) / (N - 1): influence is |d_j - dbar|, not |d_j|. Only tasks that vary
    in A or B are listed (the others all move it by the same dbar / (N - 1)); ties go by task order.
    """
    n = len(tasks)
    if n < 2 or top == 0:
        return ()
    d = sa - sb
    without = (d.sum() - d) / (n - 1)
    influence = np.abs(d - d.mean())
    # the tasks that carry either side, and those that move the difference most
    picked = {int(j) for col in (-sa, -sb, -influence) for j in np.argsort(col, kind="stable")[:top]}
    ordered = sorted((j for j in picked if sa[j] > 0 or sb[j] > 0), key=lambda j: (-influence[j], j))
    return tuple((tasks[j], float(without[j])) for j in ordered)
