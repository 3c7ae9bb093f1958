"""One report builder: report.json has a schema version, and nfladder's report and nfanalyze's
report of the same log have the same keys and the same drift warning (a real nfladder run
against an upstream whose served model changes within the study)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from noisefloor.analyzer import report_doc
from noisefloor.analyzer.analysis import Settings, analyze
from noisefloor.analyzer.outcomes import build
from noisefloor.analyzer.simulate import example
from tests.fake_upstream import FakeUpstream


def _analysis():
    return analyze(build(list(example(n_tasks=8, replicates=3, seed=1).rows)), Settings(resamples=200))


def test_the_builder_versions_the_report_and_words_drift_once():
    a = _analysis()
    served = {"live / gpt-x": ["gpt-x-1", "gpt-x-2"], "live / other": ["other-1"]}
    parts = report_doc.Parts(design="ladder", served_by_requested=served, study_settings={"replicates": 3},
                             floor_notes=("endpoint 'e' changed served model",), truth={"w": {}})
    doc = report_doc.build(a, parts)
    assert doc["schema"] == report_doc.SCHEMA == 1 and next(iter(doc)) == "schema"
    assert doc["warnings"] == [*a.warnings, "live / gpt-x: the served model changed within the study (gpt-x-1, "
                               "gpt-x-2)", "endpoint 'e' changed served model"]
    assert doc["settings"]["replicates"] == 3 and doc["settings"]["bootstrap"] == 200
    assert "floors" not in doc and "gate" not in doc and doc["design"] == "ladder"
    # what a log keeps is enough for nfanalyze to build the same report
    again = report_doc.build(a, report_doc.Parts.kept(json.loads(json.dumps(parts.kept_meta()))))
    assert {k: v for k, v in again.items() if k != "warnings"} == {k: v for k, v in doc.items() if k != "warnings"}
    assert again["warnings"] == doc["warnings"][:-1]  # the floors' notes come from the rows, not the log's meta
    assert report_doc.build(a)["warnings"] == list(a.warnings)


def _tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).with_name(name)), *args], capture_output=True, text=True,
                          timeout=600, env=os.environ)


def test_nfladder_and_nfanalyze_reports_have_the_same_keys_and_drift_warning(tmp_path):
    from noisefloor.ladder.suite import builtin_suite

    tasks = {t.entry_point: t for t in builtin_suite()[:2]}

    def respond(doc: dict, n: int) -> str:
        text = doc["messages"][-1]["content"]
        task = next(t for name, t in tasks.items() if f"def {name}(" in text)
        return f"```python\n{task.program(task.right[0])}```"

    upstream = FakeUpstream(responder=respond, served=lambda doc, n: f"served-{n % 2}").start()
    out = tmp_path / "o"
    try:
        r = _tool("nfladder", "run", "--provider", upstream.url, "--tasks", "2", "-R", "2", "--conditions", "live",
                  "-j", "2", "--bootstrap", "200", "--no-plot", "--out", str(out), "--allow-drift")
    finally:
        upstream.stop()
    assert r.returncode == 0, r.stderr[-3000:]
    ladder = json.loads((out / "report.json").read_text())
    a = _tool("nfanalyze", str(out / "log.lmdb"), "--json", "-", "--bootstrap", "200", "--allow-drift")
    assert a.returncode == 0, a.stderr[-3000:]
    alone = json.loads(a.stdout)
    assert ladder["schema"] == alone["schema"] == report_doc.SCHEMA
    assert list(alone) == list(ladder)
    assert set(alone["settings"]) == set(ladder["settings"])
    drift = [w for w in ladder["warnings"] if "served model changed" in w]
    assert drift == [w for w in alone["warnings"] if "served model changed" in w]
    assert len(drift) == 1 and drift[0].startswith("live / ") and "served-0, served-1" in drift[0], drift
    assert alone["conditions"] == ladder["conditions"] and alone["provenance"] == ladder["provenance"]


def test_a_log_whose_answers_reported_no_usage_says_so_instead_of_zero_tokens():
    from noisefloor.analyzer import report

    counted = {"exchanges": 3, "misses": 0, "order_violations": 0, "errors": 0, "truncated": 0, "models": ["m"]}
    silent = {"conditions": {"live": {**counted, "input_tokens": 0, "output_tokens": 0}}}
    told = {"conditions": {"live": {**counted, "input_tokens": 30, "output_tokens": 0}}}
    text = report.table(_analysis(), silent)
    assert "tokens not reported by the answers" in text and "0/0" not in text
    assert "tokens in/out 30/0" in report.table(_analysis(), told)
