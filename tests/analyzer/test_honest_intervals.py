"""Intervals that stay honest where the bootstrap degenerates (issue 26): exact zeros, 0/0 as
undefined, +inf kept, the exact bound on what R replicates could miss, seed 004's z, what the
paired ratio detects and the dependence diagnostic that detects what it does not. Checked
against closed forms, seed numbers and simulations with known truth."""

from __future__ import annotations

import json
import math
from itertools import combinations

import numpy as np
import pytest

from noisefloor.analyzer import audit as audit_mod
from noisefloor.analyzer import audit_checks, floors, floors_report
from noisefloor.analyzer.analysis import Settings, _contrast_loo, analyze
from noisefloor.analyzer.bootstrap import index_blocks, task_bootstrap
from noisefloor.analyzer.floors.registry import plain
from noisefloor.analyzer.gate import Z_ONE_SIDED_95, CaseCounts, GateSettings, case_verdict, wilson_lower, z_for
from noisefloor.analyzer.intervals import ci_json, clopper_pearson_upper, flip_bound, fmt_ci, percentile
from noisefloor.analyzer.ladder import w_interval
from noisefloor.analyzer.outcomes import Row, build
from noisefloor.analyzer.report import table


def groq_8b() -> np.ndarray:
    """Seed 003 Table 2, Groq 8B: 150 x 10, 107 always right, 42 always wrong, one flip (run 2)."""
    y = np.zeros((150, 10))
    y[:107] = 1
    y[149, 1] = 1
    return y


# -- (3) seed 004's z ----------------------------------------------------------------------------


def test_gate_uses_seed_004_z_and_its_boundary_cases():
    assert GateSettings().z == 1.645 == z_for() and z_for(exact=True) == pytest.approx(Z_ONE_SIDED_95, abs=1e-15)
    assert round(wilson_lower(6, 8), 2) == 0.46 and round(wilson_lower(3, 8), 2) == 0.16
    # all passes: the Wilson lower bound is 1 / (1 + z^2 / n) in closed form
    assert wilson_lower(2, 2) == pytest.approx(1 / (1 + 1.645**2 / 2), abs=1e-15)
    a = b = CaseCounts(2, 2)
    # floor = 0.4249868 - 0.05 = 0.3749868 <= 3/8 with 1.645; 0.3750017 > 3/8 with the exact quantile
    assert case_verdict("c", a, b, CaseCounts(3, 8)).verdict == "within_noise"
    exact = GateSettings(z=z_for(exact=True))
    assert case_verdict("c", a, b, CaseCounts(3, 8), exact).verdict == "inconclusive"


# -- (2) undefined stays undefined ---------------------------------------------------------------


def test_identical_runs_have_exact_zero_sds_and_an_undefined_ratio():
    y = np.repeat(groq_8b()[:, :1], 10, axis=1)  # 107/150 on every run
    assert np.std(y.mean(axis=0), ddof=1) > 0  # numpy's float residue, the bug's cause
    f = floors.rerun_floor(y, resamples=200, permutations=0)
    assert f.marginal_sd == 0.0 and f.paired_sd == 0.0 and f.unit_paired_sd == 0.0
    assert f.paired_to_marginal is None and "0/0" in f.undefined["paired_to_marginal"]
    assert "paired_to_marginal" not in f.ci and f.resampled["paired_to_marginal"].undefined == 1.0
    # no instance flipped in 150 x 10: the SDs' upper ends are exact bounds, not 0
    m = 1 - 0.025 ** (1 / 1500)
    assert f.bound.rate_upper == pytest.approx(m, rel=1e-9) and f.methods["paired_sd"] == "exact_bound"
    assert f.ci["paired_sd"] == (0.0, pytest.approx(math.sqrt(2 * m * (1 - m) / 150), rel=1e-9))
    (a,) = audit_mod.audit([Row(f"i{i}", "e", r, int(y[i, r]), endpoint="e") for i in range(150) for r in range(10)],
                           curve_resamples=20, resamples=50)
    text = "\n".join(floors_report.text_lines([a]))
    assert "undefined (0/0" in text and "no task varied in 150 x 10 outcomes" in text


def test_groq_8b_ratio_interval_uses_only_defined_resamples():
    """The one flip is left out of a resample with probability (149/150)^150 = 0.3666: then the
    ratio is 0/0 and is left out (counted), not read as 0; every other resample gives 0.948."""
    f = floors.rerun_floor(groq_8b(), resamples=2000, permutations=0)
    lo, hi = f.ci["paired_to_marginal"]
    assert lo == pytest.approx(f.paired_to_marginal, abs=1e-12) and hi == pytest.approx(f.paired_to_marginal, abs=1e-12)
    assert round(lo, 3) == round(hi, 3) == 0.948
    assert f.resampled["paired_to_marginal"].undefined == pytest.approx((149 / 150) ** 150, abs=0.035)


def test_infinite_multiples_stay_in_and_open_the_interval():
    """Perturbation / rerun multiples for Groq 8B's reruns: resamples without the flip have rerun
    SD exactly 0 and a positive perturbation SD, an infinite multiple, kept: the interval is open."""
    y = groq_8b()
    rng = np.random.default_rng(0)
    variants = {}
    for name in ("compact_user_request", "tool_instruction_prefix", "request_label_wrap"):
        flip = rng.random(150) < 0.1
        variants[name] = np.repeat(np.where(flip[:, None], 1 - y[:, :1], y[:, :1]), 10, axis=1)
    p = floors.perturbation_floor(variants, y, resamples=2000)
    for k in ("multiple_as_published", "multiple_unit_scale"):
        lo, hi = p.ci[k]
        assert math.isfinite(lo) and hi == math.inf
        assert p.resampled[k].infinite == pytest.approx((149 / 150) ** 150, abs=0.035)
    assert fmt_ci(p.ci["multiple_as_published"], ".1f").endswith(", inf)")
    doc = json.loads(json.dumps(plain(p), allow_nan=False))  # strict JSON: no bare Infinity
    assert doc["ci"]["multiple_as_published"][1] == "Infinity" and float("Infinity") == math.inf


def test_percentile_is_exact_at_infinite_draws_and_numpy_elsewhere():
    x = np.random.default_rng(1).random(999)
    assert percentile(x) == tuple(np.percentile(x, [2.5, 97.5]))
    with_inf = np.concatenate([x, np.full(400, np.inf)])
    lo, hi = percentile(with_inf)
    xs = np.sort(with_inf)
    pos = 0.025 * (xs.size - 1)  # numpy's linear rule, which gives NaN once inf - inf enters
    i = int(pos)
    assert hi == math.inf and lo == pytest.approx(xs[i] + (pos - i) * (xs[i + 1] - xs[i]), abs=1e-12)
    assert percentile(np.array([1.0, 2.0, np.inf])) == (pytest.approx(1.05, abs=1e-12), math.inf)
    assert ci_json((0.5, math.inf)) == [0.5, "Infinity"] and ci_json((-math.inf, 0.0)) == ["-Infinity", 0.0]
    with pytest.raises(Exception, match="NaN"):
        percentile(np.array([1.0, np.nan]))


def test_bootstrap_engine_draws_do_not_depend_on_block_size():
    a = np.concatenate(list(index_blocks(37, 5000, 7)))
    b = np.concatenate(list(index_blocks(37, 5000, 7, cells_per_resample=37 * 20 * 3000)))  # tiny blocks
    assert a.shape == b.shape == (5000, 37) and (a == b).all()
    col = np.random.default_rng(0).random(37)
    d = task_bootstrap({"x": col}, 5000, seed=7)
    assert np.allclose(d.values["x"], col[a].mean(axis=1), atol=1e-12)


# -- (1) the w interval where few tasks vary -----------------------------------------------------


def test_flip_bound_closed_forms():
    b = flip_bound(np.zeros((37, 7)))
    assert b.varying == 0 and b.minority == 0 and b.rate_upper == pytest.approx(1 - 0.025 ** (1 / 259), rel=1e-12)
    assert clopper_pearson_upper(3, 100, 0.975) == pytest.approx(0.0852, abs=1e-4)  # the tabled exact value
    y = np.zeros((10, 5))
    y[0, :3] = 1  # 3 of 5: minority 2
    y[1, 4] = 1  # minority 1
    b = flip_bound(y)
    assert (b.varying, b.minority) == (2, 3)
    wi = w_interval(y, (0.0, 0.01))
    assert wi.method == "task_bootstrap+exact_bound" and wi.ci == (0.0, pytest.approx(b.variance_upper))
    assert "only 2 of 10 tasks varied" in wi.note
    many = (np.random.default_rng(2).random((40, 6)) < 0.5).astype(float)
    assert w_interval(many, (0.1, 0.3)).method == "task_bootstrap"  # enough variation: the bootstrap alone


def _study(n: int, r: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """5% of tasks pass with p = 0.05, the rest always pass (70%) or always fail."""
    p = np.where(rng.random(n) < 0.05, 0.05, (rng.random(n) < 0.7).astype(float))
    return (rng.random((n, r)) < p[:, None]).astype(float), float((p * (1 - p)).mean())


@pytest.mark.parametrize("n,r", [(10, 5), (37, 7), (150, 10)])
def test_w_interval_covers_near_deterministic_truth(n, r):
    """Where the task bootstrap covered 16-76% (issue 26), the interval covers the population w
    (0.05 x 0.0475) and each study's own tasks' w; bench/coverage.py runs the full study."""
    rng = np.random.default_rng(n * r)
    truth = 0.05 * 0.05 * 0.95
    hit_pop = hit_fixed = boot_pop = 0
    studies = 150
    for i in range(studies):
        y, fixed = _study(n, r, rng)
        s2 = np.where(y.min(1) == y.max(1), 0.0, y.var(axis=1, ddof=1))
        boot = task_bootstrap({"w": s2}, 1000, seed=i).ci("w")
        wi = w_interval(y, boot)
        hit_pop += wi.ci.low <= truth <= wi.ci.high
        hit_fixed += wi.ci.low <= fixed <= wi.ci.high
        boot_pop += boot.low <= truth <= boot.high
    assert hit_pop / studies >= 0.93 and hit_fixed / studies >= 0.93
    assert boot_pop / studies < 0.9 and boot_pop < hit_pop  # the bootstrap alone fails here: the test can tell


def test_analysis_json_and_text_say_how_each_w_interval_was_made():
    rng = np.random.default_rng(4)
    live = (rng.random((30, 6)) < 0.5).astype(int)
    rows = [Row(f"t{i}", "live", r, int(live[i, r])) for i in range(30) for r in range(6)]
    rows += [Row(f"t{i}", "replay", r, int(live[i, 0])) for i in range(30) for r in range(6)]
    a = analyze(build(rows), Settings(resamples=500))
    doc = json.loads(json.dumps(a.to_json(), allow_nan=False))
    rep, lv = doc["conditions"]["replay"], doc["conditions"]["live"]
    assert lv["w_ci_method"] == "task_bootstrap" and rep["w_ci_method"] == "exact_bound"
    assert rep["w_bootstrap_ci"] == [0.0, 0.0] and rep["w_ci"][1] == pytest.approx(rep["w_exact_upper"])
    assert rep["w_exact_upper"] > 0
    assert rep["budget_ci"][1] >= rep["budget_ci"][0]
    (c,) = doc["contrasts"]
    assert c["ci_method"] == "task_bootstrap+condition_bounds" and c["ci"][0] <= c["bootstrap_ci"][0]
    text = table(a)
    assert "* replay: no task varied in 30 x 6 outcomes: w <= " in text and "at 95%" in text


# -- (4) what the ratio detects, and a diagnostic that detects dependence -------------------------


def test_ratio_closed_form_is_a_trend_statistic():
    y = (np.random.default_rng(3).random((80, 7)) < 0.6).astype(float)
    f = floors.rerun_floor(y, resamples=50, permutations=0)
    s = y.mean(axis=0)
    d = np.array([s[a] - s[b] for a, b in combinations(range(7), 2)])
    pairs = d.size
    sd = np.std(s, ddof=1)
    closed = pairs / (pairs - 1) - pairs * d.mean() ** 2 / (2 * (pairs - 1) * sd**2)
    assert f.paired_to_marginal**2 == pytest.approx(closed, rel=1e-12)


def _runs(kind: str, rng: np.random.Generator, n: int = 150, r: int = 10) -> np.ndarray:
    if kind == "independent":  # every cell its own coin: no instance effect, no trend
        return (rng.random((n, r)) < 0.7).astype(float)
    if kind == "exchangeable":  # an instance effect shared by all runs: strongly dependent, no order
        u = rng.normal(size=n)[:, None] * 2.5
        return (u + rng.normal(size=(n, r)) > -0.8).astype(float)
    p = 0.45 + 0.03 * np.arange(r)  # independent cells, accuracy drifting up across runs
    return (rng.random((n, r)) < p).astype(float)


def test_dependence_diagnostic_tells_the_three_kinds_of_runs_apart():
    rng = np.random.default_rng(12)
    seen = {}
    for kind in ("independent", "exchangeable", "drift"):
        out = []
        for i in range(4):
            f = floors.rerun_floor(_runs(kind, rng), resamples=200, seed=i, permutations=400)
            out.append((f.dependence.dependent, f.dependence.mean_correlation, f.paired_to_marginal))
        seen[kind] = out
    # independent: no dependence found, ratio about 1
    assert sum(d for d, _, _ in seen["independent"]) <= 1 and all(0.8 < q < 1.25 for _, _, q in seen["independent"])
    # exchangeable but dependent (correlation ~0.5+): always found, and the ratio still about 1
    assert all(d and c > 0.4 for d, c, _ in seen["exchangeable"])
    assert all(0.85 < q < 1.2 for _, _, q in seen["exchangeable"])
    # drift: the ratio falls, the correlation test finds no dependence between reruns
    assert all(q < 0.8 for _, _, q in seen["drift"]) and sum(d for d, _, _ in seen["drift"]) <= 1


# -- (5) leave-one-out by influence -------------------------------------------------------------


def test_contrast_leave_one_out_is_ordered_by_how_much_each_task_moves_it():
    # d = sa - sb: tasks 0 and 1 tie on |d| = 0.2 but d = -0.2 moves a positive contrast more
    sa = np.array([0.0, 0.2, 0.3, 0.3, 0.0, 0.0])
    sb = np.array([0.2, 0.0, 0.0, 0.0, 0.0, 0.0])
    loo = _contrast_loo(tuple(f"t{i}" for i in range(6)), sa, sb, top=5)
    d = sa - sb
    est = d.mean()
    shifts = [abs(e - est) for _, e in loo]
    assert shifts == sorted(shifts, reverse=True)
    assert [t for t, _ in loo][:1] == ["t0"]  # |d - dbar| = 0.3167, the largest
    assert loo[0][1] == pytest.approx((d.sum() - d[0]) / 5)


def test_one_missing_row_drops_the_same_instance_from_floors_and_ladder():
    rng = np.random.default_rng(4)
    y = (rng.random((20, 4)) < 0.6).astype(int)
    rows = [Row(f"i{i}", "e1", r, int(y[i, r]), endpoint="e1", variant=v)
            for v in ("", "call_only_suffix") for i in range(20) for r in range(4)]
    rows = [r for r in rows if not (r.task_id == "i3" and r.variant == "" and r.replicate == 2)]
    audits = audit_mod.audit(rows, curve_resamples=20, resamples=50)
    assert audits[0].excluded == (("i3", "missing in main run 2"),)
    data = build(audit_mod.main_arm(rows, audits))
    cond = data.conditions["e1"]
    assert "i3" not in data.tasks and len(data.tasks) == 19 and cond.outcomes.shape == (19, 4)  # not trimmed to 3
    assert cond.trimmed_from is None
    assert "i3: missing in main run 2" in audit_checks.excluded_messages(audits)[0]


def test_judge_with_no_disagreement_gets_an_exact_interval():
    from noisefloor.analyzer.intervals import clopper_pearson

    rows = [Row(f"t{i}", "judge", r, 1, reference=1) for i in range(40) for r in range(3)]
    j = analyze(build(rows), Settings(resamples=200)).judge["judge"]
    assert j.disagreements == 0 and j.disagreement_ci_method == "clopper_pearson"
    assert j.disagreement_ci == clopper_pearson(0, 40) and j.disagreement_ci[1] == pytest.approx(1 - 0.025 ** (1 / 40))
