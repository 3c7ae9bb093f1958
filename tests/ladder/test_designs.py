"""nfladder's designs end to end on the built-in provider (real nfproxy processes, real agents,
real LMDB logs): judge, audit and gate each run once at small size (module-scoped), their known
truth checked, and `nfanalyze LOG --json` must give the report's numbers from the log alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from noisefloor import exit_codes
from noisefloor.ladder import designs
from noisefloor.ladder.conditions import Condition, ConditionError, Override, Registry
from noisefloor.ladder.judge_study import parse_verdict
from noisefloor.ladder.pipeline import drift
from tests import report_walk
from tests.conftest import ROOT, SHARED_DATA, wait_until

BOOT = "1000"


def tool(name: str, *args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name(name)
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def alone(out: Path) -> dict:
    r = tool("nfanalyze", str(out / "log.lmdb"), "--json", "-", "--bootstrap", BOOT, "--seed", "0", "--allow-drift")
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def ladder_demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("ladder") / "out"
    r = tool("nfladder", "demo", "--design", "ladder", "--out", str(out), "-j", "2", "--bootstrap", BOOT)
    return r, out


@pytest.fixture(scope="module")
def judge_demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("judge") / "out"
    r = tool("nfladder", "demo", "--design", "judge", "--out", str(out), "-j", "2", "--bootstrap", BOOT,
             "--judge-repeats", "10")
    return r, out


@pytest.fixture(scope="module")
def gate_demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("gate") / "out"
    r = tool("nfladder", "demo", "--design", "gate", "--out", str(out), "-j", "2", "--bootstrap", BOOT)
    return r, out


@pytest.fixture(scope="module")
def audit_demo(tmp_path_factory):
    if not (SHARED_DATA / "bfcl").is_dir():
        pytest.skip(f"no BFCL data at {SHARED_DATA}")
    out = tmp_path_factory.mktemp("audit") / "out"
    r = tool("nfladder", "demo", "--design", "audit", "--out", str(out), "-j", "2", "--bootstrap", BOOT,
             "--per-category", "5", "--main-runs", "6", "--perturbed-runs", "3")
    return r, out


def opens_with_its_own_section(r: subprocess.CompletedProcess[str], out: Path, title: str) -> None:
    """A design's printed and written report opens with its own result; the ladder of its conditions follows."""
    assert r.stdout.index("Determinism ladder: ") > 0 and not r.stdout.startswith("Determinism ladder"), r.stdout[:300]
    md = (out / "report.md").read_text()
    assert md.startswith(f"# {title}\n") and md.index("## Determinism ladder of the study's conditions") > len(title)


def test_judge_demo_t0_has_no_verdict_variance_and_the_disagreement_interval_holds_the_truth(judge_demo):
    r, out = judge_demo
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    w = {c: v["w"] for c, v in doc["conditions"].items()}
    assert w["judge-t0"] == 0.0 and w["judge-t0.7"] > 0
    truth = doc["truth"]["judge"]
    for cond in ("judge-t0", "judge-t0.7"):
        assert truth[cond]["covered"], (cond, truth[cond])
    t0 = truth["judge-t0"]
    assert t0["disagreement_set"] and doc["judge"]["judge-t0"]["disagreements"] == len(t0["disagreement_set"])
    assert doc["judge_parse"]["judge-t0.7"]["unparseable"] > 0  # kept and counted, not read as verdicts
    rows = [json.loads(line) for line in (out / "outcomes.jsonl").read_text().splitlines()]
    assert all(r["reference"] in (0, 1) and r["grader_version"] == designs.JUDGE_VERSION for r in rows)
    assert "known truth" in r.stdout and "Provenance" in r.stdout
    opens_with_its_own_section(r, out, "Judge study")
    for cond, j in doc["judge"].items():  # printed as the JSON has it, at the printed precision
        assert f"mean confidence {j['mean_confidence']:.3f}" in r.stdout, (cond, j)
    again = alone(out)
    assert again["judge"] == doc["judge"] and again["conditions"] == doc["conditions"]
    assert again["provenance"] == doc["provenance"] and again["judge_parse"] == doc["judge_parse"]


def test_gate_demo_reruns_inconclusive_cases_to_16_and_exits_1_on_the_known_regressions(gate_demo):
    r, out = gate_demo
    assert r.returncode == exit_codes.REGRESSED, r.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    gate = doc["gate"]
    assert gate["refused"] is None and gate["escalated"], "no case was re-run to k=16"
    by_case = {v["case_id"]: v for v in gate["verdicts"]}
    for case in gate["escalated"]:
        assert by_case[case]["candidate"]["n"] == 16 and by_case[case]["base_a"]["n"] == 8
    truth = doc["truth"]
    assert truth["caught"] and not truth["false_blocks"]
    assert "true base -> candidate" in r.stdout
    opens_with_its_own_section(r, out, "Regression gate")
    again = alone(out)
    assert again["gate"] == gate
    # the collections are stamped alike: nfanalyze gate compares them as they are (exit 1: regressed)
    g = tool("nfanalyze", "gate", *(str(out / "gate" / f"{n}.jsonl") for n in ("base_a", "base_b", "candidate")))
    assert g.returncode == exit_codes.REGRESSED, g.stderr


def test_audit_demo_perturbation_multiple_above_one_as_the_truth_says(audit_demo):
    r, out = audit_demo
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    (floors,) = doc["floors"].values()
    assert floors["rerun"]["runs"] == 6 and len(floors["perturbation"]["pairs"]) == 6
    assert doc["truth"]["multiple_unit_scale"] > 1
    assert floors["perturbation"]["multiple_unit_scale"] > 1
    rows = [json.loads(line) for line in (out / "outcomes.jsonl").read_text().splitlines()]
    assert {r["variant"] for r in rows} == {"main", *designs.PERTURBATIONS}
    assert all(r["temperature"] == 0.0 and r["model"] == "nf-builtin-1" for r in rows)
    opens_with_its_own_section(r, out, "Tool-calling audit")
    for cond, counted in doc["log"]["conditions"].items():  # tool-call answers report their usage too
        assert counted["input_tokens"] > 0 and counted["output_tokens"] > 0, (cond, counted)
        assert f"tokens in/out {counted['input_tokens']}/{counted['output_tokens']}" in r.stdout
    again = alone(out)
    assert again["floors"] == doc["floors"] and again["conditions"] == doc["conditions"]


# the pairs each demo's JSON must hold at least (so the walk cannot pass by finding nothing)
MIN_PAIRS = {"ladder_demo": 18, "judge_demo": 11, "gate_demo": 15, "audit_demo": 30}


@pytest.mark.parametrize("demo", list(MIN_PAIRS))
def test_no_estimate_lies_outside_its_interval_in_any_design_report(demo, request):
    """Every (estimate, interval) pair in the report's JSON, its Markdown and its terminal text
    (tests/report_walk.py says how they are found): the estimate inside, up to printed rounding."""
    r, out = request.getfixturevalue(demo)
    assert r.returncode in (0, exit_codes.REGRESSED), r.stderr[-3000:]
    pairs = list(report_walk.json_pairs(json.loads((out / "report.json").read_text())))
    assert len(pairs) >= MIN_PAIRS[demo], [p.where for p in pairs]
    texts = [(out / "report.md").read_text(), r.stdout]
    printed = [p for t in texts for p in report_walk.text_pairs(t)]
    assert len(printed) >= len(texts)
    assert [p for p in pairs + printed if not p.inside] == []


def test_the_report_walk_finds_an_estimate_outside_its_interval():
    doc = {"floors": {"e": {"perturbation": {"median_aggregate_sd": 0.0268, "ci": {"median_aggregate_sd": [0.03, 0.0955]}}}},
           "conditions": {"c": {"tasks": 38, "variable_tasks": 2, "variable_tasks_ci": [0.006, 0.177], "w": 0.3,
                                "w_ci": [0.3, "Infinity"]}}}
    found = {p.where: p.inside for p in report_walk.json_pairs(doc)}
    assert found == {"/floors/e/perturbation/ci/median_aggregate_sd": False, "/conditions/c/variable_tasks_ci": True,
                     "/conditions/c/w_ci": True}
    text = "SD 0.0268 [0.0300, 0.0955]; 7.75 [2.42, 7.68]x; 20.0% [0.000, 0.500]; 2/38 [0.006, 0.177]; 0.1 [0.10, inf)"
    assert [p.inside for p in report_walk.text_pairs(text)] == [False, False, True, True, True]


def test_judge_design_against_an_openai_compatible_url_and_a_study_file(tmp_path):
    """A user's provider URL (here the built-in provider served alone, as any upstream would be)."""
    from noisefloor.ladder.provider import BuiltinProvider
    from noisefloor.ladder.suite import builtin_suite

    provider = BuiltinProvider(builtin_suite(), seed=4).start()
    study = tmp_path / "judge.toml"
    study.write_text(f'design = "judge"\nprovider = "{provider.url}"\ntasks = 4\njudge-repeats = 3\n'
                     f'judge-temperatures = [0.7, 0]\nbootstrap = 200\njobs = 2\nout = "{{study_dir}}/out"\n')
    try:
        r = tool("nfladder", "run", str(study))
    finally:
        provider.stop()
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert "truth" not in doc and set(doc["judge"]) == {"judge-t0.7", "judge-t0"}
    assert doc["provenance"]["models"]["provider_lists"]["models"] == ["nf-builtin-1"]
    assert doc["provenance"]["recording_id"] and doc["provenance"]["task_set"]["tasks"] == 4


def test_examples_study_files_parse_and_name_their_designs():
    from noisefloor.ladder import study_file

    found = {}
    for path in sorted((ROOT / "examples" / "studies").glob("*.toml")):
        found[study_file.load(path)["design"]] = path
    assert set(found) == set(designs.DESIGNS)


def test_registry_refuses_bad_conditions_and_keys_replay_as_its_source():
    t0 = Condition("t0", overrides=(Override("/temperature", 0), Override("/seed", 7)))
    reg = Registry((Condition("replay", proxy="replay", replay_from=("t0", 0), rank=2), t0))
    assert reg.names == ("t0", "replay")
    args = reg.proxy_args(reg["replay"], "http://u")
    assert args[args.index("--mode") + 1] == "replay" and "--strict" in args and "/temperature=0" in args
    assert reg.stamp(reg["replay"]).seed == 7 and reg.stamp(reg["replay"]).temperature == 0.0
    with pytest.raises(ConditionError, match="not a recorded condition"):
        Registry((Condition("replay", proxy="replay", replay_from=("live", 0)),))
    with pytest.raises(ConditionError, match="declared twice"):
        Registry((t0, t0))
    with pytest.raises(ConditionError, match="needs replay_from"):
        Condition("r", proxy="replay")
    with pytest.raises(ConditionError, match="part of the stamp"):
        designs.gate(candidate_overrides=[Override("/model", "other")])


@pytest.mark.parametrize("text,verdict,conf", [
    ("VERDICT: PASS\nCONFIDENCE: 0.9", 1, 0.9), ("**Verdict:** fail\nConfidence: 85%", 0, 0.85),
    ("Correct. The function handles every case.", 1, None), ("Looking at the candidate carefully, the", None, None),
    ("", None, None), ("verdict = FAIL (confidence 70)", 0, 0.7),
    ("yes\nconfidence: 150", 1, None)])
def test_judge_replies_are_parsed_leniently_and_unparseable_ones_are_none(text, verdict, conf):
    got = parse_verdict(text)
    assert got[0] == verdict and (got[1] == pytest.approx(conf) if conf is not None else got[1] is None)


def test_drift_is_per_requested_model():
    two_models = {("live", "gpt-x"): {"gpt-x-2024"}, ("live", "claude-y"): {"claude-y-1"}}
    assert drift(two_models) == {}
    assert drift({("live", "gpt-x"): {"gpt-x-2024", "gpt-x-2025"}}) == {"live / gpt-x": ["gpt-x-2024", "gpt-x-2025"]}


def test_the_exit_code_page_and_every_help_list_the_modules_table():
    page = (ROOT / "docs" / "exit-codes.md").read_text()
    assert exit_codes.markdown_table() in page
    assert len({c for c, _ in exit_codes.TABLE}) == len(exit_codes.TABLE)
    for command in ("nfproxy", "nfverify", "nfanalyze", "nfladder", "nfview"):
        shown = " ".join(tool(command, "--help").stdout.split())  # the help's wrapping undone
        assert all(f"{code} {' '.join(meaning.split())}" in shown for code, meaning in exit_codes.TABLE), command
    shown = " ".join(tool("nfladder", "run", "--help").stdout.split())
    assert f"{exit_codes.REGRESSED} {dict(exit_codes.TABLE)[exit_codes.REGRESSED]}" in shown


def test_sigterm_exits_143_and_stops_the_proxy(tmp_path):
    """The agent would run 10 minutes: the command must stop it, not wait for it, wherever in
    the run's start the signal lands (the task file is written before the agent is registered).
    Should it hang all the same, its threads' stacks (SIGQUIT) are the failure's message."""
    from noisefloor._cli import STUCK_AFTER_SIGTERM

    agent = tmp_path / "slow.py"
    agent.write_text("import time\ntime.sleep(600)\n")
    exe = Path(sys.executable).with_name("nfladder")
    p = subprocess.Popen([str(exe), "run", "--agent", f"{sys.executable} {agent} {{task_file}}", "--tasks", "1",
                          "-R", "2", "--conditions", "live", "--out", str(tmp_path / "o"), "-j", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_until(lambda: list((tmp_path / "o").glob("tasks/*.json")), "the first run's task file")
        p.send_signal(signal.SIGTERM)
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGQUIT)
            time.sleep(2)
            os.killpg(p.pid, signal.SIGKILL)
            _, err = p.communicate(timeout=30)
            raise AssertionError(f"nfladder still running 60 s after SIGTERM; its stacks:\n{err[-6000:]}") from None
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    assert p.returncode == exit_codes.TERMINATED, err[-2000:]
    if STUCK_AFTER_SIGTERM in err:  # the 20 s deadline ended an unwinding that hung: kept, and shown
        warnings.warn(f"nfladder's SIGTERM deadline fired; its stacks:\n{err[-6000:]}", stacklevel=1)


def test_an_agent_starting_as_the_interrupt_lands_is_killed_not_waited_for(tmp_path):
    """`kill_running` between a run's task file and its agent's registration: the agent that
    registers after it is killed at once (the run returns killed, not after its 600 s), and
    `accept_runs` lets the next executor run start agents again."""
    from noisefloor.ladder import agent_run

    run = agent_run.AgentRun("live", 0, "t/1", "p", "f", (sys.executable, "-c", "import time; time.sleep(600)"), 600.0)
    agent_run.kill_running()
    try:
        attempt = agent_run.run_agent(run, 9, tmp_path)
    finally:
        agent_run.accept_runs()
    assert attempt.returncode == -signal.SIGKILL, attempt
    quick = agent_run.AgentRun("live", 0, "t/1", "p", "f", (sys.executable, "-c", "pass"), 60.0)
    assert agent_run.run_agent(quick, 9, tmp_path).returncode == 0


def test_a_study_file_with_an_unknown_key_is_refused_in_one_line(tmp_path):
    study = tmp_path / "bad.toml"
    study.write_text('design = "gate"\ncandidate_agnet = "x"\n')
    r = tool("nfladder", "run", str(study))
    assert r.returncode == exit_codes.INPUT and "unknown key 'candidate_agnet'" in r.stderr
    assert r.stderr.strip().count("\n") == 0
    study.write_text('design = "judge"\n[[condition]]\nname = "x"\n')
    r = tool("nfladder", "run", str(study), "--out", str(tmp_path / "o"))
    assert r.returncode == exit_codes.INPUT and "declare a ladder's conditions" in r.stderr


def _merged_out(study: Path, cwd: Path, monkeypatch) -> Path:
    from noisefloor.ladder import cli, study_file

    monkeypatch.chdir(cwd)
    ctx = cli.run_cmd.make_context("run", [str(study)])
    return Path(study_file.merge(study, ctx.params, ctx)["out"]).resolve()


def test_a_study_writes_its_outputs_relative_to_the_current_folder(tmp_path, monkeypatch):
    """A study kept in a repository writes nothing into the repository unless it says `{study_dir}`;
    the files it reads stay relative to the study itself."""
    repo, here = tmp_path / "repo" / "studies", tmp_path / "work"
    repo.mkdir(parents=True)
    here.mkdir()
    study = repo / "s.toml"
    study.write_text('design = "ladder"\nout = "nf-s"\nperturb-file = "v.json"\n')
    assert _merged_out(study, here, monkeypatch) == (here / "nf-s").resolve()
    from noisefloor.ladder import cli, study_file

    ctx = cli.run_cmd.make_context("run", [str(study)])
    assert Path(study_file.merge(study, ctx.params, ctx)["perturb_file"]).resolve() == (repo / "v.json").resolve()
    study.write_text('design = "ladder"\nout = "{study_dir}/nf-s"\n')
    assert _merged_out(study, here, monkeypatch) == (repo / "nf-s").resolve()
    study.write_text('design = "ladder"\nout = "x/{study_dir}"\n')
    r = tool("nfladder", "run", str(study))
    assert r.returncode == exit_codes.INPUT and "{study_dir} may only start the path" in r.stderr
    assert r.stderr.strip().count("\n") == 0


TWO_MODEL_AGENT = '''
import json, os, sys, urllib.request
task = json.load(open(sys.argv[-1]))
def ask(model, text):
    body = {"model": model, "temperature": 0.7, "messages": [{"role": "user", "content": text}]}
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=30))["choices"][0]["message"]["content"]
plan = ask("planner-gpt", "plan: " + task["prompt"])
print(ask("coder-claude", task["prompt"] + "\\n" + plan))
'''


def test_an_agent_calling_two_models_is_not_drift_and_its_rows_carry_both_names(tmp_path):
    """A fake OpenAI-compatible upstream that names each answer after the requested model."""
    from noisefloor.ladder.suite import builtin_suite
    from tests.fake_upstream import FakeUpstream

    tasks = {t.entry_point: t for t in builtin_suite()[:2]}

    def respond(doc: dict, n: int) -> str:
        text = doc["messages"][-1]["content"]
        task = next(t for name, t in tasks.items() if f"def {name}(" in text)
        return "a plan" if text.startswith("plan: ") else f"```python\n{task.program(task.right[0])}```"

    agent = tmp_path / "two_models.py"
    agent.write_text(TWO_MODEL_AGENT)
    upstream = FakeUpstream(responder=respond).start()
    try:
        r = tool("nfladder", "run", "--agent", f"{sys.executable} {agent} {{task_file}}", "--provider", upstream.url,
                 "--tasks", "2", "-R", "2", "--conditions", "live,t0", "-j", "2", "--bootstrap", "200", "--no-plot",
                 "--out", str(tmp_path / "o"))
    finally:
        upstream.stop()
    assert r.returncode == 0, r.stderr[-3000:]  # two requested models, each served by one: no drift (was exit 4)
    rows = [json.loads(line) for line in (tmp_path / "o" / "outcomes.jsonl").read_text().splitlines()]
    assert {(x["model"], x["served_model"]) for x in rows} == {("coder-claude", "coder-claude-2024-07-18")}
    assert {x["temperature"] for x in rows if x["condition"] == "t0"} == {0.0}
    assert all(x["outcome"] == 1 and x["grader_version"].startswith("nfverify-") for x in rows)
    doc = json.loads((tmp_path / "o" / "report.json").read_text())
    assert doc["provenance"]["models"]["requested"] == ["coder-claude", "planner-gpt"]
    assert doc["provenance"]["models"]["served_by_requested"]["live / planner-gpt"] == ["planner-gpt-2024-07-18"]
    assert "error" in doc["provenance"]["models"]["provider_lists"]  # the fake lists nothing: said so, not guessed
    assert doc["log"]["conditions"]["live"]["models"] == ["coder-claude-2024-07-18", "planner-gpt-2024-07-18"]


def test_seed_pinned_is_declared_once_in_the_conditions_registry():
    from noisefloor.ladder.conditions import LADDER_NAMES, PINNED_SEED, RECORDED

    assert "seed-pinned" in LADDER_NAMES and "seed-pinned" in RECORDED  # a replay may serve from it
    d = designs.ladder(3, ("live", "seed-pinned"))
    c = d.conditions["seed-pinned"]
    assert d.conditions.names == ("live", "seed-pinned")
    assert c.stamp.temperature == 0.7 and c.stamp.seed == PINNED_SEED
    args = d.conditions.proxy_args(c, "http://127.0.0.1:1")
    assert args.count("--set") == 2 and "/temperature=0.7" in args and f"/seed={PINNED_SEED}" in args
    with pytest.raises(ConditionError, match="unknown ladder condition 'seed-pined'"):
        designs.ladder(3, ("live", "seed-pined"))
    # one file declares it: no other module of the package names it
    others = [p for p in ROOT.glob("*/**/*.py") if "seed-pinned" in p.read_text()
              and p.parts[len(ROOT.parts)] not in ("tests", "bench", ".venv") and p.name != "conditions.py"]
    assert others == []


def test_seed_pinned_runs_with_its_seed_on_the_wire_and_in_the_rows(tmp_path):
    """nfladder through a real nfproxy against a fake OpenAI-compatible upstream that records
    every request: seed-pinned's requests carry T=0.7 and the pinned seed, live's carry neither."""
    from noisefloor.ladder.conditions import PINNED_SEED
    from noisefloor.ladder.suite import builtin_suite
    from tests.fake_upstream import FakeUpstream

    tasks = {t.entry_point: t for t in builtin_suite()[:2]}

    def respond(doc: dict, n: int) -> str:
        text = json.dumps(doc["messages"])
        task = next(t for name, t in tasks.items() if f"def {name}(" in text)
        return f"```python\n{task.program(task.right[0])}```"

    upstream = FakeUpstream(responder=respond).start()
    try:
        r = tool("nfladder", "run", "--provider", upstream.url, "--tasks", "2", "-R", "2", "--conditions",
                 "live,seed-pinned", "-j", "2", "--bootstrap", "200", "--no-plot", "--out", str(tmp_path / "o"))
        seen = [json.loads(s.body) for s in upstream.requests if s.body]
    finally:
        upstream.stop()
    assert r.returncode == 0, r.stderr[-3000:]
    pinned = [d for d in seen if d.get("seed") == PINNED_SEED]
    assert len(pinned) == 4 and all(d["temperature"] == 0.7 for d in pinned)  # 2 tasks x 2 replicates
    assert len([d for d in seen if "seed" not in d]) == 4
    rows = [json.loads(line) for line in (tmp_path / "o" / "outcomes.jsonl").read_text().splitlines()]
    assert {(x["seed"], x["temperature"]) for x in rows if x["condition"] == "seed-pinned"} == {(PINNED_SEED, 0.7)}
    assert all("seed" not in x for x in rows if x["condition"] == "live")
    doc = json.loads((tmp_path / "o" / "report.json").read_text())
    assert set(doc["conditions"]) == {"live", "seed-pinned"}
