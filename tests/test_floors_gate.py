"""Rerun / perturbation floors and the regression gate, against simulations with known truth,
closed forms and the article's worked numbers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from noisefloor.analyzer import floors
from noisefloor.analyzer.audit import audit, study_hash
from noisefloor.analyzer.gate import CaseCounts, case_verdict, repeats_to_decide, wilson_lower, wilson_upper
from noisefloor.analyzer.outcomes import Row


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
        f = floors.rerun_floor(simulate_reruns(n, runs, share, p, rng))
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


def test_perturbation_paired_sd_matches_its_closed_form():
    rng = np.random.default_rng(5)
    n, runs, e = 2000, 5, 0.1
    base = (rng.random(n) < 0.8).astype(float)
    variants = {}
    for name in ("compact_user_request", "tool_instruction_prefix", "request_label_wrap"):
        flip = rng.random(n) < e  # the variant changes these instances, the same way on every run
        variants[name] = np.repeat(np.where(flip, 1 - base, base)[:, None], runs, axis=1)
    pf = floors.perturbation_floor(variants, rerun_paired=0.002)
    expected = math.sqrt(2 * e * (1 - e))  # y_L - y_R is +-1 with probability 2e(1-e)
    for pair in pf.pairs:
        assert pair.matched == n * runs
        assert pair.paired_sd == pytest.approx(expected, abs=0.02)
    assert pf.multiple_of_rerun == pytest.approx(pf.median_paired_sd / 0.002)


def test_sd_curve_narrows_with_more_instances():
    rng = np.random.default_rng(2)
    y = simulate_reruns(150, 10, 0.05, 0.3, rng)
    curve = floors.sd_curve(y, floors.curve_sizes(150), resamples=200, seed=3)
    assert [p.n for p in curve] == [25, 50, 75, 100, 125, 150]
    width = [p.ci[1] - p.ci[0] for p in curve]
    assert width[0] > width[-1]
    assert curve[-1].mean == pytest.approx(floors.rerun_paired_sd(y), rel=0.5)


def test_fingerprint_split_and_taxonomy():
    y = np.array([[1, 0, 1, 0], [1, 1, 1, 1]], dtype=float)
    fp = np.array([["a", "b", "a", "b"], ["a", "b", "a", "b"]], dtype=object)
    s = floors.fingerprint_split(y, fp)
    assert s.fingerprints == 2 and s.within_pairs == 4 and s.across_pairs == 8
    assert s.within_sd == 0.0 and s.across_sd > 0
    t = floors.taxonomy(["correct", "malformed_output", "wrong_arguments", "malformed_output", None])
    assert t.failures == 3 and t.malformed_share == pytest.approx(2 / 3)


def rows_for(endpoint: str, y: np.ndarray, variant: str = "", model: str = "m1") -> list[Row]:
    return [Row(f"i{i}", endpoint, r, int(y[i, r]), failure="correct" if y[i, r] else "wrong_arguments",
                extra={"endpoint": endpoint, "variant": variant, "model": model, "fingerprint": "fp1"})
            for i in range(y.shape[0]) for r in range(y.shape[1])]


def test_matched_design_drops_unrecoverable_instances_everywhere_and_flags_drift():
    rng = np.random.default_rng(4)
    y = simulate_reruns(20, 4, 0.2, 0.3, rng)
    rows = rows_for("e1", y) + rows_for("e1", y, "call_only_suffix") + rows_for("e1", y, "compact_user_request")
    rows = [r for r in rows if not (r.task_id == "i3" and r.extra["variant"] == "call_only_suffix" and r.replicate == 2)]
    rows.append(Row("i0", "e1", 0, 1, extra={"endpoint": "e1", "model": "m2"}))
    (a,) = audit(rows, curve_resamples=50)
    assert a.excluded == (("i3", "missing in call_only_suffix run 2"),)
    assert a.instances == 19 and a.study_set == study_hash([f"i{i}" for i in range(20) if i != 3])
    assert a.drift and a.models == ("m1", "m2")
    assert a.perturbation is not None and len(a.perturbation.pairs) == 1


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
                                        "outcome": r.outcome, "failure": r.failure, **r.extra}) + "\n" for r in rows))
    r = nfanalyze("--outcomes", str(path), "--json", "-", "--bootstrap", "200")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    f = doc["floors"]["groq-8b"]
    assert f["rerun"]["runs"] == 5 and f["instances"] == 60 and f["drift"] is False
    assert f["perturbation"]["pairs"][0]["paired_sd"] == pytest.approx(np.std((y - (1 - y)).ravel(), ddof=1))
    assert doc["conditions"]["groq-8b"]["replicates"] == 5  # the ladder section uses the main arm only
    wrong = nfanalyze("--outcomes", str(path), "--study-set", "0" * 64)
    assert wrong.returncode != 0 and "study set changed" in wrong.stderr
    drifted = tmp_path / "drift.jsonl"
    drifted.write_text(path.read_text() + json.dumps({"task_id": "i0", "condition": "groq-8b", "replicate": 9,
                                                       "outcome": 1, "endpoint": "groq-8b", "model": "other"}) + "\n")
    d = nfanalyze("--outcomes", str(drifted), "--abort-on-drift", "--bootstrap", "200")
    assert d.returncode == 4 and "changed served model" in d.stderr


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
    n = 8 + v.more_repeats
    assert wilson_upper(round(3 / 8 * n), n) < v.floor <= wilson_upper(round(3 / 8 * (n - 1)), n - 1)
    assert case_verdict("c", a, b, CaseCounts(0, 8)).verdict == "regressed"
    assert case_verdict("c", CaseCounts(8, 8), CaseCounts(4, 8), CaseCounts(8, 8)).verdict == "quarantine"
    assert repeats_to_decide(CaseCounts(5, 8), 0.3) is None


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
    assert "y: inconclusive" in r.stdout and "more repeats would decide it" in r.stdout
    doc = json.loads((tmp_path / "g.json").read_text())
    assert doc["counts"] == {"within_noise": 2, "inconclusive": 1, "regressed": 0, "quarantine": 0}
    bad = write_run(tmp_path / "bad.jsonl", {"x": 0, "y": 8, "z": 7})
    assert nfanalyze("gate", str(a), str(b), str(bad)).returncode == 1
    hot = write_run(tmp_path / "hot.jsonl", {"x": 6, "y": 8, "z": 7}, temperature=1.0)
    r = nfanalyze("gate", str(a), str(b), str(hot))
    assert r.returncode == 2 and "different stamps" in r.stderr
