"""The one shape check for a matrix of 0/1 outcomes: instances (tasks) x runs (replicates)."""

from __future__ import annotations

import numpy as np

from noisefloor.errors import InputError


def runs_matrix(y: object, min_runs: int = 1) -> np.ndarray:
    """`y` as a float (N, R) matrix with N >= 1 and R >= `min_runs`, else one line saying why."""
    m = np.asarray(y, dtype=float)
    if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < min_runs:
        runs = f" with at least {min_runs} runs" if min_runs > 1 else ""
        raise InputError(f"need an instances x runs matrix{runs}, got shape {m.shape}")
    return m
