"""From outcome rows with `endpoint` / `variant` to the floors of `floors.py`, per endpoint.

Matched design: the study set is the sorted list of instance ids, hashed; an instance missing
from any run of an endpoint (main arm or any variant), or marked `unrecoverable`, is dropped
from every run of that endpoint and listed as excluded, so every comparison stays paired. A
served-model change within an endpoint is flagged (drift); fingerprints stay a covariate.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from functools import partial
from typing import Any

import numpy as np

from noisefloor.analyzer import floors
from noisefloor.analyzer.intervals import fmt_ci, fmt_num, jsonable
from noisefloor.analyzer.outcomes import OutcomeError, Row
from noisefloor.display import visible

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
    return any(r.endpoint or r.variant for r in rows)


def main_arm(rows: Sequence[Row], audits: Sequence[EndpointAudit] = ()) -> list[Row]:
    """The rerun arm's rows for the ladder section, without the instances the matched design
    excluded from an endpoint: one dropped-instance rule for the floors and the ladder, so a single
    missing row removes the same instance from both (rather than the ladder trimming a replicate
    from every task while the floors drop the instance)."""
    excluded = {(a.endpoint, inst) for a in audits for inst, _ in a.excluded}
    return [r for r in rows if (r.variant or "").lower() in MAIN and (r.endpoint or r.condition, r.task_id) not in excluded]


def excluded_messages(audits: Sequence[EndpointAudit]) -> list[str]:
    return [f"endpoint {a.endpoint!r}: {len(a.excluded)} instance(s) excluded from the matched design and from the "
            f"ladder section alike ({', '.join(f'{i}: {why}' for i, why in a.excluded[:5])}"
            f"{', ...' if len(a.excluded) > 5 else ''})" for a in audits if a.excluded]


def check_study_set(audits: Sequence[EndpointAudit], expected: str | None) -> None:
    """Refuse an endpoint whose matched instance list is not the frozen one."""
    for a in audits:
        if expected and a.study_set != expected:
            raise OutcomeError(f"endpoint {a.endpoint!r}: the study set changed (sha256 {a.study_set[:16]}..., "
                               f"expected {expected[:16]}...); compare only runs on the frozen instance list")


def drift_messages(audits: Sequence[EndpointAudit]) -> list[str]:
    """One line per endpoint whose served model changed within the study (seed 003's drift guard)."""
    return [f"endpoint {a.endpoint!r} changed served model within the study ({', '.join(a.models)})"
            for a in audits if a.drift]


def study_hash(ids: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()


def audit(rows: Sequence[Row], curve_resamples: int = floors.CURVE_RESAMPLES, seed: int = 0,
          resamples: int = floors.DEFAULT_RESAMPLES) -> list[EndpointAudit]:
    """`resamples`: instance-bootstrap draws for every floors interval; `curve_resamples`: per
    point of the SD-vs-n curve."""
    by_endpoint: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by_endpoint[r.endpoint or r.condition].append(r)
    return [_endpoint(name, rs, curve_resamples, seed, resamples) for name, rs in by_endpoint.items()]


def _endpoint(name: str, rows: list[Row], curve_resamples: int, seed: int, resamples: int) -> EndpointAudit:
    cells: dict[tuple[str, int], dict[str, Row]] = defaultdict(dict)  # (variant, run) -> instance -> row
    for r in rows:  # a later row for the same cell replaces an earlier one: retries deduplicated
        variant = r.variant or ""
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
        return np.array([[cells[(variant, r)][i].fingerprint or "" for r in runs] for i in kept],
                        dtype=object)

    rerun = curve = fps = y = None
    if "" in arms and len(arms[""]) >= 2 and kept:
        y = matrix("")
        rerun = floors.rerun_floor(y, resamples, seed)
        curve = floors.sd_curve(y, floors.curve_sizes(len(kept)), curve_resamples, seed)
        fps = floors.fingerprint_split(y, matrix("", "fingerprint"))
    variants = {v: matrix(v) for v in arms if v}
    pert = floors.perturbation_floor(variants, y, resamples, seed) if len(variants) >= 2 and kept else None
    main_rows = [cells[("", r)][i] for r in arms.get("", []) for i in kept]
    models = tuple(sorted({r.model for r in rows if r.model}))
    return EndpointAudit(name, study_hash(kept), len(kept), tuple(excluded), rerun, pert, curve or (), fps,
                         floors.taxonomy([(r.outcome, r.failure) for r in main_rows]), models)


def to_json(audits: Sequence[EndpointAudit]) -> dict[str, Any]:
    out = {}
    for a in audits:
        out[a.endpoint] = {
            "study_set": a.study_set,
            "instances": a.instances,
            "excluded": [{"instance": i, "reason": why} for i, why in a.excluded],
            "rerun": _plain(a.rerun),
            "perturbation": _plain(a.perturbation),
            "sd_curve": [_plain(p) for p in a.curve],
            "fingerprints": _plain(a.fingerprints),
            "taxonomy": _plain(a.taxonomy),
            "models": list(a.models),
            "drift": a.drift,
        }
    return out


def _plain(x: Any) -> Any:
    """Dataclasses, intervals and mappings as JSON-ready values (intervals as [lo, hi]; an infinite
    end as "Infinity", see intervals.py)."""
    if isinstance(x, floors.FlipBound):
        return {**x._asdict(), "variance_upper": x.variance_upper, "sentence": x.sentence()}
    if is_dataclass(x):
        return {f.name: _plain(getattr(x, f.name)) for f in fields(x)}
    if isinstance(x, Mapping):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, float):
        return jsonable(x)
    return x


def _num(v: float | None, ci: floors.Interval | None = None, fmt: str = ".4f", why: str | None = None,
         res: floors.Resampled | None = None, method: str | None = None) -> str:
    """A number, its interval (open at inf), and what the reader must know to read them: why it is
    undefined, which share of resamples was undefined (left out) or infinite, how the interval was made."""
    if v is None:
        return f"undefined ({why})" if why else "n/a"
    out = fmt_num(v, fmt) + (f" {fmt_ci(ci, fmt)}" if ci is not None else "")
    notes = []
    if res is not None and res.undefined:
        notes.append(f"{res.undefined:.1%} of resamples 0/0, left out")
    if res is not None and res.infinite:
        notes.append(f"{res.infinite:.1%} of resamples infinite")
    if method and method not in ("instance_bootstrap", "clopper_pearson"):
        notes.append(method.replace("_", " "))
    return out + (f" ({'; '.join(notes)})" if notes else "")


def _field(x: floors.RerunFloor | floors.PerturbationFloor, k: str, fmt: str = ".4f") -> str:
    return _num(getattr(x, k), x.ci.get(k), fmt, x.undefined.get(k), x.resampled.get(k),
                getattr(x, "methods", {}).get(k))


def lines(audits: Sequence[EndpointAudit], bullet: str = "  ") -> list[str]:
    """The floors, a line per quantity with its 95% interval; shared by the terminal and Markdown."""
    out = []
    for a in audits:
        out.append(f"{visible(a.endpoint)}: {a.instances} matched instances (study set {a.study_set[:12]}), "
                   f"{len(a.excluded)} excluded" + (f"; DRIFT: served models {', '.join(map(visible, a.models))}"
                                                    if a.drift else ""))
        if a.rerun:
            r, ci = a.rerun, a.rerun.ci
            rn = partial(_field, r)

            out += [
                f"{bullet}reruns: {r.runs} runs, accuracy {r.accuracy:.4f}, run correlation {rn('mean_correlation', '.3f')}",
                f"{bullet}always right / wrong / flip: {r.always_correct} / {r.always_wrong} / {r.flip}; ever-flip "
                f"{_num(r.ever_flip_fraction, ci.get('ever_flip_fraction'), '.2%')}",
                f"{bullet}marginal SD {rn('marginal_sd')}; rerun paired SD {rn('paired_sd')} (aggregate scale); "
                f"unit paired SD {rn('unit_paired_sd')} (per instance)",
                f"{bullet}trend across run order: paired / (sqrt2 x marginal) {rn('paired_to_marginal', '.3f')} "
                f"(about 1 for exchangeable runs however dependent; below 1 with a drift across runs)",
            ]
            if r.dependence is not None:
                d = r.dependence
                null = f", independent runs {fmt_ci(d.null, '.3f')}" if d.null is not None else ""
                out.append(f"{bullet}dependence between reruns: {d.reason}{null} ({d.permutations} permutations)")
            if r.bound is not None:
                out.append(f"{bullet}few flips: {r.bound.sentence()}; SD upper ends raised to what independent "
                           f"reruns at that rate would give")
        if a.perturbation:
            p, ci = a.perturbation, a.perturbation.ci
            pn = partial(_field, p)

            out.append(f"{bullet}perturbations: median paired SD {pn('median_paired_sd')} "
                       f"per unit, {pn('median_aggregate_sd')} on the aggregate scale")
            out.append(f"{bullet}perturbation / rerun multiple: {pn('multiple_unit_scale', '.1f')}"
                       f"x per unit, {pn('multiple_aggregate_scale', '.1f')}x "
                       f"aggregate; as seed 003 publishes it (per-unit over aggregate, grows like sqrt(N)) "
                       f"{pn('multiple_as_published', '.1f')}x")
            for q in p.pairs:
                out.append(f"{bullet}  {visible(q.left)} vs {visible(q.right)}: accuracy {q.left_accuracy:.3f} / {q.right_accuracy:.3f}, "
                           f"{q.matched} matched units, paired SD {_num(q.paired_sd, q.ci.get('paired_sd'))}")
        if a.curve:
            pts = ", ".join(f"n={c.n}: {c.mean:.4f} [{c.ci.lo:.4f}, {c.ci.hi:.4f}]" for c in a.curve)
            out.append(f"{bullet}rerun paired SD by instance count ({a.curve[0].resamples} resamples each): {pts}")
        if a.fingerprints:
            f = a.fingerprints
            out.append(f"{bullet}fingerprints: {f.fingerprints} distinct; within {f.within_pairs} pairs, SD "
                       f"{_num(f.within_sd)}; across {f.across_pairs} pairs, SD {_num(f.across_sd)}"
                       + (f"; {f.unknown_pairs} pairs with an unknown fingerprint left out" if f.unknown_pairs else ""))
        t = a.taxonomy
        if t.failures:
            out.append(f"{bullet}failures: {dict(sorted(t.counts.items()))}, malformed share "
                       f"{_num(t.malformed_share, t.malformed_ci, '.1%')}")
    return out


def table(audits: Sequence[EndpointAudit]) -> str:
    return "\n".join(["Rerun and perturbation floors (matched instances; 95% intervals):",
                      *("  " + line for line in lines(audits))])
