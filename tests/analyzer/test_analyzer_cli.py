"""nfanalyze as a user runs it: files in, table / JSON / Markdown / PNG out, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from noisefloor.analyzer.outcomes import build
from noisefloor.analyzer.simulate import example
from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.replay.replayer import Replayer
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.request.traffic import RequestData, ResponseData
from noisefloor.proxy.store.log import Store


def nfanalyze(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("nfanalyze")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "noisefloor.analyzer.cli"]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def ladder_rows() -> list[dict]:
    sim = example(n_tasks=30, replicates=6, seed=3)
    return [{"task_id": r.task_id, "condition": r.condition, "replicate": r.replicate, "outcome": r.outcome} for r in sim.rows]


def test_json_markdown_and_plot(tmp_path):
    out = write_jsonl(tmp_path / "o.jsonl", ladder_rows())
    r = nfanalyze("--outcomes", str(out), "--json", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "r.md"),
                  "--plot", str(tmp_path / "r.png"), "--bootstrap", "3000", "--seed", "4")
    assert r.returncode == 0, r.stderr
    assert "live" in r.stdout and "budget" in r.stdout
    doc = json.loads((tmp_path / "r.json").read_text())
    for name in ("live", "t0", "replay"):
        c = doc["conditions"][name]
        assert set(c) >= {"tasks", "replicates", "score", "w", "w_ci", "variable_tasks", "variable_tasks_ci", "budget", "mde"}
        assert c["tasks"] == 30 and c["replicates"] == 6
        assert c["w_ci"][0] <= c["w"] <= c["w_ci"][1]
    assert doc["conditions"]["replay"]["w"] == 0.0
    assert {(c["a"], c["b"]) for c in doc["contrasts"]} == {("live", "t0"), ("live", "replay"), ("t0", "replay")}
    assert doc["settings"]["bootstrap"] == 3000 and doc["settings"]["seed"] == 4
    assert (tmp_path / "r.md").read_text().startswith("# Determinism ladder")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # same seed, same numbers
    again = nfanalyze("--outcomes", str(out), "--json", "-", "--bootstrap", "3000", "--seed", "4")
    assert json.loads(again.stdout)["conditions"] == doc["conditions"]


def test_csv_input_settings_and_batches(tmp_path):
    rows = ladder_rows()
    extra = [dict(r, condition="live_b2") for r in rows if r["condition"] == "live"]
    path = tmp_path / "o.csv"
    with path.open("w") as fh:
        fh.write("task_id,condition,replicate,outcome,notes\n")
        for r in rows + extra:
            fh.write(f"{r['task_id']},{r['condition']},{r['replicate']},{float(r['outcome'])},x\n")
    r = nfanalyze("--outcomes", str(path), "--json", "-", "--bootstrap", "500", "--compare-batches", "live", "live_b2",
                  "--contrast", "live:replay", "--delta", "0.05")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    b, live = doc["batches"], doc["conditions"]["live"]
    assert b["estimate"] == 0.0 and b["bootstrap_ci"] == [0.0, 0.0]  # identical batches: every resample agrees
    # but only 8 of 30 live tasks varied, so each batch's w may hide what its exact bound adds
    # above its bootstrap interval: the contrast widens by that on each side, and says so
    assert live["w_ci_method"] == "task_bootstrap+exact_bound" and b["ci_method"] == "task_bootstrap+condition_bounds"
    extra = live["w_ci"][1] - live["w_bootstrap_ci"][1]
    assert extra > 0 and b["ci"] == [pytest.approx(-extra), pytest.approx(extra)]
    assert [(c["a"], c["b"]) for c in doc["contrasts"]] == [("live", "replay")]
    assert doc["settings"]["delta"] == 0.05


@pytest.mark.parametrize(
    "content,suffix,message",
    [
        ("task_id,condition,outcome\nt,c,1\n", ".csv", "missing column replicate"),
        ("task_id,condition,replicate,outcome\nt,c,0,1\nt,c,1,0.5\n", ".csv", ":3: outcome '0.5' is not binary"),
        ("", ".csv", "is empty"),
        ("", ".jsonl", "no outcome rows"),
        ("task_id,condition,replicate,outcome\nt,c,0,1\nu,c,0,1\n", ".csv", "condition 'c' has a task with 1 replicate"),
        ("task_id,condition,replicate,outcome\nt,c,0,1\nt,c,0,0\n", ".csv", "replicate 0 appears twice"),
        ('{"task_id": "t", "condition": "c", "replicate": 0}\n', ".jsonl", ":1: missing outcome"),
        ("not json\n", ".jsonl", ":1: not a JSON object"),
        ("a\n", ".txt", "unknown outcomes format"),
    ],
)
def test_bad_input_gives_one_line_error(tmp_path, content, suffix, message):
    path = tmp_path / f"bad{suffix}"
    path.write_text(content)
    r = nfanalyze("--outcomes", str(path))
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


def test_missing_tasks_and_unbalanced_replicates_are_reported_or_refused(tmp_path):
    rows = ladder_rows()
    rows = [r for r in rows if not (r["condition"] == "t0" and r["task_id"] == "task/3")]
    rows = [r for r in rows if not (r["condition"] == "live" and r["task_id"] == "task/5" and r["replicate"] == 5)]
    path = write_jsonl(tmp_path / "o.jsonl", rows)
    r = nfanalyze("--outcomes", str(path), "--json", "-", "--bootstrap", "200")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["dropped_tasks"] == {"t0": ["task/3"]}
    assert doc["conditions"]["live"]["tasks"] == 29 and doc["conditions"]["live"]["replicates"] == 5
    assert doc["conditions"]["live"]["trimmed_from"] == [5, 6]
    assert any("task/3" in w for w in doc["warnings"])
    r = nfanalyze("--outcomes", str(path), "--missing-tasks", "error")
    assert r.returncode != 0 and "tasks do not match" in r.stderr
    r = nfanalyze("--outcomes", str(path), "--unbalanced", "error", "--missing-tasks", "intersect")
    assert r.returncode != 0 and "replicates" in r.stderr


def test_unknown_contrast_condition_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "o.jsonl", ladder_rows())
    r = nfanalyze("--outcomes", str(path), "--contrast", "live:nope")
    assert r.returncode != 0 and "condition 'nope' is not in the outcomes" in r.stderr


def test_log_adds_per_condition_counts(tmp_path):
    store_path = tmp_path / "log.lmdb"
    body = lambda s: json.dumps({"model": "m", "messages": [{"role": "user", "content": s}]}).encode()  # noqa: E731
    req = lambda s: RequestData("POST", "http://u/v1/chat/completions", "u", "/v1/chat/completions", (), body(s))  # noqa: E731
    resp = lambda reason: ResponseData(  # noqa: E731
        200, (), json.dumps({"model": "m-1", "system_fingerprint": "fp", "choices": [{"finish_reason": reason}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 4}}).encode())
    with Store.open(store_path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        for prompt, reason in (("a", "stop"), ("b", "length")):
            rec.finish(rec.begin(req(prompt), Labels("s1", condition="live")), resp(reason))
        rep = Replayer(s, Rules())
        rep.answer(req("a"), Labels("r1", condition="replay"))
        rep.answer(req("zzz"), Labels("r1", condition="replay"))
    out = write_jsonl(tmp_path / "o.jsonl", ladder_rows())
    r = nfanalyze(str(store_path), "--outcomes", str(out), "--json", "-", "--bootstrap", "200")
    assert r.returncode == 0, r.stderr
    log = json.loads(r.stdout)["log"]["conditions"]
    assert log["live"]["exchanges"] == 2 and log["live"]["truncated"] == 1
    assert log["live"]["input_tokens"] == 6 and log["live"]["models"] == ["m-1"] and log["live"]["fingerprints"] == ["fp"]
    assert log["replay"]["misses"] == 1 and log["replay"]["exchanges"] == 2
    bad = nfanalyze(str(tmp_path / "nope.lmdb"), "--outcomes", str(out))
    assert bad.returncode != 0 and "no nfproxy store" in bad.stderr
    ungraded = nfanalyze(str(store_path))  # exchanges but no grades: their trajectories, and what to run
    assert ungraded.returncode == 0, ungraded.stderr
    assert "no graded outcome rows" in ungraded.stdout and "nfverify" in ungraded.stdout
    assert "sessions: 2 (1 record, 1 replay); exchanges: 4" in ungraded.stdout
    # rows kept in the log are the input; --outcomes replaces the same (condition, task, replicate)
    # and the log's other rows stay
    with Store.open(store_path, write=True) as s:
        s.outcomes.put(ladder_rows())
    alone = nfanalyze(str(store_path), "--json", "-", "--bootstrap", "200")
    assert alone.returncode == 0, alone.stderr
    regraded = [{**r, "outcome": 1 - r["outcome"]} if (r["condition"], r["task_id"]) == ("t0", "task/0") else r
                for r in ladder_rows()]
    changed = write_jsonl(tmp_path / "changed.jsonl", [r for r in regraded if r["task_id"] == "task/0"])
    with_file = nfanalyze(str(store_path), "--outcomes", str(changed), "--json", "-", "--bootstrap", "200")
    assert with_file.returncode == 0, with_file.stderr
    expected = nfanalyze("--outcomes", str(write_jsonl(tmp_path / "all.jsonl", regraded)), "--json", "-",
                         "--bootstrap", "200")
    got = json.loads(with_file.stdout)["conditions"]
    assert got == json.loads(expected.stdout)["conditions"]
    assert got["t0"]["score"] != json.loads(alone.stdout)["conditions"]["t0"]["score"]  # the file's grade won


def test_example_runs_and_recovers_the_ladder_order():
    r = nfanalyze("--example", "--json", "-", "--bootstrap", "2000")
    assert r.returncode == 0, r.stderr
    conds = json.loads(r.stdout)["conditions"]
    assert conds["live"]["w"] > conds["t0"]["w"] > conds["replay"]["w"] == 0.0
    sim = example()
    data = build(sim.rows)
    assert len(data.tasks) == 40


def _tool_answer(name: str, args: str) -> bytes:
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}
    return json.dumps({"model": "m-2", "choices": [{"message": {"role": "assistant", "content": None,
                                                               "tool_calls": [call]}, "finish_reason": "tool_calls"}],
                       "usage": {"prompt_tokens": 10, "completion_tokens": 2}}).encode()


def test_a_store_without_outcome_rows_shows_its_trajectories_in_text_and_json(tmp_path):
    store_path = tmp_path / "agent.lmdb"
    body = lambda s: json.dumps({"model": "m", "messages": [{"role": "user", "content": s}]}).encode()  # noqa: E731
    req = lambda s: RequestData("POST", "http://u/v1/chat/completions", "u", "/v1/chat/completions", (), body(s))  # noqa: E731
    with Store.open(store_path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        for session, n in (("run-1", 3), ("run-2", 1)):  # a three-step run calling tools, a one-step run
            for i in range(n):
                tool = "get_weather" if i < 2 else "lookup\x1b[31m"
                rec.finish(rec.begin(req(f"{session}-{i}"), Labels(session, condition="agent")),
                           ResponseData(200, (("content-type", "application/json"),), _tool_answer(tool, "{}")))
        rep = Replayer(s, Rules())
        for prompt in ("run-1-0", "run-1-1", "other"):
            rep.answer(req(prompt), Labels("again-1", condition="agent-replay"))
    r = nfanalyze(str(store_path))
    assert r.returncode == 0, r.stderr
    assert "sessions: 3 (2 record, 1 replay); exchanges: 7" in r.stdout
    assert "steps per session: median 3 (min 1, mean 2.333, max 3)" in r.stdout
    assert "get_weather x5" in r.stdout and "\\x1b[31m" in r.stdout and "\x1b" not in r.stdout  # escaped label
    assert "models served: m-2 (6)" in r.stdout and "tokens: 60 in, 12 out" in r.stdout
    assert "2 hits, 1 misses, 0 order violations in 3 replayed exchanges; 0 of 1 replay sessions exact; " \
           "2 of 4 recorded exchanges served (50%)" in r.stdout
    j = nfanalyze(str(store_path), "--json", "-")
    assert j.returncode == 0, j.stderr
    t = json.loads(j.stdout)["trajectories"]
    assert t["sessions"] == 3 and t["tools"]["get_weather"] == 5 and t["replay"]["coverage"] == 0.5
    assert {x["session"]: x["steps"] for x in t["per_session"]} == {"run-1": 3, "run-2": 1, "again-1": 3}
    assert t["steps_per_session"] == {"min": 1.0, "median": 3.0, "mean": 7 / 3, "max": 3.0}
