"""From outcome rows with `endpoint` / `variant` to the floors of `floors.py`, per endpoint.

Matched design: the study set is the sorted list of instance ids, hashed; an instance missing
from any run of an endpoint (main arm or any variant), or marked `unrecoverable`, is dropped
from every run of that endpoint and listed as excluded, so every comparison stays paired. A
served-model change within an endpoint is flagged (drift); fingerprints stay a covariate.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from noisefloor.analyzer import floors
from noisefloor.analyzer.outcomes import Row

MAIN = ("", "none", "original", "main")


@dataclass(frozen=True)
class EndpointAudit:
    endpoint: str
    study_set: str  # sha256 of the sorted instance ids kept
    instances: int
    excluded: tuple[tuple[str, str], ...]  # (instance, reason)
    rerun: floors.RerunFloor | None
    perturbation: floors.PerturbationFloor | None
    curve: tuple[floors.CurvePoint, ...]
    fingerprints: floors.FingerprintSplit | None
    taxonomy: floors.Taxonomy
    models: tuple[str, ...]

    @property
    def drift(self) -> bool:
        return len(self.models) > 1


def is_audit(rows: Sequence[Row]) -> bool:
    return any(r.extra.get("endpoint") or r.extra.get("variant") for r in rows)


def main_arm(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r.extra.get("variant", "").lower() in MAIN]


def study_hash(ids: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()


def audit(rows: Sequence[Row], curve_resamples: int = 200, seed: int = 0) -> list[EndpointAudit]:
    by_endpoint: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by_endpoint[r.extra.get("endpoint") or r.condition].append(r)
    return [_endpoint(name, rs, curve_resamples, seed) for name, rs in by_endpoint.items()]


def _endpoint(name: str, rows: list[Row], resamples: int, seed: int) -> EndpointAudit:
    cells: dict[tuple[str, int], dict[str, Row]] = defaultdict(dict)  # (variant, run) -> instance -> row
    for r in rows:  # a later row for the same cell replaces an earlier one: retries deduplicated
        variant = r.extra.get("variant", "")
        cells[("" if variant.lower() in MAIN else variant, r.replicate)][r.task_id] = r
    instances = sorted({r.task_id for r in rows})
    excluded = []
    for inst in instances:
        missing = [c for c, by in cells.items() if inst not in by]
        bad = [c for c, by in cells.items() if inst in by and by[inst].failure == "unrecoverable"]
        if missing or bad:
            v, run = (missing or bad)[0]
            excluded.append((inst, f"{'missing' if missing else 'unrecoverable'} in {v or 'main'} run {run}"))
    drop = {i for i, _ in excluded}
    kept = [i for i in instances if i not in drop]
    arms: dict[str, list[int]] = defaultdict(list)
    for variant, run in cells:
        arms[variant].append(run)

    def matrix(variant: str, attr: str = "outcome") -> np.ndarray:
        runs = sorted(arms[variant])
        if attr == "outcome":
            return np.array([[cells[(variant, r)][i].outcome for r in runs] for i in kept], dtype=float)
        return np.array([[cells[(variant, r)][i].extra.get("fingerprint", "") for r in runs] for i in kept],
                        dtype=object)

    rerun = curve = fps = None
    if "" in arms and len(arms[""]) >= 2 and kept:
        y = matrix("")
        rerun = floors.rerun_floor(y)
        curve = floors.sd_curve(y, floors.curve_sizes(len(kept)), resamples, seed)
        fps = floors.fingerprint_split(y, matrix("", "fingerprint"))
    variants = {v: matrix(v) for v in arms if v}
    pert = floors.perturbation_floor(variants, rerun.paired_sd if rerun else None) if len(variants) >= 2 else None
    main_rows = [cells[("", r)][i] for r in arms.get("", []) for i in kept]
    models = tuple(sorted({r.extra["model"] for r in rows if r.extra.get("model")}))
    return EndpointAudit(name, study_hash(kept), len(kept), tuple(excluded), rerun, pert, curve or (), fps,
                         floors.taxonomy([r.failure for r in main_rows]), models)


def to_json(audits: Sequence[EndpointAudit]) -> dict[str, Any]:
    from dataclasses import asdict

    out = {}
    for a in audits:
        out[a.endpoint] = {
            "study_set": a.study_set,
            "instances": a.instances,
            "excluded": [{"instance": i, "reason": why} for i, why in a.excluded],
            "rerun": asdict(a.rerun) if a.rerun else None,
            "perturbation": asdict(a.perturbation) if a.perturbation else None,
            "sd_curve": [asdict(p) for p in a.curve],
            "fingerprints": asdict(a.fingerprints) if a.fingerprints else None,
            "taxonomy": asdict(a.taxonomy),
            "models": list(a.models),
            "drift": a.drift,
        }
    return out


def table(audits: Sequence[EndpointAudit]) -> str:
    lines = ["Rerun and perturbation floors (matched instances):"]
    for a in audits:
        lines.append(f"  {a.endpoint}: {a.instances} instances (study set {a.study_set[:12]}), "
                     f"{len(a.excluded)} excluded" + (f"; DRIFT: served models {', '.join(a.models)}" if a.drift else ""))
        if a.rerun:
            r = a.rerun
            corr = f"{r.mean_correlation:.3f}" if r.mean_correlation is not None else "n/a"
            ratio = f"{r.paired_to_marginal:.2f}" if r.paired_to_marginal is not None else "n/a"
            lines.append(f"    reruns: {r.runs} runs, accuracy {r.accuracy:.4f}, run correlation {corr}, "
                         f"always right/wrong/flip {r.always_correct}/{r.always_wrong}/{r.flip} "
                         f"(ever-flip {r.ever_flip_fraction:.1%}), marginal SD {r.marginal_sd:.4f}, "
                         f"paired SD {r.paired_sd:.4f} (paired/sqrt2 marginal {ratio})")
        if a.perturbation:
            p = a.perturbation
            mult = f"{p.multiple_of_rerun:.1f}x the rerun paired SD" if p.multiple_of_rerun else "no rerun floor to compare"
            lines.append(f"    perturbations: median paired SD {p.median_paired_sd:.4f} ({mult})")
            for q in p.pairs:
                lines.append(f"      {q.left} vs {q.right}: {q.left_accuracy:.3f} / {q.right_accuracy:.3f}, "
                             f"{q.matched} matched, paired SD {q.paired_sd:.4f}")
        t = a.taxonomy
        if t.failures:
            share = f"{t.malformed_share:.0%}" if t.malformed_share is not None else "n/a"
            lines.append(f"    failures: {dict(sorted(t.counts.items()))}, malformed share {share}")
    return "\n".join(lines)
