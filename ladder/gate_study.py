"""The gate design's verdicts (seed 004), through nfanalyze's own gate functions: each collection
is written as the run file `nfanalyze gate` reads (OUT/gate/NAME.jsonl), loaded and stamped the
way it loads them, so the command line and the design agree by construction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from noisefloor.analyzer import gate as g
from noisefloor.ladder.runner import Config
from noisefloor.outcome_rows import OutcomeRow, write_jsonl

COLLECTIONS = ("base_a", "base_b", "candidate")


@dataclass(frozen=True)
class GateOutcome:
    verdicts: tuple[g.CaseVerdict, ...]
    oc: g.OperatingCharacteristics | None
    stamps: dict[str, str]  # collection -> stamp description
    refused: str | None  # why the stamps were refused, None when comparable
    escalated: tuple[str, ...]  # cases re-run to k=escalate_at
    settings: g.GateSettings

    def to_json(self) -> dict[str, Any]:
        counts = {k: sum(v.verdict == k for v in self.verdicts)
                  for k in ("within_noise", "inconclusive", "regressed", "quarantine")}
        return {"stamps": self.stamps, "refused": self.refused, "escalated": list(self.escalated),
                "counts": counts, "verdicts": [asdict(v) for v in self.verdicts],
                "operating_characteristics": asdict(self.oc) if self.oc else None,
                "settings": asdict(self.settings)}


def verdicts(cfg: Config, rows: Sequence[OutcomeRow], escalate_at: int, escalated: Sequence[str] = ()) -> GateOutcome:
    folder = cfg.out / "gate"
    folder.mkdir(parents=True, exist_ok=True)
    runs = {}
    for name in COLLECTIONS:
        path = folder / f"{name}.jsonl"
        write_jsonl([r for r in rows if r.condition == name], path)
        runs[name] = g.load_run(path)
    settings = g.GateSettings(escalate_at=escalate_at)
    stamps = {n: r.description for n, r in runs.items()}
    missing = [f"{n} ({r.missing})" for n, r in runs.items() if r.missing]
    refused = None
    if missing:
        refused = "unstamped runs: " + "; ".join(missing)
    elif len({r.stamp for r in runs.values()}) != 1:
        refused = "runs with different stamps: " + "; ".join(f"{n}: {d}" for n, d in stamps.items())
    if refused:
        return GateOutcome((), None, stamps, refused, tuple(escalated), settings)
    a, b, c = (runs[n].counts for n in COLLECTIONS)
    vs = g.gate(a, b, c, settings)
    oc = g.operating_characteristics(a, b, c, settings)
    return GateOutcome(tuple(vs), oc, stamps, None, tuple(escalated), settings)


def truth(builtin: Any, cfg: Config, out: GateOutcome) -> dict[str, Any]:
    """The built-in provider's true pass rates for the baseline and the candidate, per case."""
    temp = cfg.conditions["base_a"].stamp.temperature
    from noisefloor.ladder.provider import LIVE_T

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


def table(out: GateOutcome, truth_doc: dict[str, Any] | None = None) -> str:
    if out.refused:
        return f"Gate: REFUSED ({out.refused})"
    cases = (truth_doc or {}).get("cases", {})
    lines = [f"Gate (seed 004): baselines A and B and the candidate at k=8, inconclusive cases re-run to "
             f"k={out.settings.escalate_at} ({len(out.escalated)} re-run: {', '.join(out.escalated) or 'none'})",
             "case        verdict       base A   base B   candidate  floor" + ("   true base -> candidate" if cases else "")]
    for v in out.verdicts:
        line = (f"{v.case_id:<11} {v.verdict:<13} {v.base_a.passes:>2}/{v.base_a.n:<5} {v.base_b.passes:>2}/{v.base_b.n:<5} "
                f"{v.candidate.passes:>2}/{v.candidate.n:<8} {v.floor:.3f}")
        if v.case_id in cases:
            t = cases[v.case_id]
            line += f"   {t['base_rate']:.2f} -> {t['candidate_rate']:.2f}" + ("  (regressed)" if t["regressed"] else "")
        lines.append(line)
    counts = {k: sum(v.verdict == k for v in out.verdicts) for k in ("within_noise", "inconclusive", "regressed", "quarantine")}
    lines.append("gate: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    if out.oc is not None:
        lines.append(f"operating characteristics (an unchanged model at each case's pooled baseline rate): the suite "
                     f"blocks with probability {out.oc.suite_false_block:.3f} ({out.oc.suite_false_block_escalated:.3f} "
                     f"with inconclusive cases re-run at k={out.settings.escalate_at})")
    if truth_doc:
        lines.append(f"Known truth: {len(truth_doc['truly_regressed'])} cases truly regressed "
                     f"({', '.join(truth_doc['truly_regressed']) or 'none'}); caught {len(truth_doc['caught'])}; "
                     f"false blocks {len(truth_doc['false_blocks'])}")
    return "\n".join(lines)
