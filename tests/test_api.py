"""The Python surface as a new user meets it: docs/python-api.md's example, run as written; names that take
files take str and path-like; the gate makes the CLI's stamp checks; results have to_json()."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import noisefloor
from noisefloor import exit_codes
from tests.conftest import ROOT


def readme_example() -> str:
    text = (ROOT / "docs" / "python-api.md").read_text()
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(readme_example(), "docs/python-api.md", "exec"), scope)
    analysis, result = scope["analysis"], scope["result"]
    live, t0 = analysis.condition("live"), analysis.condition("t0")
    # live: each task passes 2 of 6 (variance 4/15 by ddof=1); t0: no variation at all
    assert live.stats.w == pytest.approx(4 / 15) and t0.stats.w == 0.0
    assert live.w_ci[0] <= live.stats.w <= live.w_ci[1]
    assert json.loads(json.dumps(scope["report"]))["conditions"]["live"]["w"] == pytest.approx(4 / 15)
    assert result.regressed and result.counts["regressed"] == 1
    assert result.to_json()["verdicts"][0]["case_id"] == "case-1"
    assert sorted(scope["rows"].tasks) == sorted(f"t{t}" for t in range(12))
    assert capsys.readouterr().out.splitlines()[1].startswith("True {")


def write(path: Path, passes: int, **stamp: object) -> Path:
    path.write_text("".join(json.dumps({"task_id": "c", "replicate": r, "outcome": int(r < passes), **stamp}) + "\n"
                            for r in range(8)))
    return path


def test_gate_checks_stamps_and_takes_counts(tmp_path):
    stamp = {"model": "m", "temperature": 0, "grader_version": "g"}
    a, b = write(tmp_path / "a.jsonl", 7, **stamp), write(tmp_path / "b.jsonl", 7, **stamp)
    hot = write(tmp_path / "hot.jsonl", 7, **{**stamp, "temperature": 1})
    with pytest.raises(noisefloor.StampError, match="different stamps"):
        noisefloor.gate(a, b, hot)
    bare = write(tmp_path / "bare.jsonl", 7)
    with pytest.raises(noisefloor.StampError, match="unstamped"):
        noisefloor.gate(str(bare), str(bare), str(bare))
    assert noisefloor.gate(bare, bare, bare, allow_unstamped=True).counts["within_noise"] == 1
    by_counts = noisefloor.gate({"c": (7, 8)}, {"c": noisefloor.CaseCounts(7, 8)}, {"c": (0, 8)})
    assert by_counts.regressed and by_counts.stamp is None
    assert by_counts.verdicts[0].verdict == noisefloor.gate(a, b, write(tmp_path / "z.jsonl", 0, **stamp)).verdicts[0].verdict


def test_every_public_name_resolves_and_is_documented():
    for name in noisefloor.__all__:
        value = getattr(noisefloor, name)
        if callable(value):
            assert value.__doc__, f"noisefloor.{name} has no docstring"
    with pytest.raises(noisefloor.OutcomeError, match="neither an outcome file"):
        noisefloor.load_outcomes(Path("/nonexistent/x.jsonl"))


def test_gate_outputs_for_ci(tmp_path):
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    stamp = {"model": "m", "temperature": 0, "grader_version": "g"}
    case = '<b>x</b>|y'  # a hostile case id stays inert in XML and Markdown
    runs = []
    for name, passes in (("a", {"ok": 8, case: 7, "flaky": 8}), ("b", {"ok": 8, case: 8, "flaky": 2}),
                         ("c", {"ok": 8, case: 0, "flaky": 5})):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"task_id": t, "replicate": r, "outcome": int(r < p), **stamp}) + "\n"
                                for t, p in passes.items() for r in range(8)))
        runs.append(str(path))
    exe = Path(sys.executable).with_name("nfanalyze")
    junit, md = tmp_path / "gate.xml", tmp_path / "summary.md"
    r = subprocess.run([str(exe), "gate", *runs, "--json", "-", "--junit-xml", str(junit), "--markdown", str(md)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr  # a case regressed
    doc = json.loads(r.stdout)  # stdout holds only the JSON
    assert doc["counts"] == {"within_noise": 1, "inconclusive": 0, "regressed": 1, "quarantine": 1}
    assert "operating characteristics" in r.stderr and f"{case}: regressed" in r.stderr
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "1" and suite.get("skipped") == "1"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases[case].find("failure") is not None and cases["ok"].find("failure") is None
    assert cases["flaky"].find("skipped") is not None
    text = md.read_text()
    assert text.startswith("## nfanalyze gate: regressed")
    assert "| &lt;b&gt;x&lt;/b&gt;\\|y | regressed | 7/8 | 8/8 | 0/8 |" in text and "<b>" not in text
    again = subprocess.run([str(exe), "gate", *runs[:2], runs[0], "--markdown", str(md)], capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0 and md.read_text().count("## nfanalyze gate") == 2  # a step summary collects
    both = subprocess.run([str(exe), "gate", *runs, "--json", "-", "--markdown", "-"], capture_output=True,
                          text=True, timeout=120)
    assert both.returncode == exit_codes.USAGE and both.stdout == "" and "would both write stdout" in both.stderr


def test_analyze_takes_the_cli_options_as_keywords(tmp_path):
    rows = [{"task_id": f"t{t}", "condition": "live", "replicate": r, "outcome": int((t + r) % 2 == 0)}
            for t in range(6) for r in range(4)]
    path = tmp_path / "o.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    loose = noisefloor.analyze(path, resamples=200, delta=0.2)
    strict = noisefloor.analyze(str(path), noisefloor.Settings(resamples=200, plan=noisefloor.Planning(delta=0.2)))
    assert loose.condition("live").stats.budget == strict.condition("live").stats.budget
    assert loose.condition("live").stats.budget < noisefloor.analyze(path, resamples=200).condition("live").stats.budget


HOSTILE_IDS = ["esc\x1b]8;;https://evil.example\x07click\x1b]8;;\x07", "nul\x00bell\x07del\x7f", "c1\x85\x9b31m",
               "bidi\u202egnp.exe", "[link](javascript:alert(1))", "**bold** _em_ `code` ~~s~~ #h", "a&lt;b&#60;c",
               "<img src=x onerror=alert(1)>", "]]><!--", "line\r\nbreak\ttab", "surrogate\ud800x", "non\ufffechar"]


def test_gate_outputs_keep_hostile_case_ids_inert():
    """Well-formed XML without a raw control character; Markdown with no live markup; both naming
    the case by a visible spelling of its id."""
    import xml.etree.ElementTree as ET

    from noisefloor.analyzer import gate_run

    c = {i: noisefloor.CaseCounts(8, 8) for i in HOSTILE_IDS}
    result = noisefloor.gate(c, c, {i: noisefloor.CaseCounts(0, 8) for i in HOSTILE_IDS})
    xml = gate_run.junit_xml(result)
    text = xml.decode("utf-8")
    assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\ud800-\udfff\ufffe\uffff]", text)
    names = [tc.get("name") for tc in ET.fromstring(xml).iter("testcase")]
    assert len(names) == len(HOSTILE_IDS) and "esc\\x1b]8;;https://evil.example\\x07click\\x1b]8;;\\x07" in names
    assert "nul\\x00bell\\x07del\\x7f" in names and "bidi\\u202egnp.exe" in names and "]]><!--" in names
    md = gate_run.markdown(result)
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e]", md)
    rows = [line for line in md.splitlines() if " | regressed | " in line]
    assert len(rows) == len(HOSTILE_IDS) and all(row.count("|") - row.count("\\|") == 8 for row in rows)
    for live in ("](", "**", "`code`", "<img", "&lt;b", "&#60;", "](javascript"):
        assert live not in md
    assert "\\[link\\]\\(javascript\\:alert\\(1\\)\\)" in md and "a&amp;lt;b&amp;\\#60;c" in md


def test_open_store_opens_a_store_read_only_by_path(tmp_path):
    from noisefloor.proxy.store.log import Store

    with Store.open(tmp_path / "s.lmdb", write=True, create=True):
        pass
    with noisefloor.open_store(tmp_path / "s.lmdb") as store:
        assert len(store) == 0 and not store.writable
    with pytest.raises(noisefloor.StoreError, match="no nfproxy store"):
        noisefloor.open_store(str(tmp_path / "missing.lmdb"))
