"""Rerun / perturbation floors and the regression gate, against simulations with known truth,
closed forms and the article's worked numbers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from noisefloor.analyzer import floors
from noisefloor.analyzer.audit import audit, study_hash
from noisefloor.analyzer.gate import (
    CaseCounts,
    GateSettings,
    adjust,
    case_risk,
    case_verdict,
    gate,
    operating_characteristics,
    repeats_to_decide,
    suite_false_block,
    wilson_lower,
    wilson_upper,
)
from noisefloor.analyzer.outcomes import Row
from noisefloor.outcome_rows import OutcomeError


def simulate_reruns(n: int, runs: int, flip_share: float, flip_p: float, rng: np.random.Generator) -> np.ndarray:
    base = (rng.random(n) < 0.75).astype(float)
    flippy = rng.random(n) < flip_share
    y = np.repeat(base[:, None], runs, axis=1)
    flips = (rng.random((n, runs)) < flip_p) & flippy[:, None]
    return np.where(flips, 1 - y, y)


def test_rerun_statistics_land_where_the_simulation_says():
    rng = np.random.default_rng(11)
    n, runs, share, p = 400, 10, 0.1, 0.3
    ratios, ever = [], []
    for _ in range(30):
        f = floors.rerun_floor(simulate_reruns(n, runs, share, p, rng), resamples=20, permutations=0)
        ratios.append(f.paired_to_marginal)
        ever.append(f.ever_flip_fraction)
        assert f.always_correct + f.always_wrong + f.flip == n
    # a flippy instance varies unless it flips on no run or on every run
    assert np.mean(ever) == pytest.approx(share * (1 - (1 - p) ** runs - p**runs), abs=0.01)
    assert 0.85 < np.mean(ratios) < 1.15  # independent reruns: paired = sqrt(2) x marginal


def test_deterministic_reruns_have_a_zero_floor_and_full_correlation():
    rng = np.random.default_rng(1)
    y = simulate_reruns(100, 5, 0.0, 0.0, rng)
    f = floors.rerun_floor(y)
    assert f.flip == 0 and f.paired_sd == 0.0 and f.marginal_sd == 0.0 and f.paired_to_marginal is None
    assert "0/0" in f.undefined["paired_to_marginal"] and f.ci["paired_sd"].high > 0  # an exact bound, not [0, 0]


def test_perturbation_paired_sd_matches_its_closed_form():
    rng = np.random.default_rng(5)
    n, runs, e = 2000, 5, 0.1
    base = (rng.random(n) < 0.8).astype(float)
    variants = {}
    for name in ("compact_user_request", "tool_instruction_prefix", "request_label_wrap"):
        flip = rng.random(n) < e  # the variant changes these instances, the same way on every run
        variants[name] = np.repeat(np.where(flip, 1 - base, base)[:, None], runs, axis=1)
    main = simulate_reruns(n, runs, 0.05, 0.3, rng)
    pf = floors.perturbation_floor(variants, main, resamples=300)
    expected = math.sqrt(2 * e * (1 - e))  # y_L - y_R is +-1 with probability 2e(1-e)
    for pair in pf.pairs:
        assert pair.matched == n * runs
        assert pair.paired_sd == pytest.approx(expected, abs=0.02)
        assert pair.ci["paired_sd"].low < pair.paired_sd < pair.ci["paired_sd"].high
        assert pair.aggregate_sd == 0.0  # each variant changes the same instances on every run
    rerun = floors.rerun_floor(main, resamples=100)
    # one scale at a time: per unit over per unit, and the seed's mixed ratio beside them
    assert pf.multiple_unit_scale == pytest.approx(pf.median_paired_sd / rerun.unit_paired_sd)
    assert pf.multiple_as_published == pytest.approx(pf.median_paired_sd / rerun.paired_sd)
    assert pf.multiple_aggregate_scale == pytest.approx(0.0)
    # the published ratio grows like sqrt(N): per-unit over aggregate-scale SDs
    assert pf.multiple_as_published / pf.multiple_unit_scale == pytest.approx(
        rerun.unit_paired_sd / rerun.paired_sd)
    assert pf.multiple_as_published > 10 * pf.multiple_unit_scale


def test_sd_curve_narrows_with_more_instances():
    rng = np.random.default_rng(2)
    y = simulate_reruns(150, 10, 0.05, 0.3, rng)
    curve = floors.sd_curve(y, floors.curve_sizes(150), seed=3)
    assert [p.n for p in curve] == [25, 50, 75, 100, 125, 150]
    assert all(p.resamples == 2000 for p in curve)
    again = floors.sd_curve(y, floors.curve_sizes(150), seed=4)  # the ends are stable across seeds
    for p, q in zip(curve, again):
        assert abs(p.ci.high - q.ci.high) < 0.25 * (p.ci.high - p.ci.low)
    width = [p.ci[1] - p.ci[0] for p in curve]
    assert width[0] > width[-1]
    assert curve[-1].mean == pytest.approx(floors.rerun_paired_sd(y), rel=0.5)


def test_fingerprint_split_and_taxonomy():
    y = np.array([[1, 0, 1, 0], [1, 1, 1, 1]], dtype=float)
    fp = np.array([["a", "b", "a", "b"], ["a", "b", "a", "b"]], dtype=object)
    s = floors.fingerprint_split(y, fp)
    assert s.fingerprints == 2 and s.within_pairs == 4 and s.across_pairs == 8
    assert s.within_sd == 0.0 and s.across_sd > 0
    # an unknown fingerprint is not a value: two unknowns are not a "within" pair
    unknown = np.array([["", None, "a", "a"], [None, "", "a", "b"]], dtype=object)
    u = floors.fingerprint_split(y, unknown)
    assert (u.within_pairs, u.across_pairs, u.unknown_pairs) == (1, 1, 10) and u.fingerprints == 2
    # failures are counted by outcome: an unlabelled failure is `other`, a labelled pass is no failure,
    # an unknown label is `other`
    t = floors.taxonomy([(1, "correct"), (0, "malformed_output"), (0, "wrong_arguments"), (0, "malformed_output"),
                         (0, None), (1, "malformed_output"), (0, "timeout")])
    assert t.counts == {"malformed_output": 2, "wrong_arguments": 1, "other": 2}
    assert t.failures == 5 and t.malformed_share == pytest.approx(2 / 5)
    assert t.malformed_ci.low < 0.4 < t.malformed_ci.high


def seed003_groq_8b() -> np.ndarray:
    """Seed 003, Table 2, Groq 8B: 150 matched instances x 10 runs, 107 always correct, 42 always
    wrong, one flip. The published paired SD pins the flip to the second run (or the ninth): the
    statistic is signed over ordered run pairs, so the run that flipped matters."""
    y = np.zeros((150, 10))
    y[:107] = 1
    y[149, 1] = 1
    return y


def test_seed_003_table_2_groq_8b_row():
    f = floors.rerun_floor(seed003_groq_8b(), resamples=200)
    assert f.mean_correlation == pytest.approx(0.996744, abs=5e-7)
    assert (f.always_correct, f.always_wrong, f.flip) == (107, 42, 1)
    assert f.ever_flip_fraction == pytest.approx(0.00666667, abs=5e-9)
    assert f.marginal_sd == pytest.approx(0.00210819, abs=5e-9)
    assert f.paired_sd == pytest.approx(0.00282684, abs=5e-9)
    assert f.paired_to_marginal == pytest.approx(0.948, abs=5e-4)
    lo, hi = f.ci["ever_flip_fraction"]  # exact binomial for 1 of 150
    assert lo == pytest.approx(0.000168771, rel=1e-4) and hi == pytest.approx(0.036583, rel=1e-4)


def test_dependent_reruns_now_show_in_the_paired_ratio():
    """A trend across runs (a provider change mid-study) makes reruns dependent: the root-mean-
    square definition stayed at exactly 1; the SD of paired differences falls well below it."""
    rng = np.random.default_rng(9)
    n, runs = 400, 10
    p = 0.5 + 0.02 * np.arange(runs)  # each run a little more likely to pass
    y = (rng.random((n, runs)) < p).astype(float)
    f = floors.rerun_floor(y, resamples=200)
    rms = math.sqrt(np.mean([(a - b) ** 2 for a, b in __import__("itertools").combinations(y.mean(axis=0), 2)]))
    assert rms / (math.sqrt(2) * f.marginal_sd) == pytest.approx(1.0)  # the old statistic cannot see it
    assert f.paired_to_marginal < 0.8


def test_rerun_intervals_cover_the_truth_in_simulation():
    """Percentile instance-bootstrap intervals of the paired SD against its true value (by a large
    simulation of the same design)."""
    rng = np.random.default_rng(21)
    n, runs = 120, 6
    truth = np.mean([floors.rerun_paired_sd(simulate_reruns(n, runs, 0.2, 0.3, rng)) for _ in range(2000)])
    hits = 0
    for i in range(60):
        f = floors.rerun_floor(simulate_reruns(n, runs, 0.2, 0.3, rng), resamples=400, seed=i, permutations=0)
        hits += f.ci["paired_sd"].low <= truth <= f.ci["paired_sd"].high
    assert hits >= 0.8 * 60


def rows_for(endpoint: str, y: np.ndarray, variant: str = "", model: str = "m1") -> list[Row]:
    return [Row(f"i{i}", endpoint, r, int(y[i, r]), failure="correct" if y[i, r] else "wrong_arguments",
                endpoint=endpoint, variant=variant, model=model, fingerprint="fp1")
            for i in range(y.shape[0]) for r in range(y.shape[1])]


def test_matched_design_drops_unrecoverable_instances_everywhere_and_flags_drift():
    rng = np.random.default_rng(4)
    y = simulate_reruns(20, 4, 0.2, 0.3, rng)
    rows = rows_for("e1", y) + rows_for("e1", y, "call_only_suffix") + rows_for("e1", y, "compact_user_request")
    rows = [r for r in rows if not (r.task_id == "i3" and r.variant == "call_only_suffix" and r.replicate == 2)]
    drifted = [replace(r, model="m2") if (r.task_id, r.variant, r.replicate) == ("i0", "", 0) else r for r in rows]
    (a,) = audit(drifted, curve_resamples=50, resamples=200)
    assert a.excluded == (("i3", "missing in call_only_suffix run 2"),)
    assert a.instances == 19 and a.study_set == study_hash([f"i{i}" for i in range(20) if i != 3])
    assert a.drift and a.models == ("m1", "m2")
    assert a.perturbation is not None and len(a.perturbation.pairs) == 1
    # a second row for one (arm, run, instance) is refused, as the ladder refuses it, not silently replaced
    with pytest.raises(OutcomeError, match="task 'i0': replicate 0 appears twice"):
        audit([*rows, Row("i0", "e1", 0, 1, endpoint="e1", model="m2")], curve_resamples=50, resamples=200)


def nfanalyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).with_name("nfanalyze")), *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_floors_section_and_drift_abort(tmp_path):
    rng = np.random.default_rng(8)
    y = simulate_reruns(60, 5, 0.1, 0.3, rng)
    rows = rows_for("groq-8b", y) + rows_for("groq-8b", y, "tool_instruction_prefix") + \
        rows_for("groq-8b", 1 - y, "request_label_wrap")
    path = tmp_path / "audit.jsonl"
    path.write_text("".join(json.dumps({"task_id": r.task_id, "condition": r.condition, "replicate": r.replicate,
                                        "outcome": r.outcome, "failure": r.failure, "endpoint": r.endpoint, "variant": r.variant,
                                        "model": r.model, "fingerprint": r.fingerprint}) + "\n" for r in rows))
    r = nfanalyze("--outcomes", str(path), "--json", "-", "--bootstrap", "200")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    f = doc["floors"]["groq-8b"]
    assert f["rerun"]["runs"] == 5 and f["instances"] == 60 and f["drift"] is False
    assert f["perturbation"]["pairs"][0]["paired_sd"] == pytest.approx(np.std((y - (1 - y)).ravel(), ddof=1))
    assert doc["conditions"]["groq-8b"]["replicates"] == 5  # the ladder section uses the main arm only
    wrong = nfanalyze("--outcomes", str(path), "--study-set", "0" * 64, "--bootstrap", "200")
    assert wrong.returncode != 0 and "study set changed" in wrong.stderr
    drifted = tmp_path / "drift.jsonl"
    drifted.write_text(path.read_text() + json.dumps({"task_id": "i0", "condition": "groq-8b", "replicate": 9,
                                                       "outcome": 1, "endpoint": "groq-8b", "model": "other"}) + "\n")
    d = nfanalyze("--outcomes", str(drifted), "--bootstrap", "200")  # the guard aborts by default
    assert d.returncode == 4 and "changed served model" in d.stderr
    allowed = nfanalyze("--outcomes", str(drifted), "--bootstrap", "200", "--allow-drift", "--json", "-")
    assert allowed.returncode == 0, allowed.stderr
    assert any("changed served model" in w for w in json.loads(allowed.stdout)["warnings"])
    md = tmp_path / "report.md"
    assert nfanalyze("--outcomes", str(path), "--bootstrap", "200", "--markdown", str(md)).returncode == 0
    text = md.read_text()
    assert "## Rerun and perturbation floors" in text and "perturbation / rerun multiple" in text
    # the Markdown carries the JSON's own numbers and intervals, nested by endpoint, statistic and pair
    rr, pair = f["rerun"], f["perturbation"]["pairs"][0]

    def shown(v: float, ci: list[float]) -> str:
        return f"{v:.4f} \\[{ci[0]:.4f}, {ci[1]:.4f}\\]"

    assert "\n- groq-8b: 60 matched instances \\(study set " in text
    assert f"\n  - marginal SD {shown(rr['marginal_sd'], rr['ci']['marginal_sd'])}" in text
    assert f"rerun paired SD {shown(rr['paired_sd'], rr['ci']['paired_sd'])}" in text
    assert f"ever-flip {rr['ever_flip_fraction']:.2%} \\[{rr['ci']['ever_flip_fraction'][0]:.2%}, " in text
    assert f"\n    - tool\\_instruction\\_prefix vs request\\_label\\_wrap: accuracy {pair['left_accuracy']:.3f}" in text
    assert f"paired SD {shown(pair['paired_sd'], pair['ci']['paired_sd'])}" in text


def test_wilson_worked_numbers_and_bounds():
    assert round(wilson_lower(6, 8), 2) == 0.46
    assert round(wilson_lower(3, 8), 2) == 0.16
    assert wilson_lower(0, 8) == 0.0 and wilson_upper(8, 8) == 1.0
    assert wilson_lower(3, 8) < 3 / 8 < wilson_upper(3, 8)


def test_gate_verdicts():
    a, b = CaseCounts(6, 8), CaseCounts(7, 8)
    assert case_verdict("c", a, b, CaseCounts(5, 8)).verdict == "within_noise"  # 0.625 >= 0.46 - 0.05
    v = case_verdict("c", a, b, CaseCounts(3, 8))
    assert v.verdict == "inconclusive" and v.floor == pytest.approx(wilson_lower(6, 8) - 0.05)
    assert v.more_repeats is not None and v.more_repeats > 0
    # 4/8 against a 0.697 floor: at exactly rate 0.5, 15 repeats put the upper bound under it
    assert repeats_to_decide(CaseCounts(4, 8), 0.697) == 7
    assert case_verdict("c", a, b, CaseCounts(0, 8)).verdict == "regressed"
    assert case_verdict("c", CaseCounts(8, 8), CaseCounts(4, 8), CaseCounts(8, 8)).verdict == "quarantine"
    assert repeats_to_decide(CaseCounts(5, 8), 0.3) is None
    # seed 004: still below the floor at k=16 is a regression, not another inconclusive
    assert case_verdict("c", CaseCounts(15, 16), CaseCounts(15, 16), CaseCounts(6, 16)).verdict == "regressed"
    assert case_verdict("c", CaseCounts(15, 16), CaseCounts(15, 16), CaseCounts(6, 15)).verdict == "inconclusive"


def simulate_gate(rate: float, n: int, s: GateSettings, rng: np.random.Generator, trials: int) -> tuple[float, float]:
    """Run the gate itself on simulated unchanged runs: how often it says regressed / quarantine."""
    k = rng.binomial(n, rate, size=(trials, 3))
    verdicts = [case_verdict("c", CaseCounts(int(x), n), CaseCounts(int(y), n), CaseCounts(int(z), n), s).verdict
                for x, y, z in k]
    return verdicts.count("regressed") / trials, verdicts.count("quarantine") / trials


@pytest.mark.parametrize("rate,n", [(0.15, 8), (0.6, 8), (0.9, 16)])
def test_operating_characteristics_match_a_simulation_of_the_gate(rate, n):
    s = GateSettings()
    risk = case_risk("c", rate, n, n, n, s)
    reg, quar = simulate_gate(rate, n, s, np.random.default_rng(3), 20_000)
    assert risk.false_regressed == pytest.approx(reg, abs=0.01)
    assert risk.false_quarantine == pytest.approx(quar, abs=0.01)
    assert risk.false_regressed_escalated >= risk.false_regressed


def test_wilson_bounds_are_exact_at_zero_and_all_passes():
    """The score interval's arithmetic leaves 3e-18 above 0 (and 1e-16 under 1) for some n: with
    --slack 0 a baseline at 0/n then had a positive floor and a candidate at 0/n was `regressed`."""
    s = GateSettings(slack=0.0)
    for n in range(1, 400):
        assert wilson_lower(0, n) == 0.0 and wilson_upper(n, n) == 1.0
        assert case_verdict("c", CaseCounts(0, n), CaseCounts(0, n), CaseCounts(0, n), s).verdict == "within_noise"
    assert case_risk("c", 0.0, 9, 9, 9, s).false_regressed == 0.0


def escalated_verdict(a: CaseCounts, b: CaseCounts, c: CaseCounts, extra_passes: int, s: GateSettings) -> str:
    """The gate design's two passes: an inconclusive candidate keeps its runs and adds escalate_at - n more."""
    v = case_verdict("c", a, b, c, s).verdict
    if v != "inconclusive":
        return v
    return case_verdict("c", a, b, CaseCounts(c.passes + extra_passes, s.escalate_at), s).verdict


@pytest.mark.parametrize("n,s", [((8, 8, 8), GateSettings()), ((8, 12, 5), GateSettings()),
                                 ((6, 6, 6), GateSettings(slack=0.0, flake_band=0.2, escalate_at=10)),
                                 ((12, 12, 12), GateSettings(z=1.6448536269514722))])
@pytest.mark.parametrize("rate", [0.3, 0.75, 0.9])
def test_escalated_risk_is_the_verdict_function_summed_over_every_outcome(n, s, rate):
    """Every (k_a, k_b, k_c, extra passes) through the verdict function itself, weighted by its
    binomial probability: the closed form must equal it (not a fresh escalate_at-run draw)."""
    from scipy import stats

    na, nb, nc = n
    extra = s.escalate_at - nc
    pa, pb, pc, px = (stats.binom.pmf(np.arange(m + 1), m, rate) for m in (na, nb, nc, extra))
    reg = esc = quar = 0.0
    for ka in range(na + 1):
        for kb in range(nb + 1):
            for kc in range(nc + 1):
                w = pa[ka] * pb[kb] * pc[kc]
                a, b, c = CaseCounts(ka, na), CaseCounts(kb, nb), CaseCounts(kc, nc)
                first = case_verdict("c", a, b, c, s).verdict
                reg += w * (first == "regressed")
                quar += w * (first == "quarantine")
                esc += w * sum(px[x] for x in range(extra + 1) if escalated_verdict(a, b, c, x, s) == "regressed")
    risk = case_risk("c", rate, na, nb, nc, s)
    assert risk.false_regressed == pytest.approx(reg, abs=1e-12)
    assert risk.false_regressed_escalated == pytest.approx(esc, abs=1e-12)
    assert risk.false_quarantine == pytest.approx(quar, abs=1e-12)


def test_printed_suite_risk_is_within_monte_carlo_error_of_the_gate_design():
    """40 unchanged cases at 0.75, k=8, escalated to 16 keeping the first 8: about 0.575 block."""
    s, rng, trials, cases = GateSettings(), np.random.default_rng(11), 2000, 40
    k = rng.binomial(8, 0.75, size=(trials, cases, 3))
    x = rng.binomial(8, 0.75, size=(trials, cases))
    blocked = [any(escalated_verdict(CaseCounts(int(a), 8), CaseCounts(int(b), 8), CaseCounts(int(c), 8),
                                     int(e), s) == "regressed" for (a, b, c), e in zip(k[t], x[t])) for t in range(trials)]
    counts = {f"c{i}": CaseCounts(6, 8) for i in range(cases)}
    oc = operating_characteristics(counts, counts, counts, s)
    se = math.sqrt(0.25 / trials)
    assert oc.suite_false_block_escalated == pytest.approx(np.mean(blocked), abs=3.5 * se)
    assert oc.suite_false_block_escalated == pytest.approx(0.5754, abs=5e-4)


def test_forty_low_rate_cases_block_an_unchanged_model_and_the_plan_fixes_it():
    rates = np.linspace(0.1, 0.2, 40)
    counts = {f"c{i}": CaseCounts(round(r * 8), 8) for i, r in enumerate(rates)}
    oc = operating_characteristics(counts, counts, counts, GateSettings(), target=0.05)
    assert oc.suite_false_block > 0.9  # the 95%: almost every unchanged run blocks
    n = oc.repeats_for_target
    assert n is not None and n > 8
    rates = {k: v.rate for k, v in counts.items()}
    assert suite_false_block(rates, n) <= 0.05 < suite_false_block(rates, n - 1)


def test_multiplicity_adjustments_closed_form_and_effect():
    assert adjust([0.01, 0.04, 0.03, 0.5], "holm") == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert adjust([0.01, 0.04, 0.03, 0.5], "bh") == pytest.approx([0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.5])
    base = {f"c{i}": CaseCounts(3, 8) for i in range(40)}
    cand = {f"c{i}": CaseCounts(0 if i < 3 else 3, 8) for i in range(40)}
    plain = gate(base, base, cand)
    holm = [v.verdict for v in gate(base, base, cand, GateSettings(multiplicity="holm"))]
    assert [v.verdict for v in plain].count("regressed") == 3
    assert plain[0].p_value == pytest.approx((5 / 8) ** 8)  # 0 of 8 at the baseline's 3/8
    assert holm.count("regressed") == 0  # p = 0.023 is not rare among 40 cases
    strong = {f"c{i}": CaseCounts(8, 8) for i in range(40)}
    wiped = {f"c{i}": CaseCounts(0 if i < 3 else 8, 8) for i in range(40)}
    assert [v.verdict for v in gate(strong, strong, wiped, GateSettings(multiplicity="holm"))].count("regressed") == 3


def write_run(path: Path, passes: dict[str, int], n: int = 8, temperature: float = 0.7) -> Path:
    with path.open("w") as fh:
        for case, p in passes.items():
            for r in range(n):
                fh.write(json.dumps({"task_id": case, "condition": "run", "replicate": r, "outcome": int(r < p),
                                     "model": "m", "temperature": temperature, "grader_version": "g7"}) + "\n")
    return path


def test_gate_cli_exit_codes(tmp_path):
    a = write_run(tmp_path / "a.jsonl", {"x": 6, "y": 8, "z": 7})
    b = write_run(tmp_path / "b.jsonl", {"x": 7, "y": 8, "z": 7})
    ok = write_run(tmp_path / "ok.jsonl", {"x": 6, "y": 3, "z": 7})
    r = nfanalyze("gate", str(a), str(b), str(ok), "--json", str(tmp_path / "g.json"))
    assert r.returncode == 0, r.stderr
    assert "y: inconclusive" in r.stdout and "re-run it at k=16" in r.stdout and "already below the floor" in r.stdout
    doc = json.loads((tmp_path / "g.json").read_text())
    assert doc["counts"] == {"within_noise": 2, "inconclusive": 1, "regressed": 0, "quarantine": 0}
    bad = write_run(tmp_path / "bad.jsonl", {"x": 0, "y": 8, "z": 7})
    assert nfanalyze("gate", str(a), str(b), str(bad)).returncode == 1
    hot = write_run(tmp_path / "hot.jsonl", {"x": 6, "y": 8, "z": 7}, temperature=1.0)
    r = nfanalyze("gate", str(a), str(b), str(hot))
    assert r.returncode == 2 and "different stamps" in r.stderr
    assert "operating characteristics" in nfanalyze("gate", str(a), str(b), str(ok)).stdout


def test_gate_refuses_unstamped_duplicated_and_pooled_runs(tmp_path):
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"task_id": c, "replicate": r, "outcome": 1}) + "\n"
                             for c in ("x", "y") for r in range(8)))
    r = nfanalyze("gate", str(plain), str(plain), str(plain))
    assert r.returncode == 2 and "unstamped" in r.stderr and "grader_version" in r.stderr
    assert nfanalyze("gate", str(plain), str(plain), str(plain), "--allow-unstamped").returncode == 0
    a = write_run(tmp_path / "a.jsonl", {"x": 3, "y": 8}, n=8)
    dup = tmp_path / "dup.jsonl"
    dup.write_text(a.read_text() + a.read_text().splitlines(keepends=True)[0])
    r = nfanalyze("gate", str(a), str(a), str(dup))
    assert r.returncode != 0 and "appears twice" in r.stderr
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(a.read_text() + a.read_text().replace('"condition": "run"', '"condition": "other"'))
    r = nfanalyze("gate", str(a), str(a), str(mixed))
    assert r.returncode != 0 and "several conditions" in r.stderr
    assert nfanalyze("gate", str(a), str(a), str(mixed), "--condition", "run").returncode == 0


# -- pass^k: a statistic added to the floors report by its own module alone ---------------------


def test_pass_k_is_unbiased_in_closed_form_and_in_simulation():
    from scipy import stats

    from noisefloor.analyzer.floors.pass_k import pass_k, per_task

    n = 8
    for p in (0.0, 0.3, 0.5, 0.9, 1.0):  # exact: E[C(C,k)/C(n,k)] = p^k for C ~ Bin(n, p)
        c = np.arange(n + 1)
        for k in (1, 2, 5, 8):
            assert stats.binom.pmf(c, n, p) @ per_task(c, n, k) == pytest.approx(p**k, abs=1e-12)
    assert per_task(np.array([3]), 4, 2)[0] == pytest.approx(math.comb(3, 2) / math.comb(4, 2))
    # known truth: 60 tasks with their own pass rates; the plug-in (c/n)^k is biased, the estimate is not
    rng = np.random.default_rng(7)
    q = rng.uniform(0, 1, 60)
    truth = float(np.mean(q**3))
    est, plug = [], []
    for _ in range(2000):
        y = (rng.uniform(size=(60, n)) < q[:, None]).astype(float)
        est.append(per_task(y.sum(axis=1), n, 3).mean())
        plug.append(((y.mean(axis=1)) ** 3).mean())
    se = np.std(est, ddof=1) / math.sqrt(len(est))
    assert abs(np.mean(est) - truth) < 3 * se
    assert np.mean(plug) - truth > 10 * se  # the bias the unbiased form avoids
    (point,) = pass_k((rng.uniform(size=(60, n)) < q[:, None]).astype(float), ks=(3,), resamples=500)
    assert point.k == 3 and point.tasks == 60 and point.runs == n and point.ci.covers(point.estimate)


def test_pass_k_task_bootstrap_interval_covers_in_simulation():
    from noisefloor.analyzer.floors.pass_k import pass_k

    rng = np.random.default_rng(11)
    hits, studies = 0, 200
    for i in range(studies):  # tasks drawn from a population whose pass^2 is known: E[q^2] for q ~ Beta(2, 2) = 0.3
        q = rng.beta(2, 2, 80)
        y = (rng.uniform(size=(80, 6)) < q[:, None]).astype(float)
        (p2,) = pass_k(y, ks=(2,), resamples=400, seed=i)
        hits += p2.ci.covers(0.3)
    assert hits / studies >= 0.9  # nominal 0.95; 200 studies put 0.9 about 3 SE below it


def test_pass_k_shows_in_terminal_json_and_markdown_from_its_own_module(tmp_path):
    from noisefloor.analyzer import floors_report
    from noisefloor.analyzer.floors import registry

    stat = registry.STATISTICS["pass_k"]
    assert stat.compute.__module__ == "noisefloor.analyzer.floors.pass_k"
    root = Path(floors.__file__).parents[1]  # analyzer/: no other module names it, the registry finds it
    others = [p for p in root.rglob("*.py") if p.name != "pass_k.py" and "pass_k" in p.read_text()]
    assert others == []
    y = np.array([[1, 1, 1, 1], [1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]] * 5, dtype=float)
    rows = rows_for("e1", y)
    (a,) = audit(rows, curve_resamples=20, resamples=300)
    want = np.mean([1, 0.5, 0, 1 / 6])  # C(c,2)/C(4,2) for c = 4, 3, 0, 2
    doc = floors_report.to_json([a])["e1"]["pass_k"]
    assert [p["k"] for p in doc] == [1, 2, 4] and doc[1]["estimate"] == pytest.approx(want)
    lo, hi = doc[1]["ci"]
    assert lo <= want <= hi and hi - lo > 0
    assert f"k=2: {want:.4f} [{lo:.4f}, {hi:.4f}]" in floors_report.table([a])
    md = "\n".join(floors_report.markdown([a]))
    assert "pass^k" in md and f"k=2: {want:.4f} \\[{lo:.4f}, {hi:.4f}\\]" in md


def test_stamps_are_typed_so_a_jsonl_0_and_a_csv_0_0_are_one_stamp(tmp_path):
    from noisefloor.analyzer.gate_input import load_run
    from noisefloor.analyzer.gate_run import run_files

    jsonl = write_run(tmp_path / "a.jsonl", {"x": 6, "y": 8}, temperature=0)
    csv = tmp_path / "b.csv"
    csv.write_text("task_id,condition,replicate,outcome,model,temperature,seed,grader_version\n" + "".join(
        f"{c},run,{r}.0,{int(r < p)},m,0.0,,g7\n" for c, p in (("x", 6), ("y", 8)) for r in range(8)))
    a, b = load_run(jsonl), load_run(csv)
    assert a.run_stamp.temperature == b.run_stamp.temperature == (0.0,) and b.run_stamp.seed == ()
    assert a.stamp == b.stamp and a.missing == "" and "sampling={'temperature': [0.0]}" in a.description
    result = run_files(jsonl, csv, jsonl)  # refused as different stamps before the stamp was typed
    assert result.stamp == a.stamp and result.counts["within_noise"] == 2
    hot = load_run(write_run(tmp_path / "hot.jsonl", {"x": 6, "y": 8}, temperature=0.5))
    assert hot.stamp != a.stamp


def test_sum_based_unit_sd_and_run_correlation_equal_their_definitions():
    from itertools import combinations

    from noisefloor.analyzer.floors import arrays

    rng = np.random.default_rng(3)
    cases = [(rng.uniform(size=(n, r)) < 0.6).astype(float) for n, r in ((1, 2), (7, 2), (30, 3), (50, 10))]
    cases += [np.ones((5, 4)), np.tile([1.0, 0, 1, 0], (5, 1)), np.array([[1.0, 0], [0, 1]]), np.array([[1.0, 0], [1, 0]])]
    for y in cases:
        pairs = list(combinations(range(y.shape[1]), 2))
        d = np.concatenate([y[:, a] - y[:, b] for a, b in pairs])
        want = 0.0 if d.size < 2 or d.min() == d.max() else np.std(d, ddof=1)
        got = float(arrays.unit_paired_sd(y))
        assert got == pytest.approx(want, abs=1e-12) and (got == 0.0) == (want == 0.0)
        rs = [np.corrcoef(y[:, a], y[:, b])[0, 1] for a, b in pairs if y[:, a].std() > 0 and y[:, b].std() > 0]
        corr = float(arrays.mean_correlation(y))
        assert (np.isnan(corr) and not rs) or corr == pytest.approx(np.mean(rs), abs=1e-12)
