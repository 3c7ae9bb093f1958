"""The compare design: coupling verdicts and the two contrasts (analyzer.coupling, checked against
closed forms and simulations with known truth), and `nfladder demo --design compare` end to end
(real nfproxy processes, the built-in agent and provider, a real LMDB log) recovering its truth."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from noisefloor.analyzer import coupling
from noisefloor.analyzer.ladder import Planning, budget
from noisefloor.errors import InputError

Z95, Z80 = 1.959963984540054, 0.8416212335729143  # standard-normal quantiles, independent of scipy


# -- coupling verdicts ---------------------------------------------------------------------------


def test_same_requests_all_hits_is_coupled_whatever_their_order():
    v = coupling.pair_verdict(["k1", "k2", "k2"], ["k2", "k1", "k2"], ["hit", "hit", "hit"])
    assert v.coupled and v.step is None and v.unreachable == 0 and v.recorded_steps == 3


def test_a_miss_names_its_step_and_the_recorded_steps_it_cut_off():
    v = coupling.pair_verdict(["k1", "k2", "k3", "k4"], ["k1", "x2", "x3"], ["hit", "miss", "miss"])
    assert not v.coupled and (v.step, v.reason, v.unreachable) == (1, "miss", 3)


def test_an_order_violation_breaks_coupling_even_with_the_same_requests():
    v = coupling.pair_verdict(["k1", "k2"], ["k2", "k1"], ["order_violation", "hit"])
    assert not v.coupled and (v.step, v.reason) == (0, "order_violation")


def test_stopping_early_breaks_coupling_at_the_first_step_not_asked():
    v = coupling.pair_verdict(["k1", "k2", "k3"], ["k1"], ["hit"])
    assert not v.coupled and (v.step, v.reason, v.unreachable) == (1, "fewer requests", 2)


def test_asking_a_recorded_request_more_often_than_recorded_breaks_coupling():
    v = coupling.pair_verdict(["k1", "k2"], ["k1", "k1", "k2"], ["hit", "hit", "hit"])
    assert not v.coupled and (v.step, v.reason, v.unreachable) == (0, "other requests", 0)


def test_a_task_is_coupled_only_when_every_replicate_is():
    ok = coupling.pair_verdict(["a"], ["a"], ["hit"])
    bad = coupling.pair_verdict(["a"], ["b"], ["miss"])
    assert coupling.TaskCoupling("T", (ok, ok)).coupled
    t = coupling.TaskCoupling("T", (ok, bad, bad))
    assert not t.coupled and t.first_broken == (1, bad)
    assert not coupling.TaskCoupling("T", ()).coupled


def test_results_must_match_the_replayed_requests():
    with pytest.raises(InputError):
        coupling.pair_verdict(["a"], ["a", "b"], ["hit"])


# -- the paired contrast ---------------------------------------------------------------------------


def test_paired_contrast_is_the_mean_of_per_task_paired_differences():
    a = np.array([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    b = np.array([[0, 1, 0], [0, 0, 0], [1, 1, 1]])
    p = coupling.paired_contrast(a, b, resamples=500, seed=1)
    assert p.per_task == pytest.approx((-1 / 3, 0.0, 0.0))
    assert p.estimate == pytest.approx(-1 / 9) and p.mean_a == pytest.approx(5 / 9)
    assert p.ci.low <= p.estimate <= p.ci.high and p.ci.high <= 0.0
    assert p.claim == coupling.CONDITIONAL


def test_paired_contrast_with_no_difference_is_exactly_zero():
    a = np.array([[1, 0], [0, 1]])
    p = coupling.paired_contrast(a, a.copy(), resamples=200)
    assert (p.estimate, p.ci.low, p.ci.high) == (0.0, 0.0, 0.0)


def test_paired_contrast_refuses_unpaired_shapes():
    with pytest.raises(InputError):
        coupling.paired_contrast(np.ones((3, 2)), np.ones((3, 3)))


def test_paired_interval_covers_the_population_effect_at_about_95_percent():
    """Tasks drawn from a population where a downstream change breaks 40% of tasks (effect -p_i
    there, 0 elsewhere, p_i ~ U(0, 1)): the population effect is -0.2."""
    rng = np.random.default_rng(7)
    hits, trials = 0, 300
    for t in range(trials):
        p = rng.uniform(0, 1, 40)
        cut = rng.uniform(0, 1, 40) < 0.4
        a = (rng.uniform(0, 1, (40, 5)) < p[:, None]).astype(float)
        b = np.where(cut[:, None], 0.0, a)
        hits += coupling.paired_contrast(a, b, resamples=1000, seed=t).ci.covers(-0.2)
    assert 0.90 <= hits / trials <= 0.99, hits / trials


# -- independent streams (Eq. 2) -------------------------------------------------------------------


def test_independent_se_is_equation_2_and_the_budget_inverts_it():
    a = np.array([[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 1, 1]], dtype=float)
    b = np.array([[0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 0]], dtype=float)
    f = coupling.independent_contrast(a, b)
    wa = (4 / 3 * 0.25 + 0 + 4 / 3 * 0.25) / 3  # sample variances (ddof=1) per task, averaged
    wb = (0 + 4 / 3 * 0.25 + 4 / 3 * 0.1875) / 3
    assert (f.w_a, f.w_b) == (pytest.approx(wa), pytest.approx(wb))
    assert f.se == pytest.approx(math.sqrt((wa + wb) / (3 * 4)))
    assert f.estimate == pytest.approx(b.mean() - a.mean())
    assert f.ci.low == pytest.approx(f.estimate - Z95 * f.se) and f.claim == coupling.FRESH
    need = (wa + wb) * (Z95 + Z80) ** 2 / (3 * 0.02**2)
    assert f.budget == math.ceil(need)
    assert (f.budget - 1) * 3 * 0.02**2 < (wa + wb) * (Z95 + Z80) ** 2 <= f.budget * 3 * 0.02**2


def test_budget_equals_the_ladders_symmetric_budget_when_the_arms_vary_alike():
    a = np.array([[1, 0, 1, 0], [1, 1, 0, 0]], dtype=float)
    f = coupling.independent_contrast(a, a[:, ::-1].copy(), Planning(delta=0.05))
    assert f.budget == budget(f.w_a, 2, Planning(delta=0.05))


def test_independent_interval_covers_the_fixed_task_effect_at_about_95_percent():
    rng = np.random.default_rng(3)
    pa, pb = rng.uniform(0.1, 0.9, 25), rng.uniform(0.1, 0.9, 25)
    truth = float((pb - pa).mean())
    hits, trials = 0, 2000
    for _ in range(trials):
        a = (rng.uniform(0, 1, (25, 8)) < pa[:, None]).astype(float)
        b = (rng.uniform(0, 1, (25, 8)) < pb[:, None]).astype(float)
        hits += coupling.independent_contrast(a, b).ci.covers(truth)
    assert 0.93 <= hits / trials <= 0.97, hits / trials


def test_independent_contrast_needs_two_runs_per_arm():
    with pytest.raises(InputError):
        coupling.independent_contrast(np.ones((2, 1)), np.ones((2, 3)))


# -- the design end to end --------------------------------------------------------------------------


def _tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name(name)
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600, env=dict(os.environ))


@pytest.fixture(scope="module")
def compare_demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "out"
    r = _tool("nfladder", "demo", "--design", "compare", "--out", str(out), "-j", "2", "--bootstrap", "1000")
    return r, out


@pytest.mark.slow
def test_compare_demo_recovers_the_coupled_effect_and_names_the_broken_tasks(compare_demo):
    r, out = compare_demo
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    cmp, truth = doc["compare"], doc["truth"]
    # the prompt changed on exactly the broken tasks; the downstream change left coupling intact
    assert sorted(cmp["broken_tasks"]) == truth["prompt_changed"] and truth["broken_as_changed"]
    assert set(truth["downstream_changed"]) <= set(cmp["coupled_tasks"]) and truth["downstream_changed"]
    lo, hi = cmp["paired"]["ci"]
    assert lo <= truth["paired"]["true_effect"] <= hi and truth["paired"]["true_effect"] < -0.05
    assert cmp["paired"]["estimate"] < 0 and cmp["paired"]["claim"] == coupling.CONDITIONAL
    lo, hi = cmp["fresh"]["ci"]
    assert lo <= truth["fresh"]["true_effect"] <= hi and cmp["fresh"]["claim"] == coupling.FRESH
    for tid in cmp["broken_tasks"]:
        d = cmp["tasks"][tid]["diverged"]
        assert (d["step"], d["reason"], d["path"]) == (0, "miss", "/body/messages/1/content")
        assert d["unreachable"] == d["recorded_steps"] >= 1
        assert f"broken {tid}: run 0 (following baseline-r0-{tid}), step 0 (miss) at /body/messages/1/content" \
            in r.stdout
        assert cmp["tasks"][tid]["runs"][0]["followed"] == f"baseline-r0-{tid}"
    # the candidate's downstream change shows in the paired numbers, not in the recorded responses
    for tid in truth["downstream_changed"]:
        assert all(run["coupled"] for run in cmp["tasks"][tid]["runs"])
    assert "conditional on the recording" in r.stdout and "over fresh generation" in r.stdout
    rows = [json.loads(x) for x in (out / "outcomes.jsonl").read_text().splitlines()]
    fresh_tasks = {x["task_id"] for x in rows if x["condition"] == "candidate_fresh"}
    assert fresh_tasks == set(cmp["broken_tasks"])  # fresh generation only where coupling broke
    alone = _tool("nfanalyze", str(out / "log.lmdb"), "--json", "-", "--bootstrap", "1000", "--allow-drift")
    assert alone.returncode == 0, alone.stderr[-2000:]
    assert json.loads(alone.stdout)["compare"] == cmp  # the log alone keeps the compare report
    text = _tool("nfanalyze", str(out / "log.lmdb"), "--bootstrap", "1000", "--allow-drift")
    assert text.returncode == 0 and f"{len(cmp['coupled_tasks'])} tasks coupled" in text.stdout
    assert f"coupled, paired B - A = {cmp['paired']['estimate']}" in text.stdout


@pytest.mark.slow
def test_compare_rerun_resumes_without_running_an_agent_again(compare_demo):
    _, out = compare_demo
    before = (out / "attempts.jsonl").read_text()
    r = _tool("nfladder", "demo", "--design", "compare", "--out", str(out), "-j", "2", "--bootstrap", "1000")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "attempts.jsonl").read_text() == before
    assert "all 80 runs done earlier" in r.stderr


def test_compare_refuses_a_stamped_candidate_override_and_a_clashing_baseline_name():
    from noisefloor.ladder import designs
    from noisefloor.ladder.conditions import ConditionError, Override

    with pytest.raises(ConditionError, match="/temperature"):
        designs.compare(candidate_overrides=[Override("/temperature", 0)])
    with pytest.raises(ConditionError, match="baseline"):
        designs.compare(baseline="candidate")


def test_a_replayed_candidates_own_overrides_change_its_requests():
    """The candidate replays the baseline's recording with its own (unstamped) overrides applied."""
    from noisefloor.ladder import designs
    from noisefloor.ladder.conditions import Override

    d = designs.compare(candidate_overrides=[Override("/max_tokens", 64)])
    args = d.conditions.proxy_args(d.conditions["candidate"], "http://127.0.0.1:1")
    assert "--strict" in args and ["--set", "/max_tokens=64"] == args[args.index("--set"):args.index("--set") + 2]
    assert "--set" not in d.conditions.proxy_args(d.conditions["baseline"], "http://127.0.0.1:1")
