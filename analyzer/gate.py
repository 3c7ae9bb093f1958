"""Per-case regression gate: is a candidate's drop on a case real, noise, or undecidable yet?

Two baseline runs and one candidate run of the same stamp (model, sampling, grader, case ids),
each case repeated n times (seed 004). For a case: if the baselines disagree by more than the
flake band the case is `quarantine` (its grader or prompt is too unstable to gate anything);
otherwise the floor is the baseline's one-sided Wilson lower bound minus a slack, and the
candidate is `within_noise` at or above it; below it, `regressed` with zero passes or once it
has been escalated to k=16 repeats (and is still below), else `inconclusive`: re-run that case
at k=16. For an inconclusive case we also say how many more repeats, at the candidate's current
pass rate, would push its one-sided Wilson upper bound under the floor.

The gate's own error rates are in view: for each case, the chance that an unchanged model is
called `regressed` or `quarantine` at its baseline rate and n (exact binomial sums; the escalated
chance for the escalation nfladder's gate design runs: the candidate's first n repeats are kept
and escalate_at - n more are added, so a case already below the floor needs fewer bad draws to
stay there than a fresh escalate_at-run draw would), the chance
that an unchanged suite blocks, a multiplicity-controlled mode (Holm or Benjamini-Hochberg over
the cases' exact one-sided binomial p-values) and the repeats per case that bring the suite's
false-block rate under a target.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from noisefloor.errors import InputError
from noisefloor.outcome_rows import OutcomeRow

Z_SEED = 1.645  # seed 004's one-sided 95% constant, as written: the default, so verdicts match the article's
Z_ONE_SIDED_95 = 1.6448536269514722  # the exact quantile, on request (`z_for(..., exact=True)`)
MAX_REPEATS = 10_000
ESCALATE_AT = 16  # seed 004: an inconclusive case is re-run at k=16; still below the floor is a regression


def z_for(confidence: float = 0.95, exact: bool = False) -> float:
    """The Wilson z: seed 004's 1.645 at one-sided 95% unless the exact normal quantile is asked
    for (the two differ in the fourth decimal, enough to flip boundary cases such as baselines
    2/2 and a candidate at 3/8); any other confidence gets its exact quantile."""
    if confidence == 0.95 and not exact:
        return Z_SEED
    from scipy import special  # here, not at import, and not scipy.stats: that costs every CLI start 1.5 s of CPU

    return float(special.ndtri(confidence))


@dataclass(frozen=True)
class GateSettings:
    z: float = Z_SEED
    slack: float = 0.05
    flake_band: float = 0.25
    escalate_at: int = ESCALATE_AT
    multiplicity: str = "none"  # none / holm / bh: adjust the regressed calls across cases
    alpha: float = 0.05  # level of the multiplicity-controlled mode


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
    more_repeats: int | None  # inconclusive only: at the candidate's rate, to fall clearly below the floor
    p_value: float | None = None  # one-sided exact binomial: candidate passes this low at the baseline rate
    adjusted_p: float | None = None  # with --multiplicity


def wilson_bound(rate: float, n: int, z: float, sign: int) -> float:
    """One side of the Wilson score interval for an observed rate (fractional passes allowed)."""
    if n == 0 or (rate <= 0 and sign < 0) or (rate >= 1 and sign > 0):
        return 0.0 if sign < 0 else 1.0  # exactly: the arithmetic below leaves 3e-18 or 1 - 1e-16 at the ends
    denom = 1 + z * z / n
    centre = rate + z * z / (2 * n)
    margin = z * math.sqrt(max(rate * (1 - rate), 0.0) / n + z * z / (4 * n * n))
    return min(1.0, max(0.0, (centre + sign * margin) / denom))


def wilson_lower(passes: int, n: int, z: float = Z_SEED) -> float:
    return wilson_bound(passes / n if n else 0.0, n, z, -1)


def wilson_upper(passes: int, n: int, z: float = Z_SEED) -> float:
    return wilson_bound(passes / n if n else 0.0, n, z, +1)


def repeats_to_decide(candidate: CaseCounts, floor: float, z: float = Z_SEED) -> int | None:
    """Extra repeats after which, at exactly the candidate's pass rate (no rounding), the Wilson
    upper bound falls below the floor."""
    rate = candidate.rate
    if rate >= floor:
        return None
    n = max(candidate.n, 1)
    while n <= MAX_REPEATS:
        if wilson_bound(rate, n, z, +1) < floor:
            return n - candidate.n
        n += 1
    return None


def floor_of(a: CaseCounts, s: GateSettings) -> float:
    return max(0.0, wilson_lower(a.passes, a.n, s.z) - s.slack)


def case_verdict(case_id: str, a: CaseCounts, b: CaseCounts, c: CaseCounts, s: GateSettings = GateSettings()) -> CaseVerdict:
    floor = floor_of(a, s)
    pooled = (a.passes + b.passes) / max(a.n + b.n, 1)
    from scipy import special  # scipy.special, not scipy.stats: see z_for

    p = float(special.bdtr(c.passes, c.n, pooled)) if c.n else None
    if abs(a.rate - b.rate) > s.flake_band:
        return CaseVerdict(case_id, "quarantine", a, b, c, floor, None, p)
    if c.rate >= floor:
        return CaseVerdict(case_id, "within_noise", a, b, c, floor, None, p)
    if c.passes == 0 or c.n >= s.escalate_at:
        return CaseVerdict(case_id, "regressed", a, b, c, floor, None, p)
    return CaseVerdict(case_id, "inconclusive", a, b, c, floor, repeats_to_decide(c, floor, s.z), p)


def adjust(p: Sequence[float], method: str) -> list[float]:
    """Holm (family-wise error) or Benjamini-Hochberg (false discovery rate) adjusted p-values."""
    p_arr = np.asarray(p, float)
    m = p_arr.size
    if m == 0 or method == "none":
        return list(p_arr)
    order = np.argsort(p_arr)
    ranked = p_arr[order]
    if method == "holm":
        adj = np.maximum.accumulate((m - np.arange(m)) * ranked)
    elif method == "bh":
        adj = np.minimum.accumulate(m / np.arange(m, 0, -1) * ranked[::-1])[::-1]
    else:
        raise InputError(f"unknown multiplicity method {method!r}; choose none, holm or bh")
    out = np.empty(m)
    out[order] = np.minimum(adj, 1.0)
    return list(out)


def gate(a: Mapping[str, CaseCounts], b: Mapping[str, CaseCounts], c: Mapping[str, CaseCounts],
         s: GateSettings = GateSettings()) -> list[CaseVerdict]:
    verdicts = [case_verdict(cid, a[cid], b[cid], c[cid], s) for cid in sorted(a)]
    if s.multiplicity == "none":
        return verdicts
    adjusted = adjust([v.p_value if v.p_value is not None else 1.0 for v in verdicts], s.multiplicity)
    out = []
    for v, q in zip(verdicts, adjusted):
        verdict = v.verdict
        if verdict == "regressed" and q >= s.alpha:  # not significant once the other cases are counted
            verdict = "inconclusive"
        out.append(CaseVerdict(v.case_id, verdict, v.base_a, v.base_b, v.candidate, v.floor,
                               v.more_repeats if verdict != "regressed" else None, v.p_value, q))
    return out


# -- operating characteristics ---------------------------------------------------------------------


@dataclass(frozen=True)
class CaseRisk:
    case_id: str
    rate: float  # the pooled baseline rate assumed true for the unchanged model
    n: tuple[int, int, int]  # repeats in base A, base B, candidate
    false_regressed: float  # P(regressed) for an unchanged model, one pass of the gate
    false_regressed_escalated: float  # ... when an inconclusive candidate keeps its n runs and adds up to k=16
    false_quarantine: float


@dataclass(frozen=True)
class OperatingCharacteristics:
    cases: tuple[CaseRisk, ...]
    suite_false_block: float  # P(some case regressed) for an unchanged model (cases independent)
    suite_false_block_escalated: float
    target: float
    repeats_for_target: int | None  # equal repeats per run that bring the escalated rate under `target`


def _pmf(n: int, p: float) -> np.ndarray:
    """Binomial(n, p) probabilities of 0..n, in logs so that n in the thousands neither
    overflows nor underflows (scipy.stats.binom.pmf's values, without that import's start cost)."""
    from scipy import special

    k = np.arange(n + 1)
    log_comb = special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)
    return np.exp(log_comb + special.xlogy(k, p) + special.xlog1py(n - k, -p))


def _floors(n: int, s: GateSettings) -> np.ndarray:
    """`floor_of(CaseCounts(k, n), s)` for k = 0..n, with the scalar's operations in its order
    (so the same floats: the verdict compares a rate with these to the last bit)."""
    if n == 0:
        return np.zeros(1)
    z = s.z
    p = np.arange(n + 1) / n
    denom = 1 + z * z / n
    centre = p + z * z / (2 * n)
    margin = z * np.sqrt(np.maximum(p * (1 - p), 0.0) / n + z * z / (4 * n * n))
    lower = np.where(p <= 0, 0.0, np.minimum(1.0, np.maximum(0.0, (centre - margin) / denom)))
    return np.maximum(0.0, lower - s.slack)


def _below(n: int, floors: np.ndarray) -> np.ndarray:
    """For each floor, how many pass counts k of n have k / n < floor (the verdict's own comparison)."""
    return np.searchsorted(np.arange(n + 1) / max(n, 1), floors, side="left")


def _kept(n_a: int, n_b: int, rate: float, band: float) -> np.ndarray:
    """For each k_a, P(baseline B's count k_b gives |k_a/n_a - k_b/n_b| <= band): the k_b that keep
    the case out of quarantine form one run of counts; its ends are found by search on a slightly
    wider band and then trimmed by the verdict's own comparison, so the floats agree with it."""
    ra, rb = np.arange(n_a + 1) / max(n_a, 1), np.arange(n_b + 1) / max(n_b, 1)
    lo = np.searchsorted(rb, ra - band - 1e-9, side="left")
    hi = np.searchsorted(rb, ra + band + 1e-9, side="right")  # [lo, hi): a superset by at most one each side
    for _ in range(2):
        drop = (lo < hi) & (np.abs(ra - rb[np.minimum(lo, n_b)]) > band)
        lo = lo + drop
        drop = (lo < hi) & (np.abs(ra - rb[np.maximum(hi - 1, 0)]) > band)
        hi = hi - drop
    cdf = np.concatenate([[0.0], np.cumsum(_pmf(n_b, rate))])
    return np.where(lo < hi, cdf[hi] - cdf[lo], 0.0)


@functools.lru_cache(maxsize=4096)
def _risk(rate: float, n_a: int, n_b: int, n_c: int, s: GateSettings) -> tuple[float, float, float]:
    """(P regressed in one pass, P regressed once inconclusive cases are escalated, P quarantine)
    for a case whose runs all pass at `rate`. The escalation is the one nfladder's gate design
    runs: the candidate keeps its first n_c repeats and adds escalate_at - n_c more."""
    pa, pc = _pmf(n_a, rate), _pmf(n_c, rate)
    keep_a = pa * _kept(n_a, n_b, rate, s.flake_band)  # P(k_a and the case not quarantined)
    p_quarantine = float(pa.sum() - keep_a.sum())
    floors = _floors(n_a, s)
    below = _below(n_c, floors)  # per k_a: candidate counts 0..below-1 fall under the floor
    cdf_c = np.concatenate([[0.0], np.cumsum(pc)])
    p_below = cdf_c[below]
    if n_c >= s.escalate_at:
        p_reg = float(keep_a @ p_below)
        return p_reg, p_reg, p_quarantine
    p_zero = np.where(below > 0, pc[0], 0.0)  # zero passes below the floor: regressed at once
    p_reg = float(keep_a @ p_zero)
    extra = s.escalate_at - n_c
    cdf_x = np.concatenate([[0.0], np.cumsum(_pmf(extra, rate))])  # cdf_x[j] = P(X < j), X the extra passes
    below_esc = _below(s.escalate_at, floors)  # per k_a: totals 0..below_esc-1 still under the floor
    kc = np.arange(1, n_c + 1)
    inconclusive = kc[None, :] < below[:, None]  # (A, C-1): 0 < k_c and k_c / n_c < floor
    still = cdf_x[np.clip(below_esc[:, None] - kc[None, :], 0, extra + 1)]  # P(k_c + X < below_esc)
    p_esc = p_reg + float(keep_a @ ((inconclusive * still) @ pc[1:]))
    return p_reg, p_esc, p_quarantine


def case_risk(case_id: str, rate: float, n_a: int, n_b: int, n_c: int, s: GateSettings = GateSettings()) -> CaseRisk:
    """Exact chances that the gate misjudges a case whose true pass rate is `rate` in all runs
    (the escalated one for the candidate's first n_c repeats kept and escalate_at - n_c added)."""
    reg, esc, quar = _risk(float(rate), int(n_a), int(n_b), int(n_c), s)
    return CaseRisk(case_id, rate, (n_a, n_b, n_c), reg, esc, quar)


def _suite(risks: Sequence[float]) -> float:
    return float(1 - np.prod([1 - r for r in risks])) if risks else 0.0


def suite_false_block(rates: Mapping[str, float], n: int, s: GateSettings = GateSettings()) -> float:
    """P(an unchanged suite blocks) with n repeats in each run, inconclusive cases re-run at k=16."""
    return _suite([case_risk(cid, r, n, n, n, s).false_regressed_escalated for cid, r in rates.items()])


def repeats_for(rates: Mapping[str, float], target: float, s: GateSettings = GateSettings(),
                start: int = 1, max_repeats: int = 1024) -> int | None:
    """The fewest equal repeats per run (from `start`) whose suite false-block rate is under
    `target`: a coarse scan, then bisection (the rate falls with n, up to binomial ripples)."""
    grid = sorted({start, *(n for n in (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
                            if start < n <= max_repeats)})
    lo = None
    for n in grid:
        if suite_false_block(rates, n, s) <= target:
            if lo is None:
                return n
            while n - lo > 1:
                mid = (lo + n) // 2
                lo, n = (lo, mid) if suite_false_block(rates, mid, s) <= target else (mid, n)
            return n
        lo = n
    return None


def operating_characteristics(a: Mapping[str, CaseCounts], b: Mapping[str, CaseCounts], c: Mapping[str, CaseCounts],
                              s: GateSettings = GateSettings(), target: float = 0.05) -> OperatingCharacteristics:
    """What the gate risks for an unchanged model with each case's pooled baseline rate (computed
    for the per-case rule; the multiplicity modes bound their family-wise or false-discovery rate
    at `alpha` by construction)."""
    rates = {cid: (a[cid].passes + b[cid].passes) / max(a[cid].n + b[cid].n, 1) for cid in a}
    risks = tuple(case_risk(cid, rates[cid], a[cid].n, b[cid].n, c[cid].n, s) for cid in sorted(a))
    start = max([max(r.n) for r in risks], default=1)
    return OperatingCharacteristics(risks, _suite([r.false_regressed for r in risks]),
                                    _suite([r.false_regressed_escalated for r in risks]), target,
                                    repeats_for(rates, target, s, start))


# -- one run's counts and stamp -------------------------------------------------------------------


@dataclass(frozen=True)
class RunStamp:
    """What makes two runs comparable: the models requested, the sampling, the grader and the case
    ids, each as the set of normalized values the rows carry (typed by the row reader, so a
    temperature written 0 in one file and 0.0 in another is the same 0.0)."""

    model: tuple[str, ...]
    temperature: tuple[float, ...]
    top_p: tuple[float, ...]
    seed: tuple[int, ...]
    grader_version: tuple[str, ...]
    cases: tuple[str, ...]

    @classmethod
    def of(cls, rows: Sequence[OutcomeRow]) -> RunStamp:
        def values(attr: str) -> tuple[Any, ...]:
            return tuple(sorted({getattr(r, attr) for r in rows if getattr(r, attr) not in (None, "")}))

        return cls(values("model"), values("temperature"), values("top_p"), values("seed"),
                   values("grader_version"), tuple(sorted({r.task_id for r in rows})))

    @property
    def sampling(self) -> dict[str, list[float] | list[int]]:
        pairs = (("temperature", self.temperature), ("top_p", self.top_p), ("seed", self.seed))
        return {k: list(v) for k, v in pairs if v}

    @property
    def missing(self) -> str:
        """The stamp fields absent from every row, "" when stamped."""
        have = (("model", self.model), ("temperature/top_p/seed", self.sampling), ("grader_version", self.grader_version))
        return ", ".join(name for name, v in have if not v)

    def digest(self) -> str:
        doc = {"model": ",".join(self.model) or None, "sampling": self.sampling,
               "grader": ",".join(self.grader_version) or None, "cases": list(self.cases)}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        return (f"model={','.join(self.model) or None} sampling={self.sampling} "
                f"grader={','.join(self.grader_version) or None} cases={len(self.cases)} -> {self.digest()}")


@dataclass(frozen=True)
class GateRun:
    counts: dict[str, CaseCounts]
    run_stamp: RunStamp

    @property
    def stamp(self) -> str:
        return self.run_stamp.digest()

    @property
    def description(self) -> str:
        return self.run_stamp.describe()

    @property
    def missing(self) -> str:
        return self.run_stamp.missing


def run_of(rows: Sequence[OutcomeRow]) -> GateRun:
    """Per-case counts and the stamp of one run's rows (model as requested, sampling, grader, cases)."""
    counts: dict[str, list[int]] = {}
    for r in rows:
        c = counts.setdefault(r.task_id, [0, 0])
        c[0] += r.outcome
        c[1] += 1
    return GateRun({k: CaseCounts(p, n) for k, (p, n) in counts.items()}, RunStamp.of(rows))


GATE_CONDITIONS = ("base_a", "base_b", "candidate")  # the names nfladder's gate design gives its collections
