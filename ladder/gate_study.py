"""The gate design's verdicts (seed 004), through nfanalyze's own gate section
(`analyzer.gate_run.section`: the stamp checks, then the `GateResult` that `nfanalyze gate`
gives), so `nfanalyze LOG` and the design give the same table. Each collection is also written
as the run file `nfanalyze gate A B C` reads (OUT/gate/NAME.jsonl)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from noisefloor.analyzer import gate as g
from noisefloor.analyzer import gate_run
from noisefloor.ladder.runner import Config
from noisefloor.outcome_rows import OutcomeRow, write_jsonl

COLLECTIONS = g.GATE_CONDITIONS


def verdicts(cfg: Config, rows: Sequence[OutcomeRow], escalate_at: int) -> gate_run.GateSection:
    folder = cfg.out / "gate"
    folder.mkdir(parents=True, exist_ok=True)
    for name in COLLECTIONS:
        write_jsonl([r for r in rows if r.condition == name], folder / f"{name}.jsonl")
    runs = [g.run_of([r for r in rows if r.condition == name]) for name in COLLECTIONS]
    return gate_run.section(runs, COLLECTIONS, g.GateSettings(escalate_at=escalate_at))


def truth(builtin: Any, cfg: Config, out: gate_run.GateSection) -> dict[str, Any]:
    """The built-in provider's true pass rates for the baseline and the candidate, per case."""
    from noisefloor.ladder.provider import LIVE_T

    temp = cfg.conditions["base_a"].stamp.temperature
    t = LIVE_T if temp is None else temp
    cases = {}
    for task in cfg.tasks:
        base = builtin.models[task.task_id].p(t)
        cand = builtin.candidate_models[task.task_id].p(t)
        cases[task.task_id] = {"base_rate": base, "candidate_rate": cand, "regressed": cand < base - 1e-9}
    called = {v.case_id: v.verdict for v in out.verdicts}
    real = {c for c, x in cases.items() if x["regressed"]}
    return {"cases": cases, "truly_regressed": sorted(real),
            "caught": sorted(c for c in real if called.get(c) == "regressed"),
            "false_blocks": sorted(c for c, v in called.items() if v == "regressed" and c not in real)}


def table(out: gate_run.GateSection, truth_doc: Mapping[str, Any] | None = None) -> str:
    if out.refused:
        return f"Gate: REFUSED ({out.refused})"
    cases = (truth_doc or {}).get("cases", {})
    esc = out.escalated
    lines = [f"Gate: baselines A and B and the candidate, inconclusive cases re-run to "
             f"k={out.settings.escalate_at} automatically ({len(esc)} re-run: {', '.join(esc) or 'none'})",
             "case        verdict       base A   base B   candidate  floor" + ("   true base -> candidate" if cases else "")]
    for v in out.verdicts:
        line = (f"{v.case_id:<11} {v.verdict:<13} {v.base_a.passes:>2}/{v.base_a.n:<5} {v.base_b.passes:>2}/{v.base_b.n:<5} "
                f"{v.candidate.passes:>2}/{v.candidate.n:<8} {v.floor:.3f}")
        if v.case_id in cases:
            t = cases[v.case_id]
            line += f"   {t['base_rate']:.2f} -> {t['candidate_rate']:.2f}" + ("  (regressed)" if t["regressed"] else "")
        lines.append(line)
    lines.append("gate: " + ", ".join(f"{n} {k}" for k, n in out.counts().items()))
    if out.oc is not None:
        lines.append(f"operating characteristics (an unchanged model at each case's pooled baseline rate): the suite "
                     f"blocks with probability {out.oc.suite_false_block:.3f} ({out.oc.suite_false_block_escalated:.3f} "
                     f"with inconclusive cases re-run at k={out.settings.escalate_at})")
    if truth_doc:
        lines.append(f"Known truth: {len(truth_doc['truly_regressed'])} cases truly regressed "
                     f"({', '.join(truth_doc['truly_regressed']) or 'none'}); caught {len(truth_doc['caught'])}; "
                     f"false blocks {len(truth_doc['false_blocks'])}")
    return "\n".join(lines)
