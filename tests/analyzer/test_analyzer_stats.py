"""Ladder statistics against independent numbers: the seed's worked values, the published
per-cell data, closed forms and simulations with known truth."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from noisefloor.analyzer.analysis import Settings, analyze
from noisefloor.analyzer.bootstrap import task_bootstrap
from noisefloor.analyzer.judge import judge_columns
from noisefloor.analyzer.ladder import (
    Planning,
    budget,
    clopper_pearson,
    condition_stats,
    leave_one_out,
    mde,
    task_variances,
)
from noisefloor.analyzer.outcomes import Row, build, load
from noisefloor.analyzer.simulate import ladder_probabilities, simulate
from tests.conftest import SHARED_DATA

SEED_STUDY = SHARED_DATA / "seed-study"
needs_data = pytest.mark.skipif(not SEED_STUDY.is_dir(), reason=f"published seed-study data not found at {SEED_STUDY}")


@pytest.mark.parametrize(
    "w,n,expected",
    [(0.03013, 164, 8), (0.0235, 164, 6), (0.01422, 200, 3), (0.0134, 200, 3), (0.0073, 200, 2), (0.0, 200, 1),
     (0.0, 164, 1)],
)
def test_budget_worked_values(w, n, expected):
    assert budget(w, n) == expected


def test_budget_is_the_smallest_r_that_reaches_delta():
    plan = Planning()
    for w in np.linspace(0.0005, 0.05, 60):
        r = budget(w, 100, plan)
        assert plan.delta >= plan.z * np.sqrt(2 * w / (100 * r)) - 1e-12
        if r > 1:
            assert plan.delta < plan.z * np.sqrt(2 * w / (100 * (r - 1)))
    # vectorized form agrees with scalar
    ws = np.array([0.0, 0.0073, 0.03013])
    assert list(budget(ws, 200)) == [budget(float(x), 200) for x in ws]


def test_clopper_pearson_worked_values():
    lo, hi = clopper_pearson(34, 164)
    assert (round(lo, 3), round(hi, 3)) == (0.148, 0.277)
    lo, hi = clopper_pearson(1, 200)
    assert (round(lo, 4), round(hi, 4)) == (0.0001, 0.0275)
    assert clopper_pearson(0, 164)[0] == 0.0 and round(clopper_pearson(0, 164)[1], 3) == 0.022
    assert clopper_pearson(5, 5)[1] == 1.0


def test_within_variance_closed_form():
    # task 0 always passes (0), task 1 passes half of 4 (var 1/3), task 2 one of 4 (var 0.25)
    y = np.array([[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 1, 0]])
    s = condition_stats(y)
    assert s.w == pytest.approx((0 + 1 / 3 + 0.25) / 3)
    assert s.variable_tasks == 2 and s.score == pytest.approx(7 / 12)
    assert s.mde == pytest.approx(Planning().z * np.sqrt(2 * s.w / (3 * 4)))
    assert mde(0.0, 10, 5) == 0.0


def _published(name: str) -> list[dict[str, str]]:
    with (SEED_STUDY / name).open() as fh:
        return [r for r in csv.DictReader(fh) if r["R"] == "20"]


@needs_data
@pytest.mark.parametrize(
    "cells,published,n",
    [
        ("humanevalplus_N50_R20.csv", "published_humanevalplus_confirmatory_decomposition.csv", "50"),
        ("mbppplus_N50_R20.csv", "published_mbppplus_confirmatory_decomposition.csv", "50"),
        ("mbppplus_N200_R20.csv", "published_mbppplus_confirmatory_decomposition.csv", "200"),
    ],
)
def test_reproduces_published_within_mean_and_mde(cells, published, n):
    data = load(SEED_STUDY / cells)
    expected = [r for r in _published(published) if r["N"] == n]
    assert len(expected) == 3
    for row in expected:
        s = condition_stats(data.conditions[row["rung"]].outcomes)
        assert (s.tasks, s.replicates) == (int(n), 20)
        decimals = len(row["within"].split(".")[1])
        assert round(s.w, decimals) == pytest.approx(float(row["within"]), abs=1e-12), row
        assert round(s.score, len(row["mean"].split(".")[1])) == pytest.approx(float(row["mean"]), abs=1e-12), row
        assert round(s.mde, 4) == pytest.approx(float(row["mde_at_cell"]), abs=1e-12), row


@needs_data
def test_replay_residual_sits_in_one_task_and_leave_one_out_matches_recompute():
    data = load(SEED_STUDY / "mbppplus_N200_R20.csv")
    a = analyze(data, Settings(resamples=2000, seed=1))
    l2 = a.condition("L2")
    assert l2.carriers[0].task == "Mbpp/271" and l2.carriers[0].share == 1.0 and l2.carriers[0].w_without == 0.0
    contrast = next(c for c in a.contrasts if (c.a, c.b) == ("L0", "L2"))
    loo = dict(contrast.leave_one_out)
    keep = [i for i, t in enumerate(data.tasks) if t != "Mbpp/271"]
    direct = task_variances(data.conditions["L0"].outcomes[keep]).mean() - task_variances(
        data.conditions["L2"].outcomes[keep]
    ).mean()
    assert loo["Mbpp/271"] == pytest.approx(direct, abs=1e-15)


def test_bootstrap_is_joint_seeded_and_degenerate_where_it_should_be():
    rng = np.random.default_rng(3)
    col = rng.random(50)
    d1 = task_bootstrap({"a": col, "b": col, "z": np.zeros(50)}, 3000, seed=11)
    d2 = task_bootstrap({"a": col, "b": col, "z": np.zeros(50)}, 3000, seed=11)
    d3 = task_bootstrap({"a": col}, 3000, seed=12)
    assert np.array_equal(d1.values["a"], d2.values["a"])  # same seed, same numbers
    assert np.array_equal(d1.values["a"], d1.values["b"])  # joint: one draw of tasks for all columns
    assert not np.array_equal(d1.values["a"], d3.values["a"])
    assert d1.ci("z") == (0.0, 0.0)
    # the bootstrap mean's spread matches the closed form sd/sqrt(N) of a task mean
    assert d1.values["a"].std() == pytest.approx(col.std() / np.sqrt(50), rel=0.08)


def test_bootstrap_interval_covers_known_truth_in_simulation():
    """200 simulated ladders with fixed p_i: the 95% interval must cover true w at least 90% of the time."""
    rng = np.random.default_rng(2024)
    p = ladder_probabilities(80, rng)
    hits = {"live": 0, "t0": 0}
    for k in range(200):
        sim = simulate({c: p[c] for c in hits}, replicates=10, seed=k)
        a = analyze(build(sim.rows), Settings(resamples=1000, seed=k))
        for c in hits:
            lo, hi = a.condition(c).w_ci
            hits[c] += lo <= sim.true_w(c) <= hi
    assert hits["live"] >= 180 and hits["t0"] >= 180, hits


def test_judge_disagreement_counts_and_interval():
    # 10 tasks x 4 verdicts; reference alternates
    verdicts = np.array([[1] * 4] * 5 + [[0] * 4] * 3 + [[1, 1, 0, 0]] + [[1, 1, 1, 0]])
    reference = np.array([1, 1, 1, 0, 0, 0, 0, 1, 1, 0])
    cols = judge_columns(verdicts, reference)
    assert cols.false_accept.sum() == 3  # tasks 3, 4 (always 1, ref 0) and 9 (3/4, ref 0)
    assert cols.false_reject.sum() == 1  # task 7
    assert cols.tie.sum() == 1  # task 8 counts as a disagreement
    assert cols.disagree.sum() == 5
    rows = [Row(f"t{i}", "judge", r, int(verdicts[i, r]), reference=int(reference[i]), confidence=90.0) for i in range(10) for r in range(4)]
    a = analyze(build(rows), Settings(resamples=2000))
    j = a.judge["judge"]
    assert (j.disagreements, j.false_accepts, j.false_rejects, j.mean_confidence) == (5, 3, 1, 90.0)
    assert j.disagreement_ci[0] < 0.5 < j.disagreement_ci[1]


def test_judge_paper_scale_counts():
    """The paper's judge: 47/200 disagreements (18 false accepts, 29 false rejects), stable verdicts."""
    ref = np.array([1] * 150 + [0] * 50)
    majority = ref.copy()
    majority[:29] = 0  # false rejects
    majority[150:168] = 1  # false accepts
    verdicts = np.repeat(majority[:, None], 20, axis=1)
    rows = [Row(f"Mbpp/{i}", "judge_t0", r, int(verdicts[i, r]), reference=int(ref[i])) for i in range(200) for r in range(20)]
    a = analyze(build(rows), Settings(resamples=4000, seed=5))
    j = a.judge["judge_t0"]
    assert (j.disagreements, j.false_accepts, j.false_rejects) == (47, 18, 29)
    assert j.disagreement == pytest.approx(0.235)
    assert j.disagreement_ci[0] == pytest.approx(0.175, abs=0.012) and j.disagreement_ci[1] == pytest.approx(0.295, abs=0.012)
    cond = a.condition("judge_t0")
    assert cond.stats.w == 0.0 and cond.stats.budget == 1
    # no verdict changed in 200 x 20: the bootstrap's [0, 0] is replaced by the exact bounds:
    # 1 - 0.025^(1/4000) on the flip rate m (these tasks: w <= m (1 - m)) and 1 - 0.025^(1/200) on
    # the share q of tasks that vary (the task population: w <= q / (4 (1 - 2^-19))), the larger
    m = 1 - 0.025 ** (1 / 4000)
    q = 1 - 0.025 ** (1 / 200)
    assert cond.w_interval.bootstrap == (0.0, 0.0) and cond.w_interval.method == "exact_bound"
    assert cond.w_interval.bound.variance_upper == pytest.approx(m * (1 - m), rel=1e-9)
    assert cond.w_ci == (0.0, pytest.approx(q / (4 * (1 - 2.0**-19)), rel=1e-9))
    assert "no task varied in 200 x 20 outcomes: w <= 0.00457 at 95%" in cond.w_interval.note


def test_leave_one_out_closed_form():
    s2 = np.array([0.0, 0.1, 0.3, 0.0])
    out = leave_one_out(("a", "b", "c", "d"), s2, top=3)
    assert [x.task for x in out] == ["c", "b"]
    assert out[0].share == pytest.approx(0.75) and out[0].w_without == pytest.approx(0.1 / 3)


def test_outcome_rows_carry_a_version_keep_unknown_columns_and_refuse_newer_rows(tmp_path):
    import json

    from noisefloor.outcome_rows import (
        ROW_VERSION,
        OutcomeError,
        OutcomeRow,
        new_rows,
        read,
        replicate_label,
        replicate_of,
        write_jsonl,
    )

    old = {"task_id": "t", "condition": "c", "replicate": "3", "outcome": "1", "temperature": "0", "note": "by hand"}
    row = OutcomeRow.from_json(old, "old.jsonl:1")  # no row_version: written before the field, version 1
    assert (row.replicate, row.outcome, row.temperature) == (3, 1, 0.0) and row.extra == (("note", "by hand"),)
    doc = row.to_json()
    assert doc["row_version"] == ROW_VERSION and doc["note"] == "by hand"  # kept, written back, not dropped
    path = tmp_path / "rows.jsonl"
    write_jsonl([row], path)
    assert read(path) == [row] and json.loads(path.read_text()) == doc
    with pytest.raises(OutcomeError, match=r"old.jsonl:1: outcome row version 99 is newer"):
        OutcomeRow.from_json({**old, "row_version": 99}, "old.jsonl:1")
    # the same grade written by two versions is the same grade when stores are combined
    stored = {"task_id": "t", "condition": "c", "replicate": 3, "outcome": 1}  # as a store kept it before the field
    seen: dict = {}
    assert new_rows(seen, [stored], "a") == [stored] and new_rows(seen, [stored | {"row_version": 1}], "b") == []
    with pytest.raises(OutcomeError, match="with different grades"):
        new_rows(seen, [stored | {"outcome": 0}], "c")
    # replicate: an int in rows, a text label on exchanges, converted at that boundary
    assert replicate_label(4) == "4" and replicate_of("4") == 4 and replicate_of(" 7 ") == 7
    assert replicate_of(None) is None and replicate_of("r1") is None
