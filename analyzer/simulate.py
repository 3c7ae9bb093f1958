"""Outcomes with known truth, for the built-in example and for checking estimators: ladder-shaped
conditions, and reruns whose dependence between runs is known (`reruns`).

Each task has a pass probability per condition; outcomes are independent Bernoulli draws, so the
true within-task variance of a condition is mean_i p_i (1 - p_i).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from noisefloor.analyzer.outcomes import Row


@dataclass(frozen=True)
class SimulatedLadder:
    rows: tuple[Row, ...]
    p: dict[str, np.ndarray]  # condition -> per-task pass probability

    def true_w(self, condition: str) -> float:
        p = self.p[condition]
        return float(np.mean(p * (1 - p)))


def ladder_probabilities(n_tasks: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Live: a fraction of tasks genuinely uncertain; t0: fewer and milder; replay: none."""
    base = (rng.random(n_tasks) < 0.7).astype(float)  # what the task's recorded answer would score
    live = base.copy()
    shaky = rng.random(n_tasks) < 0.3
    live[shaky] = rng.uniform(0.15, 0.85, shaky.sum())
    t0 = base.copy()
    mild = shaky & (rng.random(n_tasks) < 0.4)
    t0[mild] = rng.uniform(0.6, 0.95, mild.sum())
    return {"live": live, "t0": t0, "replay": base}


def simulate(p: dict[str, np.ndarray], replicates: int, seed: int) -> SimulatedLadder:
    rng = np.random.default_rng(seed)
    rows = []
    for cond, probs in p.items():
        draws = rng.random((len(probs), replicates)) < probs[:, None]
        for i in range(len(probs)):
            for r in range(replicates):
                rows.append(Row(f"task/{i}", cond, r, int(draws[i, r])))
    return SimulatedLadder(tuple(rows), p)


def example(n_tasks: int = 40, replicates: int = 10, seed: int = 7) -> SimulatedLadder:
    return simulate(ladder_probabilities(n_tasks, np.random.default_rng(seed)), replicates, seed + 1)


# Reruns with known dependence, for checking the dependence diagnostic:
# name: (what it is, dependent between runs given the instance?)
RERUN_KINDS = {
    "homogeneous": ("independent cells, every instance at 0.7", False),
    "heterogeneous": ("independent reruns, instance rates from Beta(0.5, 0.5)", False),
    "instance_effect": ("a latent instance effect shared by all runs (independent given the instance)", False),
    "run_effect": ("each run's logit shifted by N(0, 0.5^2) on every instance", True),
    "run_effect_weak": ("each run's logit shifted by N(0, 0.25^2)", True),
    "duplicated": ("the last run a copy of the run before", True),
    "sticky": ("each rerun repeats the previous outcome with probability 0.2", True),
    "sticky_weak": ("... with probability 0.1", True),
    "drift": ("accuracy 0.45 + 0.03 per run", True),
}


def reruns(kind: str, rng: np.random.Generator, n: int = 150, r: int = 10) -> np.ndarray:
    """n instances x r runs of outcomes of one of the RERUN_KINDS (instance pass rates from
    Beta(0.5, 0.5) where the kind does not say otherwise)."""
    p = rng.beta(0.5, 0.5, n)
    if kind == "homogeneous":
        return (rng.random((n, r)) < 0.7).astype(float)
    if kind == "instance_effect":
        return (rng.normal(size=n)[:, None] * 2.5 + rng.normal(size=(n, r)) > -0.8).astype(float)
    if kind == "drift":
        return (rng.random((n, r)) < 0.45 + 0.03 * np.arange(r)).astype(float)
    if kind.startswith("run_effect"):
        logit = np.log(p / (1 - p))[:, None] + rng.normal(0, 0.25 if kind.endswith("weak") else 0.5, r)[None, :]
        return (rng.random((n, r)) < 1 / (1 + np.exp(-logit))).astype(float)
    y = (rng.random((n, r)) < p[:, None]).astype(float)
    if kind == "duplicated":
        y[:, -1] = y[:, -2]
    elif kind.startswith("sticky"):
        for j in range(1, r):
            keep = rng.random(n) < (0.1 if kind.endswith("weak") else 0.2)
            y[keep, j] = y[keep, j - 1]
    return y
