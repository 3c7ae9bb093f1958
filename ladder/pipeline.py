"""A design, end to end, as a function: run its conditions through their proxies, grade the
candidates from the log, keep the grades in the log, analyze, write the report files. The CLI
only prints what it returns. The ladder and the gate live here; the judge and the audit have
their own modules (`judge_study.py`, `audit_study.py`) built from the same parts."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from noisefloor import outputs
from noisefloor.analyzer import report, report_doc
from noisefloor.analyzer.analysis import Analysis, Settings, analyze
from noisefloor.analyzer.logstats import STUDY_META, from_store
from noisefloor.analyzer.outcomes import build
from noisefloor.analyzer.report_doc import Parts
from noisefloor.display import md_block
from noisefloor.errors import EXIT_REPLAY_FAILED
from noisefloor.ladder import provenance
from noisefloor.ladder.designs import Design
from noisefloor.ladder.executors import Executor, LocalExecutor
from noisefloor.ladder.runner import Config, Ladder
from noisefloor.outcome_rows import OutcomeRow, write_jsonl
from noisefloor.proxy.store.log import Store


@dataclass(frozen=True)
class LadderResult:
    analysis: Analysis
    doc: dict[str, Any]  # report.json
    drifted: dict[str, list[str]]  # "condition / requested model" -> the served models, where more than one
    replay_misses: list[str]  # replay sessions that saw a miss or an order violation
    replay_proxy_failed: bool  # the replay proxy reported errors of its own
    sections: list[str] = field(default_factory=list)  # the design's own report text (judge, floors, gate)
    regressed: bool = False  # gate: a case regressed
    refused: str | None = None  # gate: why the runs' stamps were refused


def run(cfg: Config, design: Design, kind: str, builtin: Any | None,
        say: Callable[[str], None] = lambda s: None) -> LadderResult:
    executor = make_executor(cfg, say)
    try:
        if design.name == "judge":
            from noisefloor.ladder.judge_study import run_judge

            return run_judge(cfg, design, kind, builtin, executor, say)
        if design.name == "audit":
            from noisefloor.ladder.audit_study import run_audit

            return run_audit(cfg, design, builtin, executor, say)
        if design.name == "gate":
            return _run_gate(cfg, design, kind, builtin, executor, say)
        if design.name == "compare":
            from noisefloor.ladder.compare_study import run_compare

            return run_compare(cfg, design, kind, builtin, executor, say)
        return _run_ladder(cfg, design, kind, builtin, executor, say)
    finally:
        executor.close()


def make_executor(cfg: Config, say: Callable[[str], None]) -> Executor:
    if cfg.executor == "ray":
        from noisefloor.ladder.ray_executor import RayExecutor

        return RayExecutor(cfg.ray_address, cfg.out, say)
    return LocalExecutor(cfg.jobs, cfg.out / "tasks")  # task files beside the log, nothing left in /tmp


def start(cfg: Config, executor: Executor, builtin: Any | None, say: Callable[[str], None]) -> Ladder:
    ladder = Ladder(cfg, say, executor)
    if builtin is not None:
        builtin.restore(ladder.provider_counts())
    return ladder


def keep_rows(ladder: Ladder, rows: Sequence[OutcomeRow]) -> None:
    """outcomes.jsonl, and the log holds its own grades: `nfanalyze log.lmdb` alone reproduces the report."""
    write_jsonl(rows, ladder.c.out / "outcomes.jsonl")
    with Store.open(ladder.store, write=True) as store:
        store.outcomes.put([r.to_json() for r in rows])


def drift(served: dict[tuple[str, str], set[str]]) -> dict[str, list[str]]:
    """Served models per (condition, requested model), where one requested model was answered by
    more than one served model (report_doc.drifted's rule)."""
    return report_doc.drifted(served_by_requested(served))


def served_by_requested(served: dict[tuple[str, str], set[str]]) -> dict[str, list[str]]:
    return {f"{c} / {m}": sorted(s) for (c, m), s in sorted(served.items())}


def analysis_doc(cfg: Config, design: Design, ladder: Ladder, rows: Sequence[OutcomeRow],
                 analyzed: Sequence[OutcomeRow] | None = None) -> tuple[Analysis, Parts, dict[str, list[str]]]:
    """The analysis of the graded rows (or of `analyzed`, a design's main arm), the report's parts
    so far, and the drift the log shows."""
    data = build(list(analyzed if analyzed is not None else rows))
    result = analyze(data, Settings(resamples=cfg.bootstrap, seed=cfg.seed))
    served = served_by_requested(ladder.served_models())
    study_settings = {"replicates": cfg.replicates, **design.settings, "agent": cfg.agent, "upstream": cfg.upstream,
                      "conditions": cfg.conditions.to_json()}
    parts = Parts(log=from_store(ladder.store), design=design.name, served_by_requested=served,
                  study_settings=study_settings)
    return result, parts, report_doc.drifted(served)


def write_reports(cfg: Config, result: Analysis, parts: Parts, rows: Sequence[OutcomeRow],
                  sections: Sequence[str] = (), md_sections: Sequence[str] | None = None,
                  plot: bool = True) -> dict[str, Any]:
    """report.json (built by report_doc, with the provenance manifest), report.md, the plot; the
    study's parts kept in the log, so `nfanalyze LOG` reports what nfladder did. Returns the report."""
    parts = replace(parts, provenance=provenance.manifest(cfg, rows, report_doc.build(result, parts)))
    doc = report_doc.build(result, parts)
    with Store.open(cfg.out / "log.lmdb", write=True) as store:
        store.set_meta(STUDY_META, parts.kept_meta())
    outputs.write_text(cfg.out / "report.json", json.dumps(doc, indent=2))  # atomic: never half a report
    truth = doc.get("truth") if "w" in doc.get("truth", {}) else None  # the ladder's truth; designs print their own
    own = [*md_sections] if md_sections is not None else [md_block(s) for s in sections]
    if own:  # a design's report opens with its own section; the ladder of its conditions follows
        md = f"# {TITLES.get(cfg.design, cfg.design)}\n\n" + "".join(f"{s}\n\n" for s in own)
        md += report.markdown(result, doc["log"], truth=truth, heading=f"## {LADDER_OF_CONDITIONS}")
    else:
        md = report.markdown(result, doc["log"], truth=truth)
    md += "\n" + provenance.markdown(doc["provenance"]) + "\n"
    outputs.write_text(cfg.out / "report.md", md)
    if plot:
        report.plot(result, cfg.out / "ladder.png", truth)
    return doc


TITLES = {"judge": "Judge study", "audit": "Tool-calling audit", "gate": "Regression gate"}
LADDER_OF_CONDITIONS = "Determinism ladder of the study's conditions"


# -- the ladder --------------------------------------------------------------------------------


def _run_ladder(cfg: Config, design: Design, kind: str, builtin: Any | None, executor: Executor,
                say: Callable[[str], None]) -> LadderResult:
    ladder = start(cfg, executor, builtin, say)
    for cond in cfg.conditions:
        say(f"[{cond.name}] {cfg.replicates_of(cond)} replicates x {len(cfg.tasks)} tasks")
        ladder.run_condition(cond)
    if builtin is not None:
        builtin.stop()
    say("verifying candidates from the log")
    rows = ladder.outcomes(lambda items: executor.grade(kind, cfg.dataset, cfg.grading, items))
    keep_rows(ladder, rows)
    say("analyzing")
    result, parts, drifted = analysis_doc(cfg, design, ladder, rows)
    if builtin is not None:
        parts = replace(parts, truth=_ladder_truth(builtin, result, cfg))
    doc = write_reports(cfg, result, parts, rows, plot=cfg.plot)
    replayed = [c.name for c in cfg.conditions if c.replays]
    return LadderResult(result, doc, drifted, ladder.replay_failures(),
                        any(ladder.proxy_exit.get(n) == EXIT_REPLAY_FAILED for n in replayed))


def true_temperature(cfg: Config, name: str) -> float | None:
    """The temperature the built-in provider saw for a condition; None for a replay (w is 0)."""
    from noisefloor.ladder.provider import LIVE_T  # the built-in agent's own temperature

    cond = cfg.conditions.get(name)
    if cond is None or cond.replays:
        return None
    t = cond.stamp.temperature
    return LIVE_T if t is None else t


def _ladder_truth(builtin: Any, result: Any, cfg: Config) -> dict[str, Any]:
    from noisefloor.ladder.provider import true_w

    ids = [t.task_id for t in cfg.tasks]
    out: dict[str, Any] = {"w": {}}
    for c in result.conditions:
        if cfg.conditions.get(c.name) is None:
            continue
        temp = true_temperature(cfg, c.name)
        w = 0.0 if temp is None else true_w(builtin.models, temp, ids)
        ci = c.w_ci
        out["w"][c.name] = {"true_w": w, "measured_w": c.stats.w, "w_ci": None if ci is None else list(ci),
                            "covered": None if ci is None else ci[0] - 1e-12 <= w <= ci[1] + 1e-12}
    # the ladder's order: more imposed determinism, less variance (by the true values' order)
    ws = {c.name: c.stats.w for c in result.conditions}
    truth_order = sorted(out["w"], key=lambda n: -out["w"][n]["true_w"])
    out["order_holds"] = len(ws) == len(cfg.conditions) and all(
        ws[a] > ws[b] for a, b in zip(truth_order, truth_order[1:]))
    return out


# -- the gate ----------------------------------------------------------------------------------


def _run_gate(cfg: Config, design: Design, kind: str, builtin: Any | None, executor: Executor,
              say: Callable[[str], None]) -> LadderResult:
    from noisefloor.ladder import gate_study

    ladder = start(cfg, executor, builtin, say)
    k, escalate_at = int(design.settings["k"]), int(design.settings["escalate_at"])
    for cond in cfg.conditions:
        say(f"[{cond.name}] k={k} x {len(cfg.tasks)} cases")
        ladder.run_condition(cond)

    def grade(items: list[tuple[str, str]]) -> list[Any]:
        return executor.grade(kind, cfg.dataset, cfg.grading, items)

    say("verifying candidates from the log")
    rows = ladder.outcomes(grade)
    verdicts = gate_study.verdicts(cfg, rows, escalate_at)
    again = [v.case_id for v in verdicts.verdicts if v.verdict == "inconclusive"]
    if again and verdicts.refused is None:
        cand = cfg.conditions["candidate"]
        say(f"[gate] {len(again)} inconclusive cases: re-running the candidate to k={escalate_at}")
        by_id = {t.task_id: t for t in cfg.tasks}
        ladder.run_condition(cand, range(escalate_at), [by_id[c] for c in again])
        rows = [r for r in rows if r.condition != cand.name] + ladder.outcomes(grade, {cand.name})
        verdicts = gate_study.verdicts(cfg, rows, escalate_at)
    if builtin is not None:
        builtin.stop()
    keep_rows(ladder, rows)
    say("analyzing")
    result, parts, drifted = analysis_doc(cfg, design, ladder, rows)
    parts = replace(parts, gate=verdicts.to_json(),
                    truth=gate_study.truth(builtin, cfg, verdicts) if builtin is not None else None)
    text = gate_study.table(verdicts, parts.truth)
    doc = write_reports(cfg, result, parts, rows, [text], plot=False)
    return LadderResult(result, doc, drifted, [], False, [text],
                        regressed=any(v.verdict == "regressed" for v in verdicts.verdicts), refused=verdicts.refused)
