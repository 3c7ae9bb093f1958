"""Grading against the real HumanEval+ / MBPP+ / BFCL v4 data (skipped when ../shared/data is absent)."""

from __future__ import annotations

import ast
import json
import math
import multiprocessing
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from noisefloor.verifier.bfcl import Call, grade, grade_response, ground_truth_calls
from noisefloor.verifier.datasets import DatasetError, load_bfcl, load_code_tasks, locate
from noisefloor.verifier.differential import Differential, Verdict
from noisefloor.verifier.extract import assemble, extract_code
from noisefloor.verifier.grading import GradeOptions, code_grader
from noisefloor.verifier.mbpp import NOT_NONE
from tests import loopback
from tests.conftest import HAVE_EVALPLUS, needs_bfcl, needs_data, start_nfproxy
from tests.fake_upstream import FakeUpstream


def mbpp_sample() -> set[str]:
    """Every third MBPP+ task and Mbpp/271 (the seed study's flipping task): all 378 canonical
    solutions, rerun six times, are the bench's job (bench/verifier_determinism.py)."""
    ids = [t.task_id for t in load_code_tasks("mbpp+", locate("mbpp+"))]
    return {*ids[::3], "Mbpp/271"}


@pytest.fixture(scope="session")
def graders() -> Iterator[dict[str, Differential]]:
    opts = GradeOptions(jobs=os.cpu_count() or 2)
    out = {"humaneval+": code_grader("humaneval+", locate("humaneval+"), opts),
           "mbpp+": code_grader("mbpp+", locate("mbpp+"), opts, mbpp_sample())}
    yield out
    for d in out.values():
        d.sandbox.close()


@pytest.fixture(scope="session")
def canonical_verdicts(graders) -> Callable[[str], dict[str, Verdict]]:
    """Every canonical solution of a suite graded once (after its reference outputs were computed):
    the test that they all pass reads these, and the rerun test takes them as its first run."""
    done: dict[str, dict[str, Verdict]] = {}

    def of(suite: str) -> dict[str, Verdict]:
        if suite not in done:
            d = graders[suite]
            verdicts = d.grade_many([(t.task_id, t.canonical) for t in d.tasks.values()], programs=True)
            done[suite] = {v.task_id: v for v in verdicts}
        return done[suite]

    return of


@needs_data
@pytest.mark.parametrize("suite,count", [("humaneval+", 164), ("mbpp+", 127)])
def test_every_canonical_solution_passes(graders, canonical_verdicts, suite, count):
    assert len(graders[suite].tasks) == count
    verdicts = canonical_verdicts(suite)
    assert sorted(verdicts) == sorted(graders[suite].tasks)
    failures = [(v.task_id, v.failure, v.detail) for v in verdicts.values() if v.outcome != 1]
    assert failures == []


@needs_data
def test_references_are_computed_per_task_and_the_cache_keeps_every_grader_s_tasks(tmp_path, monkeypatch):
    """A grader computes the canonical outputs of the tasks it grades, once: a log of a few tasks
    does not pay for the whole dataset, and a grader of other tasks adds to the cache file
    instead of replacing it (each sandbox run counted on the real sandbox)."""
    monkeypatch.setenv("NF_CACHE_DIR", str(tmp_path))
    runs: list[str] = []

    def grader(ids: set[str]) -> Differential:
        d = code_grader("humaneval+", locate("humaneval+"), GradeOptions(jobs=2), ids)
        real = d.sandbox.run

        def counted(program: str, entry_point: str, *args: Any, **kw: Any) -> Any:
            runs.append(entry_point)
            return real(program, entry_point, *args, **kw)

        d.sandbox.run = counted  # type: ignore[method-assign]
        return d

    first = grader({"HumanEval/0", "HumanEval/2", "HumanEval/5"})
    try:
        v = first.grade_many([("HumanEval/2", first.tasks["HumanEval/2"].canonical)], programs=True)
    finally:
        first.sandbox.close()
    assert [x.outcome for x in v] == [1] and runs == ["truncate_number"] * 2  # its reference, then the candidate
    (cache,) = tmp_path.glob("expected-*.json")
    assert set(json.loads(cache.read_text())["expected"]) == {"HumanEval/2"}
    runs.clear()
    second = grader({"HumanEval/2", "HumanEval/5"})
    try:
        items = [(tid, second.tasks[tid].canonical) for tid in ("HumanEval/2", "HumanEval/5")]
        assert [x.outcome for x in second.grade_many(items, programs=True)] == [1, 1]
    finally:
        second.sandbox.close()
    assert sorted(runs) == ["intersperse", "intersperse", "truncate_number"]  # /2's reference came from the cache
    assert set(json.loads(cache.read_text())["expected"]) == {"HumanEval/2", "HumanEval/5"}


@needs_data
def test_reruns_of_unchanged_candidates_are_identical(graders, canonical_verdicts):
    """Replay variance of the verifier itself: 0, including Mbpp/271, the seed study's flipping task.
    Three runs of each candidate in all; the canonical solutions' first run is the shared grading
    of every canonical solution (the reference outputs before it are a run of their own)."""
    d = graders["mbpp+"]
    ids = ["Mbpp/271", *list(d.tasks)[:24]]
    canonical = canonical_verdicts("mbpp+")
    mutants = [(tid, d.tasks[tid].canonical.replace("return ", "return 1 + ", 1)) for tid in ids]
    first = [(canonical[tid].outcome, canonical[tid].failure) for tid in ids]
    first += [(v.outcome, v.failure) for v in d.grade_many(mutants, programs=True)]
    items = [(tid, d.tasks[tid].canonical) for tid in ids] + mutants
    for _ in range(2):
        assert [(v.outcome, v.failure) for v in d.grade_many(items, programs=True)] == first


def _mutants(task_code: str, entry_point: str) -> dict[str, str]:
    """Known-wrong variants: the result wrapped in a list, an off-by-one constant, a negated branch."""
    tree = ast.parse(task_code)
    out = {}

    class Wrap(ast.NodeTransformer):
        def visit_Return(self, node: ast.Return) -> ast.Return:
            if node.value is not None:
                node.value = ast.List([node.value], ast.Load())
            return node

    out["wrapped"] = ast.unparse(Wrap().visit(ast.parse(task_code)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value in (0, 1):
            node.value += 1
            out["off_by_one"] = ast.unparse(tree)
            break
    tree = ast.parse(task_code)
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            node.test = ast.UnaryOp(ast.Not(), node.test)
            out["negated_if"] = ast.unparse(tree)
            break
    return out


def _independent_verdict(task: Any, code: str, conn: Any, cpu_s: int) -> None:
    """In a forked child: run the mutant and the canonical in-process and compare with == (floats
    with a tolerance) -- a second, simpler implementation to hold the verifier's verdicts against.
    It gets `cpu_s` CPU seconds in all (SIGXCPU ends it: a 0)."""
    import copy
    import math
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))

    def close(a: Any, b: Any) -> bool:
        if isinstance(a, float) or isinstance(b, float):
            return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-6, abs_tol=max(task.atol, 1e-6))
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) is type(b):
            return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
        return a == b

    ns_m: dict = {}
    ns_c: dict = {}
    try:
        exec(code, ns_m)
        exec(task.canonical, ns_c)
        for args in task.inputs:
            want = ns_c[task.entry_point](*copy.deepcopy(args))
            got = ns_m[task.entry_point](*copy.deepcopy(args))
            if not close(got, want):
                conn.send(0)
                return
        conn.send(1)
    except BaseException:  # noqa: BLE001
        conn.send(0)


def independent(task: Any, code: str, cpu_s: int) -> int:
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_independent_verdict, args=(task, code, send, cpu_s))
    proc.start()
    proc.join(30 + 3 * cpu_s)  # a backstop only: its CPU limit ends a loop
    if proc.is_alive():
        proc.kill()
        proc.join()
        return 0
    return recv.recv() if recv.poll() else 0


@needs_data
def test_mutated_canonical_solutions_agree_with_an_independent_check(graders):
    """The mutants of the first 50 HumanEval+ tasks are graded with a 2 CPU-s floor, not the
    default 10 (a task whose canonical solution needs more still gives 4x that), and the independent
    check gets the same CPU as the verifier gave, plus the canonical solution's share: a mutant that
    loops forever (HumanEval/39's negated `if`) costs about 2 + 3 CPU-s, not 10 + 20. Either floor
    gives such a mutant 0 in both checks; a verdict the lower floor could change is one of a mutant
    needing 2-10 CPU-s on a task whose canonical solution needs under 0.5, and the independent
    check, on the same budget, must then say 0 as well: a disagreement still fails the test."""
    first = list(graders["humaneval+"].tasks)[:50]
    d = code_grader("humaneval+", locate("humaneval+"), GradeOptions(jobs=os.cpu_count() or 2, timeout=2), first)
    try:
        items, kinds = [], []
        for t in d.tasks.values():
            if t.entry_point == "find_zero":  # its oracle is not equality
                continue
            for kind, code in _mutants(t.canonical, t.entry_point).items():
                items.append((t.task_id, code))
                kinds.append(kind)
        verdicts = d.grade_many(items, programs=True)
        budgets = {tid: math.ceil(1.25 * d.cpu_limit(tid)) + 1 for tid in d.tasks}  # canonical: <= limit / 4
    finally:
        d.sandbox.close()
    assert not any(v.outcome for k, v in zip(kinds, verdicts) if k == "wrapped")  # a list never equals
    disagree = [(tid, k) for (tid, code), k, v in zip(items, kinds, verdicts)
                if v.outcome != independent(d.tasks[tid], code, budgets[tid])]
    assert disagree == []
    assert sum(v.outcome == 0 for v in verdicts) >= 0.8 * len(verdicts)  # most mutants are caught
    mbpp = graders["mbpp+"]
    wrapped = [(t.task_id, _mutants(t.canonical, t.entry_point)["wrapped"]) for t in list(mbpp.tasks.values())[:80]
               if t.entry_point not in NOT_NONE | {"are_equivalent"}]
    assert all(v.outcome == 0 for v in mbpp.grade_many(wrapped, programs=True))


@needs_data
def test_answers_are_extracted_from_model_text(graders):
    d = graders["humaneval+"]
    t = d.tasks["HumanEval/0"]
    body = t.canonical[len(t.prompt):]
    full = t.canonical.split("def has_close_elements")[1]
    answers = {
        "fenced full function": f"Here you go:\n```python\ndef has_close_elements{full}```\nDone.",
        "bare body": body,
        "two blocks, last defines": f"```python\nprint('x')\n```\n```python\ndef has_close_elements{full}```",
    }
    for name, text in answers.items():
        assert d.grade("HumanEval/0", text).failure == "pass", name
    assert d.grade("HumanEval/0", "I cannot help with that.").failure in ("no_code", "syntax_error")
    assert d.grade("HumanEval/0", "```python\ndef has_close_elements(:\n```").failure == "syntax_error"
    assert d.grade("HumanEval/0", "").failure == "no_code"


def test_extraction_rules_without_data():
    text = "```python\ndef f(x):\n    return 1\n```\nand\n```\ndef f(x):\n    return 2\n```\n```js\nf()\n```"
    assert "return 2" in extract_code(text, "f")
    assert extract_code("no fences here\nreturn x", "f") == "no fences here\nreturn x"
    assert assemble("return x", "f", "def f(x):\n", "") == "def f(x):\n    return x"
    assert assemble("def f(x):\n    return x", "f", "import os\ndef f(x):\n", "import os\n").startswith("import os")
    assert assemble("", "f", "def f(x):\n", "") is None
    # a base model's continuation ends at its first unindented line: what it wrote after is not run
    body = "    y = x  # keep\n\n    # still the body\n    return y\n\nf(0) / 0\nprint('junk')\n"
    assert assemble(body, "f", "def f(x):\n", "") == "def f(x):\n    y = x  # keep\n\n    # still the body\n    return y\n\n"


def openai_body(calls: list[Call], finish_reason: str = "tool_calls") -> dict:
    """An OpenAI chat completion carrying these calls (what a provider would return)."""
    return {
        "object": "chat.completion",
        "choices": [{
            "index": 0,
            "finish_reason": finish_reason,
            "message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for i, c in enumerate(calls)
            ]},
        }],
    }


@needs_bfcl
def test_bfcl_ground_truth_scores_correct_everywhere():
    for category in ("multiple", "parallel"):
        tasks = load_bfcl(category)
        assert len(tasks) == 200
        results = Counter(grade_response(t, openai_body(ground_truth_calls(t))).failure for t in tasks)
        assert results == Counter({"correct": 200}), (category, results)


@needs_bfcl
def test_bfcl_wrong_calls_land_in_the_right_class():
    tasks = {t.task_id: t for t in load_bfcl("parallel") + load_bfcl("multiple")}
    par, mul = tasks["parallel_0"], tasks["multiple_2"]
    good = ground_truth_calls(par)
    assert grade(par, list(reversed(good))).failure == "correct"  # first-fit finds each its call here
    assert grade(par, [Call("spotify_stop", good[0].arguments), good[1]]).failure == "wrong_function"
    assert grade(par, [good[0], Call(good[1].name, {"artist": "Maroon 5", "duration": 99})]).failure == "wrong_arguments"
    assert grade(par, good[:1]).failure == "other"
    assert grade_response(mul, openai_body([])).failure == "malformed_output"
    broken = openai_body(ground_truth_calls(mul))
    broken["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"country": "Bra'
    assert grade_response(mul, broken).failure == "malformed_output"
    truncated = openai_body(ground_truth_calls(mul), finish_reason="length")
    assert grade_response(mul, truncated).failure == "malformed_output"
    # string normalization: case, spaces and punctuation do not matter; ints pass for floats
    assert grade(mul, [Call("country_info_capital", {"country": " brazil."})]).failure == "correct"
    # an API model cannot name a tool with a dot: BFCL's FC rule wants the underscored spelling
    assert grade(mul, [Call("country_info.capital", {"country": "Brazil"})]).failure == "wrong_function"
    anthropic_shape = {"type": "message", "content": [{"type": "tool_use", "name": "country_info_capital",
                                                       "input": {"country": "Brazil"}}], "stop_reason": "tool_use"}
    assert grade_response(mul, anthropic_shape).failure == "correct"
    gemini_shape = {"candidates": [{"content": {"parts": [{"functionCall": {"name": "country_info_capital",
                                                                            "args": {"country": "Brazil"}}}]}}]}
    assert grade_response(mul, gemini_shape).failure == "correct"


def test_missing_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        locate("humaneval+", tmp_path / "nope.jsonl.gz")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(DatasetError, match=r"bad\.jsonl:1: not valid JSON"):
        load_code_tasks("humaneval+", bad)


def nfverify(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("nfverify")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)


@needs_data
def test_candidates_from_a_proxy_log_become_outcome_rows(tmp_path, proxies):
    tasks = {t.task_id: t for t in load_code_tasks("humaneval+", locate("humaneval+"))}
    chosen = ["HumanEval/0", "HumanEval/2", "HumanEval/5"]

    def respond(doc: dict, n: int) -> str:
        prompt = doc["messages"][-1]["content"]
        task = next(t for t in tasks.values() if t.prompt.strip() in prompt)
        good = n % 2 == 1  # alternate right and wrong answers
        body = task.canonical if good else task.prompt + "    return None\n"
        return f"Sure:\n```python\n{body}\n```"

    up = FakeUpstream(responder=respond).start()
    store = tmp_path / "log.lmdb"
    try:
        p = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", up.url, "--condition", "live")
        proxies.append(p)

        for rep in range(2):
            for i, tid in enumerate(chosen):
                headers = {"x-nf-session": f"{tid}-{rep}"}
                if i == 0:  # one session labelled, the others matched by prompt
                    headers["x-nf-task"] = tid
                r = loopback.post(p.url + "/v1/chat/completions", timeout=20, headers=headers, json={
                    "model": "m", "messages": [{"role": "user", "content": "Complete:\n" + tasks[tid].prompt}]})
                assert r.status_code == 200
        p.stop()
    finally:
        up.stop()
    out = tmp_path / "outcomes.jsonl"
    r = nfverify("humaneval+", str(store), "--outcomes", str(out), "-j", "2")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6
    assert {(row["task_id"], row["replicate"]) for row in rows} == {(t, k) for t in chosen for k in (0, 1)}
    # the model asked for and the one that answered, as nfladder's rows say them
    assert all(row["condition"] == "live" and row["model"] == "m" and row["served_model"] == "m-2024-07-18"
               for row in rows)
    assert Counter(row["failure"] for row in rows) == Counter({"pass": 3, "wrong_output": 3})
    assert "3/6 passed" in r.stderr
    # the analyzer reads them as they are
    an = subprocess.run([str(Path(sys.executable).with_name("nfanalyze")), "--outcomes", str(out), "--json", "-",
                         "--bootstrap", "200"], capture_output=True, text=True, timeout=120)
    assert an.returncode == 0, an.stderr
    assert json.loads(an.stdout)["conditions"]["live"]["tasks"] == 3


def test_nfverify_bad_input_is_one_line(tmp_path):
    r = nfverify("humaneval+", str(tmp_path / "nope.lmdb"))
    assert r.returncode != 0 and "no nfproxy store" in r.stderr.strip().splitlines()[-1]
    r = nfverify("humaneval+")
    assert r.returncode != 0 and "give either" in r.stderr
    samples = tmp_path / "s.jsonl"
    samples.write_text('{"task_id": "HumanEval/0"}\n')
    if HAVE_EVALPLUS:
        r = nfverify("humaneval+", "--samples", str(samples), "--outcomes", str(tmp_path / "o.jsonl"))
        assert r.returncode != 0 and "needs 'solution' or 'completion'" in r.stderr
