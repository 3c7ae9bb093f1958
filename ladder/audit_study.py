"""The audit design (seed 003): BFCL-format tasks asked by native tool calling through nfproxy, a
main arm of reruns at fixed settings and a perturbation arm of named prompt rewordings, graded by
nfverify's BFCL checker (its public `grade_response`), reported as nfanalyze's floors."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import combinations
from pathlib import Path
from statistics import median
from typing import Any

from noisefloor.analyzer import audit as audit_mod
from noisefloor.analyzer import floors_report, report_doc
from noisefloor.display import md as md_text
from noisefloor.ladder import pipeline
from noisefloor.ladder.designs import Design
from noisefloor.ladder.executors import Executor
from noisefloor.ladder.runner import Config, LadderError, unanswered
from noisefloor.outcome_rows import OutcomeRow


@dataclass(frozen=True)
class AuditTask:
    task_id: str
    prompt: str  # the question's last user turn
    tool: Any  # the verifier's ToolTask
    entry_point: str = ""

    def tools(self) -> list[dict[str, Any]]:
        """The task's functions in the OpenAI tool schema (dots are not allowed in OpenAI names)."""
        return [{"type": "function", "function": {"name": f["name"].replace(".", "_"),
                                                  "description": f.get("description", ""),
                                                  "parameters": dict(f.get("parameters") or {}, type="object")}}
                for f in self.tool.functions]


def audit_tasks(folder: Path | None, categories: str, per_category: int) -> tuple[list[AuditTask], Path, str]:
    """The frozen study set: the first N tasks of each category (published files, or the user's)."""
    from noisefloor.verifier.datasets import load_bfcl, shared_data

    out = []
    for cat in (c.strip() for c in categories.split(",") if c.strip()):
        for t in load_bfcl(cat, folder)[:per_category]:
            out.append(AuditTask(t.task_id, t.question[-1][-1]["content"], t))
    base = folder or shared_data() / "bfcl"
    return out, base / "BFCL_v4_multiple.json", "bfcl"


def run_audit(cfg: Config, design: Design, builtin: Any | None, executor: Executor,
              say: Callable[[str], None]) -> pipeline.LadderResult:
    from noisefloor.verifier.bfcl import TaskGrader
    from noisefloor.verifier.rows import with_verdict

    ladder = pipeline.start(cfg, executor, builtin, say)
    extra = {t.task_id: json.dumps({"tools": t.tools()}) for t in cfg.tasks}
    for cond in cfg.conditions:
        say(f"[{cond.name}] {cfg.replicates_of(cond)} runs x {len(cfg.tasks)} tasks"
            + (f" (perturbation {cond.variant})" if cond.variant else " (main arm)"))
        ladder.run_condition(cond, extra=extra)
    if builtin is not None:
        builtin.stop()
    say("grading tool calls (BFCL AST checker)")
    graders = {t.task_id: TaskGrader(t.tool) for t in cfg.tasks}
    found = ladder.candidates()
    rows: list[OutcomeRow] = []
    for session, att in ladder.study_attempts():
        cand = found.get(session)
        base = ladder.base_row(session, att, cand)
        if cand is None or cand.body is None:
            rows.append(unanswered(base, att))
            continue
        rows.append(with_verdict(base, graders[att.task_id].grade_response(cand.body)))
    pipeline.keep_rows(ladder, rows)
    say("analyzing")
    audits = audit_mod.audit(rows, seed=cfg.seed, resamples=cfg.bootstrap)
    main = audit_mod.main_arm(rows)
    if not main:
        raise LadderError("the audit has no main-arm rows; declare a condition without a perturbation variant")
    result, parts, drifted = pipeline.analysis_doc(cfg, design, ladder, rows, analyzed=main)
    floors = floors_report.to_json(audits)
    known = truth(builtin, cfg, floors) if builtin is not None else None
    parts = replace(parts, floors=floors, floor_notes=report_doc.floor_notes(audits), truth=known)
    text = floors_report.table(audits)
    if known:
        text += "\n" + truth_line(known)
    md = "\n".join(floors_report.markdown(audits, "Floors")) + ("\n\n" + md_text(truth_line(known)) if known else "")
    doc = pipeline.write_reports(cfg, result, parts, rows, [text], [md], plot=False)
    return pipeline.LadderResult(result, doc, drifted, [], False, [text])


def truth(builtin: Any, cfg: Config, floors: dict[str, Any]) -> dict[str, Any]:
    """The provider's true per-unit rerun and perturbation SDs and their multiple (expectations
    under its known answer probabilities; the rewordings are the ones the proxy sends)."""
    from noisefloor.proxy.request import perturb

    variants = perturb.load_variants(cfg.perturb_file)
    main = next((c for c in cfg.conditions if not cfg.conditions.keying(c).variant), None)
    temp = (main.stamp.temperature if main else 0.0) or 0.0
    q_main, q_var = [], {}
    for t in cfg.tasks:
        q_main.append(builtin.tool_right_probability(t.tool, t.prompt, temp))
    for c in cfg.conditions:
        v = cfg.conditions.keying(c).variant
        if v:
            rewrite = variants[v]
            q_var[v] = [builtin.tool_right_probability(t.tool, rewrite(t.prompt), temp) for t in cfg.tasks]
    rerun_var = sum(2 * q * (1 - q) for q in q_main) / len(q_main)
    sds = []
    for a, b in combinations(sorted(q_var), 2):
        d = [qa * (1 - qb) + qb * (1 - qa) for qa, qb in zip(q_var[a], q_var[b])]
        mean = sum(qa - qb for qa, qb in zip(q_var[a], q_var[b])) / len(d)
        sds.append(math.sqrt(max(sum(d) / len(d) - mean * mean, 0.0)))
    rerun_sd = math.sqrt(rerun_var)
    per_unit = median(sds) if sds else None
    measured = {e: (f.get("perturbation") or {}).get("multiple_unit_scale") for e, f in floors.items()}
    return {"rerun_unit_sd": rerun_sd, "perturbation_unit_sd": per_unit,
            "multiple_unit_scale": (per_unit / rerun_sd) if per_unit is not None and rerun_sd > 0 else None,
            "measured_multiple_unit_scale": measured,
            "flip_tasks": sum(1 for q in q_main if 0 < q < 1), "tasks": len(q_main)}


def truth_line(t: dict[str, Any]) -> str:
    mult = t["multiple_unit_scale"]
    measured = ", ".join(f"{e} {m:.2f}x" for e, m in t["measured_multiple_unit_scale"].items() if m is not None)
    return (f"Known truth (built-in provider): {t['flip_tasks']}/{t['tasks']} tasks flip on rerun; per-unit rerun SD "
            f"{t['rerun_unit_sd']:.4f}, per-unit perturbation SD {t['perturbation_unit_sd'] or 0:.4f}: multiple "
            f"{mult:.2f}x" if mult is not None else "Known truth: no rerun flips, the multiple is unbounded") + (
            f" (measured {measured})" if measured else "")
