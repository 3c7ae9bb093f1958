"""nfverify's BFCL grading equals the official checker's, candidate by candidate.

tests/data/bfcl_official_verdicts.jsonl.gz holds 34,482 candidates for the BFCL v4 multiple and
parallel sets (and five synthetic tasks: nesting, tuples, overlapping parallel answers) with the
verdicts of gorilla's own AST checker (bfcl_eval/eval_checker/ast_eval/ast_checker.py at gorilla
commit 6ea57973, fetched as a git snapshot): the ground truth (first,
second and third allowed values, dotted and underscored names) and systematic mutations of it
(names dotted/underscored/upper-cased/other functions; each argument omitted, "", null, case
changed, punctuation-only, punctuation added, int<->float and number<->string, lists reversed,
cut, grown and nested, dicts cut and grown; int-for-float and float-for-int at every depth; case
changes two and three levels deep; unexpected and declared-but-unanswered arguments; every other
allowed value; parallel orderings, omissions under reorderings, duplicated and swapped calls;
wrong call counts; arguments that are not a JSON object). They were graded once, outside this
project, by bench/bfcl_official_corpus.py (its docstring says how), for two model configs: "fc"
(underscore_to_dot, the API models) and "prompt" (names as declared). Verdicts are data here:
the checker's code is not in this repository.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from noisefloor.verifier import bfcl, bfcl_expected
from noisefloor.verifier.bfcl import Call, Rules, TaskGrader, grade, grade_response
from noisefloor.verifier.datasets import ToolTask, load_bfcl
from tests.conftest import DATA, needs_bfcl

CORPUS = DATA / "bfcl_official_verdicts.jsonl.gz"


@pytest.fixture(scope="module")
def corpus() -> tuple[dict[str, ToolTask], list[dict]]:
    tasks = {t.task_id: t for cat in ("multiple", "parallel") for t in load_bfcl(cat)}
    with gzip.open(CORPUS, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    for r in rows:  # synthetic tasks (nesting, tuples, overlapping parallel answers) travel with their rows
        if "task" in r and r["id"] not in tasks:
            t = r["task"]
            tasks[r["id"]] = ToolTask(r["id"], [], t["function"], t["ground_truth"], t["category"])
    return tasks, rows


def _body(calls: list[list[str]]) -> dict:
    """The candidate as an OpenAI chat completion: the arguments string exactly as the corpus holds it."""
    return {"choices": [{"finish_reason": "tool_calls", "message": {"tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(calls)]}}]}


@needs_bfcl
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "general"])
@pytest.mark.parametrize(("config", "rules"), [("fc", Rules()), ("prompt", Rules(names="declared"))])
def test_every_candidate_gets_the_official_verdict(corpus, monkeypatch, config, rules, compiled):
    """Both ways of checking an expected call: compiled (every published task compiles) and the
    general `check` on the raw task (what an entry of a shape the compiler does not hold gets)."""
    tasks, rows = corpus
    assert len(rows) == 34482
    if not compiled:
        monkeypatch.setattr(bfcl, "compile_expected", lambda *a: None)
    graders = {tid: TaskGrader(t, rules) for tid, t in tasks.items()}
    wrong = [(r["id"], r["m"], r[config]) for r in rows
             if bool(graders[r["id"]].grade_response(_body(r["calls"])).outcome) != r[config]]
    assert not wrong, f"{len(wrong)} disagreements with the official checker, e.g. {wrong[:5]}"


@needs_bfcl
def test_compiled_and_general_checks_give_the_same_verdicts_and_details(corpus, monkeypatch):
    """The verdict's class and detail too, not only the outcome, and one-off `grade_response` alike."""
    tasks, rows = corpus
    made = []
    real = bfcl.compile_expected
    monkeypatch.setattr(bfcl, "compile_expected", lambda *a: made.append(real(*a)) or made[-1])
    compiled = {tid: TaskGrader(t) for tid, t in tasks.items()}
    assert len(made) > 700 and all(e is not None for e in made)  # every corpus task compiles
    monkeypatch.setattr(bfcl, "compile_expected", lambda *a: None)
    general = {tid: TaskGrader(t) for tid, t in tasks.items()}
    differ = [(r["id"], r["m"]) for r in rows[::3]
              if compiled[r["id"]].grade_response(_body(r["calls"])) != general[r["id"]].grade_response(_body(r["calls"]))
              or grade_response(tasks[r["id"]], _body(r["calls"])) != general[r["id"]].grade_response(_body(r["calls"]))]
    assert not differ, differ[:5]


@needs_bfcl
def test_the_corpus_holds_the_cases_a_looser_grader_gets_wrong(corpus):
    """The rules the official checker applies and a looser grader would miss, each present with
    the official verdict (so the parity test above can fail on every one of them)."""
    tasks, rows = corpus
    by = Counter()
    for r in rows:
        t = tasks[r["id"]]
        kind = r["m"].split(":")[0]
        dotted = any("." in n for e in t.ground_truth for n in e)
        if kind == "gt_dotted" and dotted:
            by["dotted name: fc rejects, prompt accepts", r["fc"], r["prompt"]] += 1
        if kind == "var" and r["fc"] and '\\"...\\"' in json.dumps(r["calls"]):
            by["punctuation-only string accepted"] += 1
        if kind == "empty" and not r["fc"]:
            by["empty string rejected"] += 1
        if kind == "empty" and r["fc"]:
            by["empty string accepted"] += 1
        if kind == "deep_int_for_float" and r["fc"]:
            by["int for float accepted"] += 1
        if kind.startswith("deep_upper") and r["fc"]:
            by["case changed inside a list or dict accepted"] += 1
        if kind.startswith("deep_upper") and not r["fc"]:
            by["case changed deeper rejected"] += 1
        if kind == "perm" and not r["fc"]:
            by["reordering rejected (first-fit)"] += 1
        if kind == "omit" and not r["fc"]:
            by["omission rejected"] += 1
    assert by["dotted name: fc rejects, prompt accepts", False, True] > 100
    for label in ("punctuation-only string accepted", "empty string rejected", "empty string accepted",
                  "int for float accepted", "case changed inside a list or dict accepted", "case changed deeper rejected",
                  "omission rejected", "reordering rejected (first-fit)"):
        assert by[label] > 0, (label, by)


def _task(category: str, answers: list[dict], params: dict, required: list[str]) -> ToolTask:
    fn = {"name": "shop.order", "description": "", "parameters": {"type": "dict", "properties": params,
                                                                   "required": required}}
    return ToolTask("t", [[{"role": "user", "content": "q"}]], [fn], answers, category)


def test_first_fit_is_the_default_and_bipartite_says_it_departs():
    """Two answers for one function, one with an optional argument: first-fit gives the first
    answer the first call that fits, leaving the second answer nothing (BFCL's verdict); a
    bipartite matching finds the assignment that exists."""
    params = {"item": {"type": "string"}, "qty": {"type": "integer"}}
    task = _task("parallel", [{"shop.order": {"item": ["tea"], "qty": ["", 2]}},
                              {"shop.order": {"item": ["tea"], "qty": [2]}}], params, ["item"])
    calls = [Call("shop_order", {"item": "tea", "qty": 2}), Call("shop_order", {"item": "tea"})]
    assert grade(task, calls).failure == "wrong_arguments"
    assert grade(task, list(reversed(calls))).failure == "correct"
    assert grade(task, calls, Rules(parallel="bipartite")).failure == "correct"
    assert Rules().departs() is None and "departs" in Rules(parallel="bipartite").departs()


@pytest.mark.parametrize("parallel", ["first-fit", "bipartite"])
def test_eight_calls_cost_at_most_n_squared_checks(monkeypatch, parallel):
    """An 8-call candidate whose last call is wrong: the old grader tried 40,320 orderings (8 checks
    each); matching now checks each (expected, call) pair at most once."""
    params = {"item": {"type": "string"}, "qty": {"type": "integer"}}
    answers = [{"shop.order": {"item": [f"item {k}"], "qty": [k]}} for k in range(8)]
    task = _task("parallel", answers, params, ["item", "qty"])
    calls = [Call("shop_order", {"item": f"item {k}", "qty": k}) for k in reversed(range(8))]
    calls[0] = Call("shop_order", {"item": "item 7", "qty": 99})
    seen = []
    real = bfcl_expected.Expected.why
    monkeypatch.setattr(bfcl_expected.Expected, "why", lambda *a, **k: seen.append(1) or real(*a, **k))
    assert grade(task, calls, Rules(parallel=parallel)).failure == "wrong_arguments"
    assert 0 < len(seen) <= 64


def test_bounds_make_oversized_or_deep_arguments_malformed():
    params = {"item": {"type": "string"}, "qty": {"type": "integer"}}
    task = _task("multiple", [{"shop.order": {"item": ["tea"], "qty": [1]}}], params, ["item"])
    huge = _body([["shop_order", json.dumps({"item": "x" * (bfcl.MAX_ARGUMENT_CHARS + 1)})]])
    deep = _body([["shop_order", "[" * 60000 + "]" * 60000]])
    deep_small = _body([["shop_order", '{"item": ' + "[" * 20000 + "]" * 20000 + "}"]])
    for body in (huge, deep, deep_small):
        v = grade_response(task, body)
        assert v.failure in ("malformed_output", "wrong_arguments") and v.outcome == 0, v
    assert grade_response(task, huge).failure == "malformed_output"
    good = _body([["shop_order", json.dumps({"item": "Tea", "qty": 1})]])
    assert grade_response(task, good).failure == "correct"


_ODD = [  # declarations and answers of shapes the compiler does not hold, or holds only partly
    ({"item": {"type": "str"}}, {"item": ["tea"]}),  # a type BFCL does not name
    ({"item": {"type": "array"}}, {"item": [["tea"]]}),  # an array without its items' type
    ({"item": {"type": "string"}}, {"item": "tea"}),  # allowed values not a list
    ({"item": {"type": "array", "items": {"type": "string"}}}, {"item": [5, ["Tea"]]}),  # an int among lists
    ({"item": {"type": "dict"}}, {"item": [{"k": 5}]}),  # a nested answer that is not a list
    ({"item": {"type": "dict"}}, {"item": ["abc", {"k": ["A b"]}]}),  # a non-dict nested answer
    ({"item": {"type": "array", "items": {"type": "dict"}}}, {"item": [[{"k": ["x"]}, ""], "ab", {"k": 1}]}),
    ({"item": {"type": "float"}}, {"item": [1e308, ""], "extra": 3}),  # an undeclared answer that is no list
    # and shapes it compiles: strings among list answers, "" among dict answers, "any", tuples, int for float
    ({"item": {"type": "integer"}}, {"item": [2, "", True]}),
    ({"item": {"type": "array", "items": {"type": "string"}}}, {"item": ["ab", ["A", "b"], ""]}),
    ({"item": {"type": "tuple", "items": {"type": "float"}}}, {"item": [[1, 2.0], ""]}),
    ({"item": {"type": "any"}}, {"item": ["", 5, "X y"]}),
    ({"item": {"type": "dict"}}, {"item": ["", {"k": ["", "A"], "j": [1]}]}),
    ({"item": {"type": "array", "items": {"type": "dict"}}}, {"item": ["", [{"k": ["x", ""]}]]}),
    ({"item": {"type": "float"}}, {"item": [1, 2.5]}),
]
_VALUES = ["tea", "Tea.", ["tea"], ["Tea"], [], {"k": "a b"}, {"k": 5}, {}, [{"k": "x"}], [{"k": "X"}, {}],
           [{"k": 1}], ["a", "b"], "ab", 5, 2, 1.0, True, 10**400, None, [[["deep"]]], [{"k": "x"}, "s"], ["s"],
           [1, 2], [1.0, 2], {"k": "A", "j": 1}, {"j": 1.0}, 2.5, 1, "x y"]


@pytest.mark.parametrize(("params", "answer"), _ODD)
def test_odd_shapes_get_the_general_checks_verdicts(monkeypatch, params, answer):
    """Whatever a task's shape, a grader's verdicts (class and detail) are the general check's."""
    for category in ("multiple", "parallel"):
        task = _task(category, [{"shop.order": answer}], params, [])
        graders = [TaskGrader(task)]
        with monkeypatch.context() as m:
            m.setattr(bfcl, "compile_expected", lambda *a: None)
            graders.append(TaskGrader(task))
        for value in _VALUES:
            for args in ({"item": value}, {}, {"item": value, "extra": 3}):
                calls = [Call("shop_order", args)]
                assert graders[0].grade(calls) == graders[1].grade(calls), (params, answer, args)
