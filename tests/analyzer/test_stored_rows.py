"""A store's graded rows read straight into columns (`analyzer.stored_rows`) give what the typed
rows give: the same matrices, the same analysis, the same report from a real nfanalyze process;
a row the columns cannot hold exactly sends the whole read the full way (and a bad row is still
one line naming the store and the row); the read holds a chunk of rows, not the study's; and the
bootstrap's counting in small pieces draws the very numbers it drew in one piece."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import tracemalloc
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from noisefloor.analyzer import bootstrap, logstats, stored_rows
from noisefloor.analyzer.analysis import Settings, analyze
from noisefloor.analyzer.outcomes import build, build_columns
from noisefloor.outcome_rows import _PARSERS, VERSION_KEY, OutcomeRow, parse_rows
from noisefloor.proxy.store.log import Store


def nfanalyze(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("nfanalyze")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "noisefloor.analyzer.cli"]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=120)


def graded(n_tasks: int, seed: int = 0, conditions: tuple[str, ...] = ("live", "replay", "judge")) -> list[dict]:
    """Rows as nfverify writes them (`OutcomeRow.to_json`), with what makes `build` work: replicate
    counts that differ (trimmed), a task one condition lacks (dropped), references and confidences
    on the judge, failure categories, the stamp columns."""
    rng = random.Random(seed)
    rows = []
    for c in conditions:
        for t in range(n_tasks):
            if c == "replay" and t == 3:
                continue
            for r in range(rng.randint(3, 6)):
                out = int(rng.random() < 0.4 + 0.2 * (t % 3))
                row = OutcomeRow(f"HumanEval/{t}", c, r, out, failure=None if out else rng.choice(("wrong", "timeout", "")),
                                 session=f"s{t}-{r}", model="m", served_model="m-1", temperature=0.7, seed=r,
                                 grader_version="g1", reference=int(t % 2) if c == "judge" else None,
                                 confidence=rng.choice((None, 80, 95.5)) if c == "judge" else None)
                rows.append(row.to_json())
    rng.shuffle(rows)
    return rows


def keep(path: Path, rows: list[dict]) -> Path:
    with Store.open(path, write=True, create=True) as s:
        s.outcomes.put(rows)
    return path


def typed(paths: list[Path]) -> list[OutcomeRow]:
    """The rows the full way: what nfanalyze read before the columns."""
    return parse_rows(enumerate(logstats.outcome_rows(paths), 1), "rows")


def same_sets(a, b) -> None:
    assert a.tasks == b.tasks and a.warnings == b.warnings and a.rows == b.rows
    assert {k: list(v) for k, v in a.dropped_tasks.items()} == {k: list(v) for k, v in b.dropped_tasks.items()}
    assert list(a.conditions) == list(b.conditions)
    for name, x in a.conditions.items():
        y = b.conditions[name]
        assert x.outcomes.dtype == y.outcomes.dtype and np.array_equal(x.outcomes, y.outcomes)
        assert (x.reference is None) == (y.reference is None)
        if x.reference is not None:
            assert np.array_equal(x.reference, y.reference)
        assert (x.confidence is None) == (y.confidence is None)
        if x.confidence is not None:
            assert np.array_equal(x.confidence, y.confidence, equal_nan=True)
        assert list(x.failures.items()) == list(y.failures.items()) and x.trimmed_from == y.trimmed_from


def test_columns_give_the_typed_rows_matrices_and_analysis(tmp_path):
    shards = [keep(tmp_path / "a.lmdb", graded(40, 1)), keep(tmp_path / "b.lmdb", graded(25, 2, ("t0", "L1")))]
    for paths in ([shards[0]], shards):
        cols = stored_rows.read(paths)
        assert cols is not None and len(cols) == len(typed(paths))
        a, b = build_columns(cols), build(typed(paths))
        same_sets(a, b)
        assert a.warnings and a.dropped_tasks and any(c.trimmed_from for c in a.conditions.values())
        settings = Settings(resamples=300, seed=4)
        assert analyze(a, settings).to_json() == analyze(b, settings).to_json()


def test_nfanalyze_reports_alike_from_columns_and_from_typed_rows(tmp_path):
    """The report and the terminal text of the store read as columns are those of the same rows
    given as a file (which takes the typed path)."""
    rows = graded(30, 5)
    store = keep(tmp_path / "s.lmdb", rows)
    file = tmp_path / "rows.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: json.dumps(
        [r["condition"], r["task_id"], r["replicate"]]))))  # the store's key order
    a = nfanalyze(str(store), "--json", str(tmp_path / "a.json"), "--bootstrap", "500")
    b = nfanalyze("--outcomes", str(file), "--json", str(tmp_path / "b.json"), "--bootstrap", "500")
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    doc_a, doc_b = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "ab")
    doc_a.pop("log"), doc_b.pop("log", None)
    assert doc_a == doc_b
    assert without_log(a.stdout) == without_log(b.stdout) and "warning: dropped 1 tasks" in b.stdout


def without_log(text: str) -> list[str]:
    """The terminal text less its "Proxy log per condition" block (a file has no log)."""
    out, skip = [], False
    for line in text.splitlines():
        skip = line.startswith("Proxy log per condition:") or (skip and line.startswith("  "))
        if not skip and line:
            out.append(line)
    return out


@pytest.mark.parametrize("odd", [
    {"score": 0.5},  # a column this version does not know: kept in `extra` by the full parse
    {"replicate": 1.0}, {"replicate": "2"}, {"outcome": True}, {"outcome": "1"}, {"confidence": "0.5"},
    {"session": 7}, {"replicate": 2**60 + 1}, {"row_version": 1.0},
])
def test_a_row_the_columns_cannot_hold_exactly_sends_the_read_the_full_way(tmp_path, odd):
    rows = graded(8)
    rows[5] = {**rows[5], **odd}
    assert stored_rows.read([keep(tmp_path / "s.lmdb", rows)]) is None


@pytest.mark.parametrize("odd, message", [
    ({"outcome": 2}, "outcome 2 is not binary"),
    ({"task_id": ""}, "missing task_id"),
    ({VERSION_KEY: 9}, "outcome row version 9 is newer"),
    ({"confidence": math.nan, "outcome": "x"}, "outcome 'x' is not binary"),
])
def test_a_bad_row_is_one_line_naming_the_store_and_the_row(tmp_path, odd, message):
    rows = graded(8)
    rows[0] = {**rows[0], **odd}
    store = keep(tmp_path / "s.lmdb", rows)
    assert stored_rows.read([store]) is None
    at = next(i for i, r in enumerate(logstats.outcome_rows([store]), 1) if r.get("task_id") == rows[0]["task_id"]
              and r.get("condition") == rows[0]["condition"] and r.get("replicate") == rows[0]["replicate"])
    r = nfanalyze(str(store), "--bootstrap", "100")
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert f"outcome rows in {store}:{at}: " in r.stderr and message in r.stderr


def test_a_row_kept_in_two_stores_is_left_to_the_full_read(tmp_path):
    rows = graded(6)
    a, b = keep(tmp_path / "a.lmdb", rows), keep(tmp_path / "b.lmdb", rows[:3])
    assert stored_rows.read([a]) is not None and stored_rows.read([a, b]) is None
    clash = keep(tmp_path / "c.lmdb", [{**rows[0], "outcome": 1 - rows[0]["outcome"]}])
    r = nfanalyze(str(a), str(clash), "--bootstrap", "100")
    assert r.returncode != 0 and "with different grades" in r.stderr


def test_replicates_past_int64_keep_their_order(tmp_path):
    """A file's replicate may be any whole number: the matrices take the lowest-numbered ones."""
    rows = [{"task_id": f"t{i}", "condition": "live", "replicate": rep, "outcome": int(rep == 5 or (i + j) % 2)}
            for i in range(12) for j, rep in enumerate((10**30, 5, 10**20, -(10**25)))]
    typed_rows = parse_rows(enumerate(rows, 1), "rows")
    data = build(typed_rows, unbalanced="trim")
    order = sorted({r["replicate"] for r in rows})
    want = [[next(r["outcome"] for r in rows if r["task_id"] == f"t{i}" and r["replicate"] == rep) for rep in order]
            for i in sorted(range(12), key=lambda i: f"t{i}")]
    assert data.conditions["live"].outcomes.tolist() == [want[i] for i in range(12)]
    file = tmp_path / "big.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = nfanalyze("--outcomes", str(file), "--bootstrap", "100")
    assert r.returncode == 0, r.stderr


def test_the_decoder_knows_every_column_the_full_parse_types():
    """`_Stored` is derived from OutcomeRow: it decodes every column the full parse types, and only those."""
    assert set(stored_rows._Stored.__struct_fields__) == set(_PARSERS) | {VERSION_KEY}
    assert {f.name for f in fields(OutcomeRow)} == set(_PARSERS) | {"extra"}


def test_many_rows_are_read_in_bounded_memory(tmp_path):
    """60,000 rows (what a 200k-exchange study keeps): the read holds the columns (30 bytes a row)
    and one chunk of texts, under a fifth of what the typed rows it replaced held."""
    rows = [{"row_version": 1, "task_id": f"task/{i % 3000}", "condition": "live", "replicate": i // 3000,
             "outcome": i % 2, "session": f"session-{i:08d}", "model": "gpt-4o-mini"} for i in range(60_000)]
    store = keep(tmp_path / "s.lmdb", rows)
    cols, peak = peak_of(lambda: stored_rows.read([store]))
    _, typed_peak = peak_of(lambda: typed([store]))
    assert cols is not None and len(cols) == 60_000
    assert sum(a.nbytes for a in (cols.condition, cols.task, cols.replicate, cols.outcome, cols.reference,
                                  cols.confidence, cols.failure)) == 30 * 60_000
    assert peak < min(20 << 20, typed_peak / 5), (peak, typed_peak)
    data = build_columns(cols)
    assert data.conditions["live"].outcomes.shape == (3000, 20)


def peak_of(fn):
    """What `fn` returns and the most memory Python and numpy held while it ran."""
    tracemalloc.start()
    try:
        return fn(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _old_task_bootstrap(matrix: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """The bootstrap as it counted before: a block's draws in one array, offset and counted whole."""
    n = matrix.shape[0]
    out, done = np.empty((resamples, matrix.shape[1])), 0
    for idx in bootstrap.index_blocks(n, resamples, seed):
        b = idx.shape[0]
        counts = np.bincount((idx + (np.arange(b) * n)[:, None]).ravel(), minlength=b * n).reshape(b, n)
        out[done:done + b] = counts @ matrix / n
        done += b
    return out


@pytest.mark.parametrize("n, resamples", [(1, 5), (7, 3001), (301, 2500), (2855, 2100), (300_001, 3)])
def test_bootstrap_counted_in_pieces_draws_the_same_bits(n, resamples):
    rng = np.random.default_rng(n)
    cols = {"w": rng.random(n) / 3, "score": rng.integers(0, 7, n) / 7}
    draws = bootstrap.task_bootstrap(cols, resamples, seed=11)
    matrix = np.column_stack(list(cols.values()))
    old = _old_task_bootstrap(matrix[bootstrap.canonical_order(matrix)], resamples, 11)  # tasks in their values' order
    assert np.array_equal(draws.values["w"], old[:, 0]) and np.array_equal(draws.values["score"], old[:, 1])
