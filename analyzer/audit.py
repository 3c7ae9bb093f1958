"""From outcome rows with `endpoint` / `variant` to every registered floors statistic, per endpoint.

Matched design: the study set is the sorted list of instance ids, hashed; an instance missing
from any run of an endpoint (main arm or any variant), or marked `unrecoverable`, is dropped
from every run of that endpoint and listed as excluded, so every comparison stays paired. The
served models are kept (a change within an endpoint is drift, see `audit_checks`); fingerprints
stay a covariate. Checking, JSON and rendering are elsewhere (`audit_checks`, `floors_report`).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from noisefloor.analyzer import floors
from noisefloor.analyzer.bootstrap import DEFAULT_RESAMPLES
from noisefloor.outcome_rows import OutcomeRow, unique_rows

MAIN = ("", "none", "original", "main")


@dataclass(frozen=True)
class EndpointAudit:
    endpoint: str
    study_set: str  # sha256 of the sorted instance ids kept
    instances: int
    excluded: tuple[tuple[str, str], ...]  # (instance, reason)
    models: tuple[str, ...]
    results: Mapping[str, Any]  # registered statistic key -> its result (None: the arms cannot carry it)

    @property
    def drift(self) -> bool:
        return len(self.models) > 1

    @property
    def rerun(self) -> floors.RerunFloor | None:
        return self.results.get("rerun")

    @property
    def perturbation(self) -> floors.PerturbationFloor | None:
        return self.results.get("perturbation")

    @property
    def curve(self) -> tuple[floors.CurvePoint, ...]:
        return self.results.get("sd_curve") or ()

    @property
    def fingerprints(self) -> floors.FingerprintSplit | None:
        return self.results.get("fingerprints")

    @property
    def taxonomy(self) -> floors.Taxonomy:
        return self.results["taxonomy"]


def is_audit(rows: Sequence[OutcomeRow]) -> bool:
    return any(r.endpoint or r.variant for r in rows)


def _arm(r: OutcomeRow) -> str:
    return "" if (r.variant or "").lower() in MAIN else (r.variant or "")


def main_arm(rows: Sequence[OutcomeRow], audits: Sequence[EndpointAudit] = ()) -> list[OutcomeRow]:
    """The rerun arm's rows for the ladder section, without the instances the matched design
    excluded from an endpoint: one dropped-instance rule for the floors and the ladder, so a single
    missing row removes the same instance from both (rather than the ladder trimming a replicate
    from every task while the floors drop the instance)."""
    excluded = {(a.endpoint, inst) for a in audits for inst, _ in a.excluded}
    return [r for r in rows if not _arm(r) and (r.endpoint or r.condition, r.task_id) not in excluded]


def study_hash(ids: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()


def audit(rows: Sequence[OutcomeRow], curve_resamples: int | None = None, seed: int = 0,
          resamples: int = DEFAULT_RESAMPLES) -> list[EndpointAudit]:
    """`resamples`: instance-bootstrap draws for every floors interval; `curve_resamples`: per
    point of the SD-vs-n curve (None: the curve's default)."""
    settings = floors.FloorSettings(resamples, seed, curve_resamples)
    by_endpoint: dict[str, list[OutcomeRow]] = defaultdict(list)
    for r in rows:
        by_endpoint[r.endpoint or r.condition].append(r)
    return [endpoint_audit(name, rs, settings) for name, rs in by_endpoint.items()]


Cells = Mapping[tuple[str, int], Mapping[str, OutcomeRow]]  # (arm, run) -> instance -> row


def _excluded(cells: Cells, instances: Sequence[str]) -> list[tuple[str, str]]:
    out = []
    for inst in instances:
        missing = [c for c, by in cells.items() if inst not in by]
        bad = [c for c, by in cells.items() if inst in by and by[inst].failure == "unrecoverable"]
        if missing or bad:
            v, run = (missing or bad)[0]
            out.append((inst, f"{'missing' if missing else 'unrecoverable'} in {v or 'main'} run {run}"))
    return out


def _arms(cells: Cells, kept: Sequence[str]) -> floors.Arms:
    runs: dict[str, list[int]] = defaultdict(list)
    for arm, run in cells:
        runs[arm].append(run)

    def matrix(arm: str, value: Any = lambda r: r.outcome, dtype: Any = float) -> np.ndarray:
        return np.array([[value(cells[(arm, r)][i]) for r in sorted(runs[arm])] for i in kept], dtype=dtype)

    has_main = len(runs.get("", [])) >= 2 and bool(kept)
    main = matrix("") if has_main else None
    fps = matrix("", lambda r: r.fingerprint or "", object) if has_main else None
    variants = {v: matrix(v) for v in runs if v} if kept else {}
    failures = tuple((cells[("", r)][i].outcome, cells[("", r)][i].failure) for r in runs.get("", []) for i in kept)
    return floors.Arms(tuple(kept), main, variants, fps, failures)


def endpoint_audit(name: str, rows: Sequence[OutcomeRow], settings: floors.FloorSettings) -> EndpointAudit:
    """One endpoint's matched arms and every registered statistic of them. Each (arm, run,
    instance) is one row: a repeated one is refused, as everywhere rows are read."""
    unique_rows(rows, lambda r: (_arm(r) or "main", r.replicate, r.task_id), f"endpoint {name!r}")
    cells: dict[tuple[str, int], dict[str, OutcomeRow]] = defaultdict(dict)
    for r in rows:
        cells[(_arm(r), r.replicate)][r.task_id] = r
    instances = sorted({r.task_id for r in rows})
    excluded = _excluded(cells, instances)
    drop = {i for i, _ in excluded}
    kept = [i for i in instances if i not in drop]
    arms = _arms(cells, kept)
    results = {s.key: s.compute(arms, settings) for s in floors.registered()}
    models = tuple(sorted({r.model for r in rows if r.model}))
    return EndpointAudit(name, study_hash(kept), len(kept), tuple(excluded), models, results)
