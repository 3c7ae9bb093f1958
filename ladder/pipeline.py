"""The ladder, end to end, as a function: run every condition through its proxy, grade the
candidates from the log, keep the grades in the log, analyze, write the report files. The CLI
only prints what it returns."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from noisefloor import outputs
from noisefloor.analyzer import report
from noisefloor.analyzer.analysis import Analysis, Settings, analyze
from noisefloor.analyzer.logstats import from_store
from noisefloor.analyzer.outcomes import build
from noisefloor.errors import EXIT_REPLAY_FAILED
from noisefloor.ladder.executors import Executor, LocalExecutor
from noisefloor.ladder.runner import CONDITIONS, Config, Ladder
from noisefloor.outcome_rows import write_jsonl
from noisefloor.proxy.store import Store


@dataclass(frozen=True)
class LadderResult:
    analysis: Analysis
    doc: dict[str, Any]  # report.json
    drifted: dict[str, list[str]]  # condition -> the served models, where more than one
    replay_misses: list[str]  # replay sessions that saw a miss or an order violation
    replay_proxy_failed: bool  # the replay proxy reported errors of its own


def run(cfg: Config, kind: str, builtin: Any | None, say: Callable[[str], None] = lambda s: None) -> LadderResult:
    executor = make_executor(cfg, say)
    try:
        return _run(cfg, kind, builtin, executor, say)
    finally:
        executor.close()


def make_executor(cfg: Config, say: Callable[[str], None]) -> Executor:
    if cfg.executor == "ray":
        from noisefloor.ladder.ray_executor import RayExecutor

        return RayExecutor(cfg.ray_address, cfg.out, say)
    return LocalExecutor(cfg.jobs, cfg.out / "tasks")  # task files beside the log, nothing left in /tmp


def _run(cfg: Config, kind: str, builtin: Any | None, executor: Executor, say: Callable[[str], None]) -> LadderResult:
    ladder = Ladder(cfg, say, executor)
    if builtin is not None:
        builtin.restore(ladder.provider_counts())
    for condition in cfg.conditions:
        say(f"[{condition}] {cfg.replicates} replicates x {len(cfg.tasks)} tasks")
        ladder.run_condition(condition)
    if builtin is not None:
        builtin.stop()
    say("verifying candidates from the log")
    rows = ladder.outcomes(lambda items: executor.grade(kind, cfg.dataset, cfg.grading, items))
    write_jsonl(rows, cfg.out / "outcomes.jsonl")
    with Store.open(ladder.store, write=True) as store:  # the log holds its own grades: `nfanalyze log.lmdb`
        store.put_outcomes([r.to_json() for r in rows])
    say("analyzing")
    data = build(rows)
    result = analyze(data, Settings(resamples=cfg.bootstrap, seed=cfg.seed))
    doc = result.to_json()
    doc["log"] = from_store(ladder.store)
    doc["settings"] |= {"replicates": cfg.replicates, "replay_source": list(cfg.replay_source),
                        "agent": cfg.agent, "upstream": cfg.upstream}
    if builtin is not None:
        doc["truth"] = _truth(builtin, result, cfg)
    drifted = {c: s["models"] for c, s in doc["log"]["conditions"].items() if len(s["models"]) > 1}
    doc["warnings"] = [*doc["warnings"], *(f"condition {c!r}: the served model changed within the study "
                                           f"({', '.join(m)})" for c, m in drifted.items())]
    outputs.write_text(cfg.out / "report.json", json.dumps(doc, indent=2))  # atomic: never half a report
    outputs.write_text(cfg.out / "report.md", report.markdown(result, doc["log"], truth=doc.get("truth")))
    report.plot(result, cfg.out / "ladder.png", doc.get("truth"))
    return LadderResult(result, doc, drifted, ladder.replay_failures(),
                        ladder.proxy_exit.get("replay") == EXIT_REPLAY_FAILED)


def _truth(builtin: Any, result: Any, cfg: Config) -> dict[str, Any]:
    from noisefloor.ladder.provider import LIVE_T, true_w  # the built-in provider only

    ids = [t.task_id for t in cfg.tasks]
    temps = {"live": LIVE_T, "t0": 0.0}
    out: dict[str, Any] = {"w": {}}
    for c in result.conditions:
        if c.name in temps:
            w = true_w(builtin.models, temps[c.name], ids)
        elif c.name == "replay":
            w = 0.0
        else:
            continue
        out["w"][c.name] = {"true_w": w, "measured_w": c.stats.w, "w_ci": list(c.w_ci),
                            "covered": c.w_ci[0] - 1e-12 <= w <= c.w_ci[1] + 1e-12}
    ws = {c.name: c.stats.w for c in result.conditions}
    out["order_holds"] = all(k in ws for k in CONDITIONS) and ws["live"] > ws["t0"] > ws["replay"]
    return out
