"""Ladder-shaped outcomes with known truth, for the built-in example and for checking estimators.

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
