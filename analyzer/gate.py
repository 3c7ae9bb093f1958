"""Per-case regression gate: is a candidate's drop on a case real, noise, or undecidable yet?

Two baseline runs and one candidate run of the same stamp (model, sampling, grader, case ids),
each case repeated n times. For a case: if the baselines disagree by more than the flake band the
case is `quarantine` (its grader or prompt is too unstable to gate anything); otherwise the floor
is the baseline's one-sided Wilson lower bound minus a slack, and the candidate is
`within_noise` at or above it, `regressed` below it with zero passes, else `inconclusive`.
For an inconclusive case we also say how many more repeats, at the candidate's current pass rate,
would push the candidate's one-sided Wilson upper bound under the floor and so decide it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

Z_ONE_SIDED_95 = 1.6448536269514722
MAX_REPEATS = 10_000


@dataclass(frozen=True)
class GateSettings:
    z: float = Z_ONE_SIDED_95
    slack: float = 0.05
    flake_band: float = 0.25


@dataclass(frozen=True)
class CaseCounts:
    passes: int
    n: int

    @property
    def rate(self) -> float:
        return self.passes / self.n if self.n else 0.0


@dataclass(frozen=True)
class CaseVerdict:
    case_id: str
    verdict: str  # within_noise / inconclusive / regressed / quarantine
    base_a: CaseCounts
    base_b: CaseCounts
    candidate: CaseCounts
    floor: float
    more_repeats: int | None  # inconclusive only


def _wilson(passes: int, n: int, z: float, sign: int) -> float:
    if n == 0:
        return 0.0 if sign < 0 else 1.0
    p = passes / n
    denom = 1 + z * z / n
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return min(1.0, max(0.0, (centre + sign * margin) / denom))


def wilson_lower(passes: int, n: int, z: float = Z_ONE_SIDED_95) -> float:
    return _wilson(passes, n, z, -1)


def wilson_upper(passes: int, n: int, z: float = Z_ONE_SIDED_95) -> float:
    return _wilson(passes, n, z, +1)


def repeats_to_decide(candidate: CaseCounts, floor: float, z: float = Z_ONE_SIDED_95) -> int | None:
    """Extra repeats after which, at the same pass rate, the upper bound falls below the floor."""
    rate = candidate.rate
    if rate >= floor:
        return None
    n = max(candidate.n, 1)
    while n <= MAX_REPEATS:
        if wilson_upper(round(rate * n), n, z) < floor:
            return n - candidate.n
        n += 1
    return None


def case_verdict(case_id: str, a: CaseCounts, b: CaseCounts, c: CaseCounts, s: GateSettings = GateSettings()) -> CaseVerdict:
    floor = max(0.0, wilson_lower(a.passes, a.n, s.z) - s.slack)
    if abs(a.rate - b.rate) > s.flake_band:
        return CaseVerdict(case_id, "quarantine", a, b, c, floor, None)
    if c.rate >= floor:
        return CaseVerdict(case_id, "within_noise", a, b, c, floor, None)
    if c.passes == 0:
        return CaseVerdict(case_id, "regressed", a, b, c, floor, None)
    return CaseVerdict(case_id, "inconclusive", a, b, c, floor, repeats_to_decide(c, floor, s.z))


def stamp(model: str | None, sampling: Mapping[str, object], grader: str | None, case_ids: list[str]) -> str:
    doc = {"model": model, "sampling": dict(sorted(sampling.items())), "grader": grader, "cases": sorted(case_ids)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def gate(a: Mapping[str, CaseCounts], b: Mapping[str, CaseCounts], c: Mapping[str, CaseCounts],
         s: GateSettings = GateSettings()) -> list[CaseVerdict]:
    return [case_verdict(cid, a[cid], b[cid], c[cid], s) for cid in sorted(a)]
