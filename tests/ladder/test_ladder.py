"""nfladder end to end with the built-in provider, suite and agents (real processes throughout)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from noisefloor.ladder.provider import BuiltinProvider, TaskModel, task_models, true_w
from noisefloor.ladder.suite import builtin_suite
from tests.conftest import ROOT, delete_exchanges, needs_data
from tests.fake_upstream import FakeUpstream


def nfladder(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("nfladder")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def local_leftovers() -> set[Path]:
    """nfladder's folders in /tmp, less the Ray executor's (a Ray test may run beside, on another worker)."""
    return {p for p in Path(tempfile.gettempdir()).glob("nfladder-*") if not p.name.startswith("nfladder-ray-")}


@pytest.fixture(scope="module")
def mechanism(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """20 tasks x 4 replicates x 3 conditions (240 agent runs; the whole suite at R=6 was 684). At this
    size and seed, simulated studies of the provider's task models (all three intervals covering
    their true w, live > t0 > replay) pass 0.955 of the time, and 0.963 of studies fail when t0 is
    served at the live temperature (the override lost); 38 x 6 with seed 3 gave 0.912 and 1.0."""
    out = tmp_path_factory.mktemp("ladder") / "run"
    r = nfladder("run", "--out", str(out), "--tasks", "20", "-R", "4", "-j", "2", "--bootstrap", "4000",
                 "--seed", "22", cwd=out.parent)
    return r, out


def test_mechanism_check_recovers_the_injected_truth(mechanism):
    r, out = mechanism
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    truth = doc["truth"]
    for cond in ("live", "t0", "replay"):
        assert truth["w"][cond]["covered"], (cond, truth["w"][cond])
    assert doc["conditions"]["replay"]["w"] == 0.0
    assert truth["order_holds"]
    assert doc["log"]["conditions"]["replay"]["misses"] == 0
    assert doc["log"]["conditions"]["t0"]["models"] == ["nf-builtin-1"]
    assert (out / "ladder.png").read_bytes()[:4] == b"\x89PNG"
    assert "Known truth" in r.stdout
    assert f"wrote {out}/report.json, report.md, ladder.png, outcomes.jsonl, log.lmdb" in r.stdout
    # the log alone is enough: nfladder kept its graded rows in it
    alone = subprocess.run([str(Path(sys.executable).with_name("nfanalyze")), str(out / "log.lmdb"), "--json", "-",
                            "--bootstrap", "4000", "--seed", "22"], capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr
    again = json.loads(alone.stdout)
    assert again["conditions"] == doc["conditions"] and again["log"]["conditions"] == doc["log"]["conditions"]


# one small study (4 tasks x 3 replicates x live, t0, replay) that the tests below read, or copy and
# resume, instead of one nfladder run each
SMALL = ("run", "--tasks", "4", "-R", "3", "-j", "2", "--bootstrap", "500", "--seed", "5", "--no-plot")


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path, set[Path]]:
    """The study's run, its --out, and nfladder's folders in /tmp before it ran."""
    where = tmp_path_factory.mktemp("small")
    leftovers = local_leftovers()
    r = nfladder(*SMALL, "--out", str(where / "a"), cwd=where)
    assert r.returncode == 0, r.stderr[-2000:]
    return r, where / "a", leftovers


def copy_study(out: Path, to: Path) -> Path:
    """A copy of a finished study's --out to resume without changing the shared one."""
    shutil.copytree(out, to)
    return to


def test_same_seed_same_report_in_a_fresh_folder_and_resume_skips_finished_sessions(small, tmp_path):
    # a small study proves it as well as a large one (the same seed gives the same sessions,
    # answers and bootstrap draws at any size)
    first, shared, leftovers = small
    b = nfladder(*SMALL, "--out", str(tmp_path / "b"), cwd=tmp_path)
    assert b.returncode == 0, b.stderr[-2000:]
    ra = json.loads((shared / "report.json").read_text())
    rb = json.loads((tmp_path / "b" / "report.json").read_text())
    assert ra["conditions"] == rb["conditions"] and ra["contrasts"] == rb["contrasts"]
    assert not (shared / "ladder.png").exists()  # --no-plot (the mechanism check reads the plot)
    assert f"wrote {shared}/report.json, report.md, outcomes.jsonl, log.lmdb" in first.stdout  # what is there
    a = copy_study(shared, tmp_path / "a")
    before = (a / "attempts.jsonl").read_text().count("\n")
    again = nfladder(*SMALL, "--out", str(a), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    for cond in ("live", "t0", "replay"):
        assert f"[{cond}] all 12 runs done earlier" in again.stderr
    assert (a / "attempts.jsonl").read_text().count("\n") == before
    assert again.stdout.split("Known truth")[0] == first.stdout.split("Known truth")[0]  # the same ladder table
    assert local_leftovers() == leftovers  # nothing left in /tmp


def test_a_resume_with_fewer_tasks_and_replicates_grades_only_the_new_study(small, tmp_path):
    out = copy_study(small[1], tmp_path / "s")  # 4 tasks x 3 replicates, every run done
    smaller = nfladder("run", "--out", str(out), "-j", "2", "--bootstrap", "200", "--seed", "5", "--no-plot",
                       "--tasks", "3", "-R", "2", cwd=tmp_path)
    assert smaller.returncode == 0, smaller.stderr[-2000:]  # was KeyError: 'NF/4' in the differential check
    rows = [json.loads(line) for line in (out / "outcomes.jsonl").read_text().splitlines()]
    assert sorted((r["condition"], r["task_id"], r["replicate"]) for r in rows) == sorted(
        (c, f"NF/{t}", r) for c in ("live", "t0", "replay") for t in range(3) for r in range(2))


def test_injected_replay_violation_fails_loudly(tmp_path):
    r = nfladder("run", "--out", str(tmp_path / "v"), "--tasks", "4", "-R", "2", "-j", "2", "--bootstrap", "200",
                 "--conditions", "t0,replay", "--no-plot", "--inject-violation", cwd=tmp_path)
    assert r.returncode == 3
    assert "REPLAY FAILED" in r.stderr
    doc = json.loads((tmp_path / "v" / "report.json").read_text())
    assert doc["log"]["conditions"]["replay"]["misses"] >= 8


def test_a_replay_that_cannot_answer_fails_the_ladder_even_without_a_miss(tmp_path):
    agent = tmp_path / "one_call.py"  # one request, no retry: a replay error cannot turn into a miss
    agent.write_text(
        "import json, os, sys, urllib.request\n"
        "task = json.load(open(sys.argv[1]))\n"
        "body = {'model': 'm', 'temperature': 0.7, 'messages': [{'role': 'user', 'content': task['prompt']}]}\n"
        "req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', json.dumps(body).encode(),\n"
        "                             {'content-type': 'application/json'})\n"
        "print(json.load(urllib.request.urlopen(req, timeout=30))['choices'][0]['message']['content'])\n"
    )
    out = tmp_path / "d"
    common = ["--agent", f"{sys.executable} {agent} {{task_file}}", "--out", str(out), "--tasks", "3", "-R", "2",
              "-j", "2", "--bootstrap", "200", "--no-plot"]
    r = nfladder("run", *common, "--conditions", "t0", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    from noisefloor.proxy.store.log import Store

    with Store.open(out / "log.lmdb", write=False) as s:  # the recordings replay will serve
        source = [ex.id for ex in s.exchanges() if ex.condition == "t0" and ex.replicate == "0"]
    assert source
    delete_exchanges(out / "log.lmdb", source)
    r = nfladder("run", *common, "--conditions", "t0,replay", cwd=tmp_path)  # resumes: only the replay runs
    assert r.returncode == 3
    assert "REPLAY FAILED: the replay proxy could not answer every request" in r.stderr


@needs_data
@pytest.mark.parametrize("suite", ["humaneval+", "mbpp+"])
def test_published_suite_end_to_end_through_a_provider_url(tmp_path, suite):
    """The real-dataset path: suite file, agent, three proxies, the differential verifier on the
    EvalPlus inputs, the analysis. The provider answers the reference solution at temperature 0
    and, at the agent's own temperature, a broken one every other call."""
    from noisefloor.verifier.datasets import load_code_tasks, locate

    tasks = load_code_tasks(suite, locate(suite))[:3]

    def respond(doc: dict, n: int) -> str:
        asked = doc["messages"][-1]["content"]
        task = next(t for t in tasks if t.prompt in asked)
        good = doc.get("temperature") == 0 or n % 2 == 0
        return f"```python\n{task.canonical if good else task.prompt + '    return None'}\n```"

    up = FakeUpstream(responder=respond).start()
    try:
        r = nfladder("run", "--suite", suite, "--tasks", "3", "-R", "2", "-j", "2", "--bootstrap", "200",
                     "--no-plot", "--provider", up.url, "--out", str(tmp_path / "p"), cwd=tmp_path)
    finally:
        up.stop()
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "p" / "outcomes.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 2 * 3
    assert {row["task_id"] for row in rows} == {t.task_id for t in tasks}
    by_condition = {c: [row["outcome"] for row in rows if row["condition"] == c] for c in ("live", "t0", "replay")}
    assert by_condition["t0"] == [1] * 6 and by_condition["replay"] == [1] * 6
    assert 0 < sum(by_condition["live"]) < 6
    assert all(row["failure"] for row in rows if row["outcome"] == 0)
    doc = json.loads((tmp_path / "p" / "report.json").read_text())
    assert doc["log"]["conditions"]["replay"]["misses"] == 0


def test_failing_and_hanging_agents_are_recorded_and_the_run_goes_on(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(
        "import json, sys, time\n"
        "task = json.load(open(sys.argv[1]))\n"
        "if task['task_id'].endswith('/0'):\n    time.sleep(30)\n"
        "print('bad things happened', file=sys.stderr)\nsys.exit(2)\n"
    )
    r = nfladder("run", "--agent", f"{sys.executable} {agent} {{task_file}}", "--out", str(tmp_path / "f"),
                 "--tasks", "3", "-R", "2", "-j", "2", "--bootstrap", "200", "--conditions", "live", "--no-plot",
                 "--agent-timeout", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "f" / "outcomes.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    kinds = {(row["task_id"], row["failure"]) for row in rows}
    assert ("NF/0", "agent_timeout") in kinds and ("NF/1", "agent_error") in kinds
    assert any("bad things happened" in row["detail"] for row in rows)


def test_a_proxy_that_cannot_record_stops_the_ladder_and_a_resume_reruns_the_lost_runs(tmp_path, small_disk):
    agent = tmp_path / "big.py"  # 3 MB of random text per request: the 40 MB disk fills after a few runs
    agent.write_text(
        "import base64, json, os, sys, urllib.request, urllib.error\n"
        "task = json.load(open(sys.argv[1]))\n"
        "text = base64.b64encode(os.urandom(2_300_000)).decode()\n"
        "body = {'model': 'm', 'messages': [{'role': 'user', 'content': task['prompt'] + text}]}\n"
        "req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', json.dumps(body).encode(),\n"
        "                             {'content-type': 'application/json'})\n"
        "try:\n    urllib.request.urlopen(req, timeout=30)\n"
        "except urllib.error.HTTPError as e:\n    sys.exit(0 if e.code == 413 else 1)\n"
    )
    upstream = FakeUpstream().start()  # answers 413 to bodies over 1 MiB; the proxy records them all the same
    try:
        out = small_disk / "run"
        r = nfladder("run", "--agent", f"{sys.executable} {agent} {{task_file}}", "--provider", upstream.url,
                     "--out", str(out), "--tasks", "10", "-R", "2", "-j", "2", "--conditions", "live",
                     "--bootstrap", "200", cwd=tmp_path)
    finally:
        upstream.stop()
    assert r.returncode == 5, r.stderr[-2000:]  # exit_codes.INPUT: a state that cannot go on
    assert "the live proxy exited 5: it could not record every exchange" in r.stderr
    assert not (out / "outcomes.jsonl").exists()  # nothing graded as an agent error
    from noisefloor.ladder.runner import Config, Ladder
    from noisefloor.proxy.store.log import Store

    with Store.open(out / "log.lmdb", write=False) as st:
        logged = {ex.session for ex in st.exchanges()}
    ran = {json.loads(line)["session"] for line in (out / "attempts.jsonl").read_text().splitlines()}
    assert logged and ran - logged  # some runs finished without a record
    from noisefloor.ladder import designs

    resumed = Ladder(Config(out=out, agent=["x"], tasks=builtin_suite()[:10], dataset=out / "suite.jsonl.gz",
                            upstream="http://127.0.0.1:9", replicates=2,
                            conditions=designs.ladder(2, ("live",)).conditions))
    assert set(resumed.done) == logged  # the runs the log lost run again on resume; the recorded ones do not


def test_unparseable_suite_is_refused_before_anything_runs(tmp_path):
    bad = tmp_path / "suite.jsonl"
    bad.write_text("{not json\n")
    r = nfladder("run", "--suite", str(bad), "--provider", "http://127.0.0.1:9", "--out", str(tmp_path / "o"),
                 cwd=tmp_path)
    assert r.returncode != 0 and "suite refused before anything ran" in r.stderr
    assert not (tmp_path / "o" / "log.lmdb").exists()


def test_reference_openai_agent_runs_unchanged_against_the_builtin_provider(tmp_path):
    agent = f"{sys.executable} {ROOT / 'examples' / 'reference_agent.py'} {{task_file}}"
    # one task, t0 and replay: each run pays about 2 CPU-s importing openai, and these 4 runs cover a
    # recording with the proxy's override imposed and a strict replay of it
    r = nfladder("run", "--agent", agent, "--out", str(tmp_path / "ref"), "--tasks", "1", "-R", "2", "-j", "2",
                 "--bootstrap", "200", "--conditions", "t0,replay", "--no-plot", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "ref" / "outcomes.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and not any(row["failure"].startswith("agent_") for row in rows)


def test_base_model_agent_completes_the_prompt_on_the_completions_endpoint(tmp_path):
    ids = "NF/2, NF/5,NF/7"
    r = nfladder("run", "--agent", "completions", "--task-ids", ids, "--out", str(tmp_path / "c"), "-R", "3", "-j", "2",
                 "--bootstrap", "200", "--no-plot", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "c" / "outcomes.jsonl").read_text().splitlines()]
    assert {row["task_id"] for row in rows} == {"NF/2", "NF/5", "NF/7"} and len(rows) == 27
    assert not any(row["failure"].startswith(("agent_", "no_code", "syntax")) for row in rows), rows
    assert any(row["outcome"] == 1 for row in rows)  # bare bodies are graded as the prompt completed
    from noisefloor.proxy.store.log import Store

    with Store.open(tmp_path / "c" / "log.lmdb", write=False) as s:
        exs = [ex for ex in s.exchanges() if ex.mode == "record"]
        assert exs and all(ex.request["url"].endswith("/v1/completions") for ex in exs)
        sent = [json.loads(s.bodies.get(ex.request["body"])) for ex in exs if ex.condition == "t0"]
    assert sent and all(doc["temperature"] == 0 and "\ndef " in doc["stop"] for doc in sent)
    bad = nfladder("run", "--task-ids", "NF/2,NF/999", "--out", str(tmp_path / "x"), cwd=tmp_path)
    assert bad.returncode == 64 and "1 ids are not in the suite (e.g. 'NF/999')" in bad.stderr


def test_provider_model_closed_forms():
    m = TaskModel(q=0.3, residual=0.1)
    assert m.p0 == pytest.approx(0.1) and m.p(0.7) == pytest.approx(0.3) and m.p(0.35) == pytest.approx(0.2)
    tasks = builtin_suite()
    models = task_models(tasks, 0)
    assert true_w(models, 0.0) < true_w(models, 0.7)
    p = BuiltinProvider(tasks, seed=1)
    task = tasks[3]
    right_bodies = {task.program(b) for b in task.right}
    n = 4000  # the share of right answers is Binomial(n, p(T)) / n: within 3 SD of the model's p(T)
    for temperature in (0.7, 0.0):
        want = p.models[task.task_id].p(temperature)
        draws = [p.answer(task.prompt, temperature)[0] for _ in range(n)]
        share = sum(any(b in d for b in right_bodies) for d in draws) / n
        assert abs(share - want) <= 3 * math.sqrt(want * (1 - want) / n), (temperature, share, want)
