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
from noisefloor.analyzer.floors.dependence import dependence
from noisefloor.analyzer.floors.registry import number, plain
from noisefloor.analyzer.gate import Z_ONE_SIDED_95, CaseCounts, GateSettings, case_verdict, wilson_lower, z_for
from noisefloor.analyzer.intervals import (
    ci_json,
    clopper_pearson_upper,
    flip_bound,
    fmt_ci,
    percentile,
    variance_per_varying,
)
from noisefloor.analyzer.ladder import w_interval
from noisefloor.analyzer.outcomes import Row, build
from noisefloor.analyzer.report import table
from noisefloor.analyzer.simulate import reruns


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


def test_groq_8b_ratio_interval_is_undefined_when_most_resamples_are():
    """The one flip is left out of a resample with probability (149/150)^150 = 0.3666: then the
    ratio is 0/0 and is left out (counted), not read as 0; every other resample gives 0.948, a
    point that would read as certainty: with over 10% undefined there is no interval, and the
    report says why."""
    f = floors.rerun_floor(groq_8b(), resamples=2000, permutations=0)
    assert round(f.paired_to_marginal, 3) == 0.948 and "paired_to_marginal" not in f.ci
    assert f.resampled["paired_to_marginal"].undefined == pytest.approx((149 / 150) ** 150, abs=0.035)
    text = number(f.paired_to_marginal, f.ci.get("paired_to_marginal"), ".3f",
                  res=f.resampled["paired_to_marginal"])
    assert text.startswith("0.948 (interval undefined: 3") and "[" not in text
    # under 10% undefined the interval stays: with 3 flipping instances a resample draws none of
    # them with probability (147/150)^150 = 0.048
    y = groq_8b()
    y[[3, 4], 2] = 1 - y[[3, 4], 2]
    g = floors.rerun_floor(y, resamples=2000, permutations=0)
    assert g.resampled["paired_to_marginal"].undefined < 0.10 and g.ci["paired_to_marginal"].covers(g.paired_to_marginal)


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
    assert np.allclose(d.values["x"], np.sort(col)[a].mean(axis=1), atol=1e-12)  # the tasks in their values' order
    shuffled = task_bootstrap({"x": col[np.random.default_rng(1).permutation(37)]}, 5000, seed=7)
    assert (shuffled.values["x"] == d.values["x"]).all()  # task order and names change nothing


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
    # the population bound: 2 of 10 tasks varied, share <= the exact upper end, times 1 / (4 (1 - 2^-4)) at R = 5
    share = clopper_pearson_upper(2, 10, 0.975)
    assert b.share_upper == share and b.population_variance_upper == pytest.approx(share / 3.75, rel=1e-12)
    assert b.population_variance_upper > b.variance_upper
    assert wi.method == "task_bootstrap+exact_bound" and wi.ci == (0.0, pytest.approx(b.population_variance_upper))
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


def _rare_flippers(n: int, r: int, share: float, p: float, rng: np.random.Generator) -> np.ndarray:
    """A share of tasks flip at p, the rest always pass (70%) or always fail."""
    probs = np.where(rng.random(n) < share, p, (rng.random(n) < 0.7).astype(float))
    return (rng.random((n, r)) < probs[:, None]).astype(float)


@pytest.mark.parametrize("share,p", [(0.05, 0.5), (0.05, 0.3)])
def test_w_interval_covers_the_population_when_the_draw_may_hold_no_flipper(share, p):
    """37 x 20 with rare tasks that flip often: 15-50% of studies draw no flipper at all, and the
    cell bound (all 740 outcomes constant) then sits under the population's w; the share bound
    does not (bench/coverage.py runs these regimes at 1,000 studies)."""
    rng = np.random.default_rng(round(share * 1000 + p * 10))
    truth, studies = share * p * (1 - p), 200
    hit = cell_only = none_drawn = 0
    for i in range(studies):
        y = _rare_flippers(37, 20, share, p, rng)
        s2 = np.where(y.min(1) == y.max(1), 0.0, y.var(axis=1, ddof=1))
        wi = w_interval(y, task_bootstrap({"w": s2}, 500, seed=i).ci("w"))
        hit += wi.ci.low <= truth <= wi.ci.high
        none_drawn += wi.bound.varying == 0
        cell_only += wi.ci.low <= truth <= max(wi.bootstrap.high, wi.bound.variance_upper)
    assert hit / studies >= 0.93
    assert none_drawn > 0.1 * studies and cell_only < hit  # without the share bound these studies miss


def test_population_bound_factor_is_the_largest_variance_per_chance_of_varying():
    p = np.linspace(1e-4, 1 - 1e-4, 9999)
    for r in (2, 3, 5, 10, 20, 100):
        ratio = p * (1 - p) / (1 - p**r - (1 - p) ** r)
        assert ratio.max() <= variance_per_varying(r) * (1 + 1e-9)
        assert ratio.max() == pytest.approx(variance_per_varying(r), rel=1e-6)


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


def _called_dependent(kind: str, studies: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    return float(np.mean([dependence(reruns(kind, rng), permutations=199, seed=i).dependent for i in range(studies)]))


@pytest.mark.parametrize("kind", ["heterogeneous", "instance_effect", "homogeneous"])
def test_dependence_false_alarms_at_most_six_percent_for_independent_reruns(kind):
    """150 x 10, 200 studies: reruns independent given the instance, however much instances
    differ, are called dependent at about the test's level (at most 9/200 for 199 shuffles)."""
    assert _called_dependent(kind, 200, 5) <= 0.06


@pytest.mark.parametrize("kind", ["run_effect", "duplicated", "sticky", "drift"])
def test_dependence_power_at_least_eighty_percent_for_run_level_dependence(kind):
    assert _called_dependent(kind, 60, 6) >= 0.8


def test_dependence_null_keeps_each_instances_pass_rate_and_the_ratio_still_sees_only_a_trend():
    rng = np.random.default_rng(12)
    y = reruns("instance_effect", rng)
    d = dependence(y, permutations=50)
    assert not d.dependent and d.mean_correlation > 0.4  # instances differ a lot; runs are independent
    assert [c.name for c in d.checks] == ["run_spread", "closest_pair", "adjacent_agreement"]
    assert all(c.null.low <= c.null_mean <= c.null.high and 0 < c.p_value <= 1 for c in d.checks)
    assert floors.rerun_floor(reruns("drift", rng), resamples=50, permutations=0).paired_to_marginal < 0.8
    # a matrix whose instances never vary has no order to test
    const = np.repeat(rng.integers(0, 2, size=(40, 1)), 5, axis=1).astype(float)
    assert dependence(const).dependent is None


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


# -- (6) undefined stays undefined ----------------------------------------------------------------


def test_one_task_gives_no_interval_over_tasks():
    """A task bootstrap of one task is a point ([0.3, 0.3] for w, [11774, 11774] for the budget):
    no interval, said in the table, null in JSON; the point estimates stay."""
    rows = [Row("t0", "live", r, int(r % 3 == 0)) for r in range(10)] + [Row("t0", "replay", r, 1) for r in range(10)]
    a = analyze(build(rows), Settings(resamples=200))
    live = a.condition("live")
    assert live.stats.w > 0 and live.w_ci is None and live.score_ci is None and live.budget_ci is None
    (c,) = a.contrasts
    assert c.estimate == live.stats.w and c.ci is None
    doc = json.loads(json.dumps(a.to_json(), allow_nan=False))
    assert doc["conditions"]["live"]["w_ci"] is None and doc["conditions"]["live"]["budget_ci"] is None
    assert doc["contrasts"][0]["ci"] is None and doc["contrasts"][0]["ci_method"] == "undefined"
    text = table(a)
    assert "0.26667 [no interval: one task]" in text and "[0.26667, 0.26667]" not in text
    (k1,) = floors.pass_k.pass_k(np.array([[1.0, 0.0, 1.0]]), ks=(1,))
    assert k1.estimate == pytest.approx(2 / 3) and k1.ci is None


def test_a_trimmed_condition_is_marked_where_its_numbers_are():
    rows = [Row(f"t{i}", "live", r, (i + r) % 2) for i in range(12) for r in range(5 if i else 8)]
    a = analyze(build(rows), Settings(resamples=200))
    assert a.condition("live").trimmed_from == (5, 8)
    text = table(a)
    assert "12x5 #" in text and "# live: 12x5 keeps the first 5 replicates of each task (its tasks had 5 to 8)" in text
