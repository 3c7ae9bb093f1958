"""An outcomes file read straight into columns (`analyzer.file_rows`) gives what the typed rows
give: the same columns, the same analysis; a file the columns cannot hold exactly is read the full
way, which names a bad row as before. And many conditions: the bootstrap in bounded groups gives
the one-group intervals, and only the contrasts asked for are computed."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from noisefloor.analyzer import analysis, file_rows
from noisefloor.analyzer.analysis import Settings, analyze
from noisefloor.analyzer.outcome_columns import of_rows
from noisefloor.analyzer.outcomes import build, build_columns
from noisefloor.outcome_rows import read


def nfanalyze(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("nfanalyze")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "noisefloor.analyzer.cli"]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=120)


def rows(n_tasks: int = 12, conditions: tuple[str, ...] = ("live", "replay", "judge"), seed: int = 0) -> list[dict]:
    """Rows with what `build` must handle: unequal replicate counts, a task one condition lacks,
    failures (some empty), references and confidences on the judge, label columns."""
    rng = random.Random(seed)
    out = []
    for c in conditions:
        for t in range(n_tasks):
            if c == "replay" and t == 3:
                continue
            for r in range(rng.randint(2, 5)):
                y = int(rng.random() < 0.3 + 0.2 * (t % 3))
                row = {"task_id": f"T/{t}", "condition": c, "replicate": r, "outcome": y,
                       "failure": "" if y else rng.choice(("wrong", "timeout", "")), "session": f"s{t}-{r}"}
                if c == "judge":
                    row |= {"reference": t % 2, "confidence": rng.choice(("", 80, 95.5))}
                out.append(row)
    rng.shuffle(out)
    return out


def write_csv(path: Path, data: list[dict], columns: list[str] | None = None, delimiter: str = ",") -> Path:
    columns = columns or list(dict.fromkeys(k for r in data for k in r))
    with path.open("w", newline="") as fh:
        w = csv.writer(fh, delimiter=delimiter)
        w.writerow(columns)
        for r in data:
            w.writerow(["" if r.get(k) is None else r.get(k, "") for k in columns])
    return path


def write_jsonl(path: Path, data: list[dict], blank_every: int = 0) -> Path:
    lines = []
    for i, r in enumerate(data):
        lines.append(json.dumps({k: (None if v == "" and k not in ("failure",) else v) for k, v in r.items()}))
        if blank_every and i % blank_every == 0:
            lines.append("   ")
    path.write_text("\n".join(lines) + "\n")
    return path


def same_columns(a, b) -> None:
    assert (a.conditions, a.tasks, a.failures) == (b.conditions, b.tasks, b.failures)
    for f in ("condition", "task", "replicate", "outcome", "reference", "confidence", "failure"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), f


@pytest.mark.parametrize("kind", ["csv", "tsv", "jsonl", "jsonl-blank-lines", "csv-bom", "csv-crlf"])
def test_a_file_read_into_columns_gives_the_typed_rows_columns_and_analysis(tmp_path, kind):
    data = rows()
    if kind.startswith("jsonl"):
        path = write_jsonl(tmp_path / "o.jsonl", data, blank_every=7 if kind == "jsonl-blank-lines" else 0)
    else:
        path = write_csv(tmp_path / f"o.{'tsv' if kind == 'tsv' else 'csv'}", data, delimiter="\t" if kind == "tsv" else ",")
        if kind == "csv-bom":
            path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
        if kind == "csv-crlf":
            path.write_bytes(path.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    cols = file_rows.read(path)
    assert cols is not None
    typed = read(path)
    same_columns(cols, of_rows(typed))
    settings = Settings(resamples=500)
    assert analyze(build_columns(cols), settings).to_json() == analyze(build(typed), settings).to_json()


@pytest.mark.parametrize("odd", [
    {"outcome": " 1"},  # the full parse refuses it
    {"outcome": "yes"},
    {"replicate": "7.0"},  # the full parse takes it (as 7): not read here
    {"replicate": "1e1"},
    {"replicate": "٣"},  # a digit, not an ASCII one
    {"replicate": "99999999999999999999"},  # past float's whole numbers
    {"task_id": ""},
    {"condition": ""},
    {"reference": "2"},
    {"confidence": "high"},
])
def test_a_value_the_columns_cannot_hold_exactly_sends_the_read_the_full_way(tmp_path, odd):
    data = rows()
    data[5] = data[5] | odd
    path = write_csv(tmp_path / "o.csv", data, columns=["task_id", "condition", "replicate", "outcome", "failure",
                                                         "reference", "confidence"])
    assert file_rows.read(path) is None
    r = nfanalyze("--outcomes", str(path), "--json", "-", "--bootstrap", "200")
    try:
        typed = build(read(path)).conditions
    except Exception as exc:  # noqa: BLE001 - the full parse's own refusal
        assert r.returncode != 0 and "Traceback" not in r.stderr
        assert str(exc) in r.stderr and len(r.stderr.strip().splitlines()) == 1
        return
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["conditions"].keys() == typed.keys()


@pytest.mark.parametrize("case", ["unknown column", "endpoint column", "ragged", "blank line", "repeated key",
                                  "row_version 2", "duplicate header"])
def test_a_file_of_another_shape_is_left_to_the_full_read(tmp_path, case):
    data = rows()
    path = write_csv(tmp_path / "o.csv", data)
    text = path.read_text().splitlines()
    if case == "unknown column":
        text = [text[0] + ",note"] + [line + ",x" for line in text[1:]]
    elif case == "endpoint column":
        text = [text[0] + ",endpoint"] + [line + ",e1" for line in text[1:]]
    elif case == "ragged":
        text[4] += ",extra"
    elif case == "blank line":
        text.insert(3, "")
    elif case == "repeated key":
        text.append(text[1])
    elif case == "row_version 2":
        text = [text[0] + ",row_version"] + [line + ",2" for line in text[1:]]
    elif case == "duplicate header":
        text[0] = text[0].replace("session", "task_id")
    path.write_text("\n".join(text) + "\n")
    assert file_rows.read(path) is None
    r = nfanalyze("--outcomes", str(path), "--json", "-", "--bootstrap", "200")
    assert "Traceback" not in r.stderr
    if case in ("repeated key", "row_version 2", "duplicate header"):
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
    elif case != "endpoint column":  # the floors' rows: their own analysis
        assert r.returncode == 0, r.stderr


def test_nfanalyze_reports_alike_from_columns_and_from_typed_rows(tmp_path, monkeypatch):
    """A real nfanalyze process on the file against the analysis of the typed rows: the same JSON."""
    path = write_csv(tmp_path / "o.csv", rows(30))
    r = nfanalyze("--outcomes", str(path), "--json", "-", "--bootstrap", "1000", "--seed", "3")
    assert r.returncode == 0, r.stderr
    mine = analyze(build(read(path)), Settings(resamples=1000, seed=3)).to_json()
    got = json.loads(r.stdout)
    assert got["conditions"] == json.loads(json.dumps(mine["conditions"]))
    assert got["contrasts"] == json.loads(json.dumps(mine["contrasts"]))


def many(n_conditions: int, n_tasks: int, replicates: int, seed: int = 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for c in range(n_conditions):
        p = rng.uniform(0.05, 0.95, n_tasks)
        y = rng.random((n_tasks, replicates)) < p[:, None]
        out += [{"task_id": f"T/{t}", "condition": f"c{c}", "replicate": r, "outcome": int(y[t, r])}
                for t in range(n_tasks) for r in range(replicates)]
    return out


@pytest.mark.parametrize("replicates", [2, 7])
def test_the_bootstrap_in_bounded_groups_gives_the_one_group_intervals(tmp_path, monkeypatch, replicates):
    """Forced into groups of 4 columns (30 conditions: 60 columns), each group holds at most that
    many draws (the tasks' rank in the whole order among them), the contrasts' own first; every
    interval is the one-group interval (to the last bit where the means are exact sums, R = 2;
    within float rounding otherwise): every group resampled the same tasks."""
    cols = file_rows.read(write_csv(tmp_path / "o.csv", many(30, 40, replicates)))
    assert cols is not None
    data = build_columns(cols)
    settings = Settings(resamples=400, contrasts=(("c3", "c17"), ("c0", "c29")))
    whole = analyze(data, settings)
    sizes: list[int] = []
    ordered: list[bool] = []
    real = analysis.task_bootstrap

    def spy(cols, *a, **k):
        sizes.append(len(cols))
        ordered.append(next(iter(cols)) == analysis._ORDER)  # every group led by the tasks' one order
        return real(cols, *a, **k)

    monkeypatch.setattr(analysis, "task_bootstrap", spy)
    monkeypatch.setattr(analysis, "DRAWS_HELD", 4 * 400)
    grouped = analyze(data, settings)
    assert all(ordered) and sizes[0] == 4 + 1 and max(sizes[1:]) <= 4 and sum(sizes) == 60 + len(sizes)
    exact = replicates == 2

    def close(a, b):
        assert (a == b) if exact else np.allclose(a, b, rtol=1e-12, atol=1e-15), (a, b)

    for x, y in zip(whole.conditions, grouped.conditions, strict=True):
        close(tuple(x.w_ci), tuple(y.w_ci))
        close(tuple(x.score_ci), tuple(y.score_ci))
    for x, y in zip(whole.contrasts, grouped.contrasts, strict=True):
        assert (x.a, x.b) == (y.a, y.b)
        close(tuple(x.ci), tuple(y.ci))


def test_past_twenty_conditions_only_the_contrasts_asked_for_are_computed(tmp_path):
    path = write_csv(tmp_path / "o.csv", many(analysis.DEFAULT_PAIRS_UP_TO + 1, 10, 2))
    r = nfanalyze("--outcomes", str(path), "--json", "-", "--bootstrap", "200")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["contrasts"] == [] and any("only when asked for (--contrast A:B" in w for w in doc["warnings"])
    r = nfanalyze("--outcomes", str(path), "--json", "-", "--bootstrap", "200", "--contrast", "c2:c9")
    doc = json.loads(r.stdout)
    assert [(c["a"], c["b"]) for c in doc["contrasts"]] == [("c2", "c9")]
    assert not any("only when asked" in w for w in doc["warnings"])
    path = write_csv(tmp_path / "few.csv", many(analysis.DEFAULT_PAIRS_UP_TO, 10, 2))
    doc = json.loads(nfanalyze("--outcomes", str(path), "--json", "-", "--bootstrap", "200").stdout)
    n = analysis.DEFAULT_PAIRS_UP_TO
    assert len(doc["contrasts"]) == n * (n - 1) // 2
