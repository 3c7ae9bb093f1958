"""A BFCL tool-calling audit through the real proxy: the built-in provider answers native tool calls
drawn from correct and wrong calls with known shares; nfproxy records reruns and prompt
perturbations; nfverify grades; nfanalyze reports floors and the taxonomy."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from noisefloor.ladder.suite import builtin_suite
from noisefloor.proxy.request import perturb
from noisefloor.proxy.store.log import Store
from tests import loopback
from tests.conftest import SHARED_DATA, start_nfproxy
from tests.tool_provider import ToolProvider

needs_bfcl = pytest.mark.skipif(not (SHARED_DATA / "bfcl").is_dir(), reason=f"no BFCL data at {SHARED_DATA}")
SHARES = {"correct": 0.6, "wrong_arguments": 0.2, "malformed_output": 0.1, "wrong_function": 0.05, "other": 0.05}


def tools_of(task) -> list[dict]:
    return [{"type": "function", "function": {"name": f["name"].replace(".", "_"), "description": f["description"],
                                              "parameters": dict(f["parameters"], type="object")}}
            for f in task.functions]


def ask_all(url: str, tasks, run: int) -> None:
    with loopback.client(timeout=20) as client:
        for t in tasks:
            r = client.post(url + "/v1/chat/completions", headers={"x-nf-task": t.task_id, "x-nf-replicate": str(run),
                                                                   "x-nf-session": f"{url}-{run}-{t.task_id}"},
                            json={"model": "m", "temperature": 0, "tools": tools_of(t),
                                  "messages": [{"role": "user", "content": t.question[-1][-1]["content"]}]})
            assert r.status_code == 200


@needs_bfcl
def test_taxonomy_shares_and_floors_through_the_proxy(tmp_path, proxies):
    from noisefloor.verifier.datasets import load_bfcl

    tasks = load_bfcl("multiple")[:60] + load_bfcl("parallel")[:60]
    provider = ToolProvider(builtin_suite(), seed=9, tool_tasks=tasks, tool_shares=SHARES).start()
    store = tmp_path / "log.lmdb"
    try:
        for arm in ("", "compact_user_request", "call_only_suffix"):
            extra = ["--perturb", arm] if arm else []
            p = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", provider.url,
                              "--condition", "builtin-tools", *extra)
            proxies.append(p)
            for run in range(2 if not arm else 1):
                ask_all(p.url, tasks, run)
            p.stop()
    finally:
        provider.stop()
    with Store.open(store, write=False) as s:
        stamped = Counter(ex.perturbation for ex in s.exchanges())
    assert stamped == Counter({None: 240, "compact_user_request": 120, "call_only_suffix": 120})
    out = tmp_path / "outcomes.jsonl"
    r = subprocess.run([str(Path(sys.executable).with_name("nfverify")), "bfcl", str(store), "--outcomes", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    main = [row for row in rows if not row.get("variant")]
    got = Counter(row["failure"] for row in main)
    for outcome, share in SHARES.items():
        assert got[outcome] / len(main) == pytest.approx(share, abs=0.07), (outcome, got)
    an = subprocess.run([str(Path(sys.executable).with_name("nfanalyze")), "--outcomes", str(out), "--json", "-",
                         "--bootstrap", "200"], capture_output=True, text=True, timeout=300)
    assert an.returncode == 0, an.stderr
    floors = json.loads(an.stdout)["floors"]["builtin-tools"]
    assert floors["instances"] == 120 and floors["rerun"]["runs"] == 2
    assert floors["taxonomy"]["malformed_share"] == pytest.approx(got["malformed_output"] / (len(main) - got["correct"]))
    (pair,) = floors["perturbation"]["pairs"]
    assert {pair["left"], pair["right"]} == {"compact_user_request", "call_only_suffix"} and pair["matched"] == 120


def test_perturbation_variants_from_a_file_and_bad_names(tmp_path):  # needs no data: runs always
    spec = tmp_path / "variants.json"
    spec.write_text(json.dumps({"polite": {"prefix": "Please: "}, "quoted": {"template": "\"{text}\""}}))
    variants = perturb.load_variants(spec)
    doc = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    assert perturb.apply(doc, variants["quoted"])["contents"][0]["parts"][0]["text"] == '"hi"'
    assert perturb.apply({"input": "x"}, variants["polite"]) == {"input": "Please: x"}
    assert perturb.apply({"messages": [{"role": "assistant", "content": "a"}]}, variants["polite"]) is None
    with pytest.raises(perturb.PerturbError, match="unknown perturbation"):
        perturb.pick("shouting", variants)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"x": {"template": "no placeholder"}}))
    with pytest.raises(perturb.PerturbError, match="must contain"):
        perturb.load_variants(bad)
