"""The seeds' four designs as sets of conditions (`conditions.py`) with their own few settings.

- ladder (the generation ladder, the default): the rungs of `conditions.ladder_conditions` (live at
  the agent's own sampling, t0 with the proxy imposing temperature 0, replay answering strictly
  from one recorded replicate, and any other declared there);
- judge (seed 000 §3.1, §5.3, App. D): one frozen candidate per task, judged R times at T=0.7 and R
  times at T=0 through the proxy; the reference is the candidate's executed outcome;
- audit (seed 003): BFCL tasks by native tool calling, a main arm at T=0 x 10 and named prompt
  perturbations x 5, graded by nfverify's BFCL checker, reported as floors;
- gate (seed 004): two baseline collections and a candidate collection at k=8, inconclusive cases
  re-run to k=16;
- compare (seed 000 Prop. 1, App. A.4, Eq. 2): a baseline agent recorded R times per task, the
  candidate strictly replayed against each recorded run; coupled tasks give a paired contrast
  conditional on the recording, tasks whose coupling broke are generated fresh for the candidate
  (independent streams).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from noisefloor.ladder.conditions import (
    LADDER_DEFAULT,
    LADDER_NAMES,
    Condition,
    ConditionError,
    Override,
    Registry,
    ladder_conditions,
)
from noisefloor.ladder.runner import parse_agent

DESIGNS = ("ladder", "judge", "audit", "gate", "compare")
PERTURBATIONS = ("compact_user_request", "tool_instruction_prefix", "request_label_wrap", "call_only_suffix")
JUDGE_VERSION = "nf-judge-prompt-1"  # the judge prompt and reply parser; part of a judge row's stamp
BFCL_GRADER = "nfverify-bfcl-ast-1"
CANDIDATE_MARK_ENV = "NF_AGENT_PROMPT_SUFFIX"  # the built-in agent appends this to its prompt


@dataclass(frozen=True)
class Design:
    name: str
    conditions: Registry
    replicates: int  # default for conditions that do not set their own
    settings: Mapping[str, Any] = field(default_factory=dict)


def ladder(replicates: int = 5, names: Sequence[str] = LADDER_DEFAULT,
           replay_source: tuple[str, int] = ("t0", 0), grader: str | None = None) -> Design:
    """The conditions `names` of `conditions.ladder_conditions`, in its order."""
    unknown = [n for n in names if n not in LADDER_NAMES]
    if unknown:
        raise ConditionError(f"unknown ladder condition {unknown[0]!r}; choose from {', '.join(LADDER_NAMES)}")
    chosen = [c for c in ladder_conditions(replay_source, grader) if c.name in names]
    return Design("ladder", Registry(tuple(chosen)), replicates, {"replay_source": list(replay_source)})


def judge(repeats: int = 20, temperatures: Sequence[float] = (0.7, 0.0), max_tokens: int = 200,
          samples: str | None = None) -> Design:
    """A generation condition that freezes one candidate per task (skipped with `samples`, an
    EvalPlus samples file), then one judge condition per temperature."""
    conds: list[Condition] = []
    if samples is None:
        conds.append(Condition("candidates", replicates=1, rank=0))
    for i, t in enumerate(temperatures):
        conds.append(Condition(f"judge-t{t:g}", role="judge", overrides=(Override("/temperature", float(t)),),
                               replicates=repeats, rank=1 + i, grader_version=JUDGE_VERSION,
                               agent=tuple(parse_agent("judge"))))
    return Design("judge", Registry(tuple(conds)), repeats,
                  {"temperatures": list(temperatures), "repeats": repeats, "max_tokens": max_tokens,
                   "samples": samples, "judge_version": JUDGE_VERSION})


def audit(endpoint: str = "builtin-tools", main_runs: int = 10, perturbed_runs: int = 5,
          variants: Sequence[str] = PERTURBATIONS, per_category: int = 20, temperature: float = 0.0,
          categories: Sequence[str] = ("multiple", "parallel")) -> Design:
    t = (Override("/temperature", temperature),)
    conds = [Condition("main", overrides=t, replicates=main_runs, rank=0, endpoint=endpoint, grader_version=BFCL_GRADER)]
    for i, v in enumerate(variants):
        conds.append(Condition(v, overrides=t, variant=v, replicates=perturbed_runs, rank=1 + i, endpoint=endpoint,
                               grader_version=BFCL_GRADER))
    return Design("audit", Registry(tuple(conds)), main_runs,
                  {"endpoint": endpoint, "per_category": per_category, "categories": list(categories),
                   "variants": list(variants), "grader": BFCL_GRADER})


def gate(k: int = 8, escalate_at: int = 16, candidate_env: Mapping[str, str] | None = None,
         candidate_overrides: Sequence[Override] = (), candidate_agent: Sequence[str] | None = None,
         grader: str | None = None) -> Design:
    """Baselines A and B are the same agent twice; the candidate differs by agent command,
    environment or proxy overrides (not by a stamped field: those make the runs incomparable)."""
    stamped = [o.pointer for o in candidate_overrides if o.pointer in ("/model", "/temperature", "/top_p", "/seed")]
    if stamped:
        raise ConditionError(f"gate: the candidate overrides {stamped[0]}, which is part of the stamp; the gate "
                             "refuses runs whose stamps differ, so change the agent or an unstamped field instead")
    conds = (Condition("base_a", replicates=k, rank=0, grader_version=grader),
             Condition("base_b", replicates=k, rank=1, grader_version=grader),
             Condition("candidate", replicates=k, rank=2, env=tuple(sorted((candidate_env or {}).items())),
                       overrides=tuple(candidate_overrides), agent=tuple(candidate_agent) if candidate_agent else None,
                       grader_version=grader))
    return Design("gate", Registry(conds), k, {"k": k, "escalate_at": escalate_at})


COMPARE_BASELINE = "baseline"
COMPARE_REPLAY = "candidate"  # B replayed against each of A's recorded runs
COMPARE_FRESH = "candidate_fresh"  # B generated anew, on the tasks whose coupling broke


def compare(replicates: int = 5, candidate_env: Mapping[str, str] | None = None,
            candidate_overrides: Sequence[Override] = (), candidate_agent: Sequence[str] | None = None,
            grader: str | None = None, baseline: str = COMPARE_BASELINE) -> Design:
    """A (`baseline`, recorded live R times: or an earlier condition of that name in --out, reused),
    B replayed strictly against each recorded replicate of A, and B generated fresh R times (run
    only on tasks whose coupling broke). B differs by agent command, environment or unstamped
    proxy overrides, as in the gate."""
    stamped = [o.pointer for o in candidate_overrides if o.pointer in ("/model", "/temperature", "/top_p", "/seed")]
    if stamped:
        raise ConditionError(f"compare: the candidate overrides {stamped[0]}, which is part of the stamp: a sampling "
                             "change is not a change to the agent; change the agent or an unstamped field instead")
    if baseline in (COMPARE_REPLAY, COMPARE_FRESH):
        raise ConditionError(f"compare: the baseline cannot be named {baseline!r} (the candidate's conditions are)")
    env = tuple(sorted((candidate_env or {}).items()))
    agent = tuple(candidate_agent) if candidate_agent else None
    conds = (Condition(baseline, replicates=replicates, rank=0, grader_version=grader),
             Condition(COMPARE_REPLAY, proxy="replay", replay_from=(baseline, 0), replay_each=True, rank=1,
                       replicates=replicates, env=env, overrides=tuple(candidate_overrides), agent=agent,
                       grader_version=grader),
             Condition(COMPARE_FRESH, replicates=replicates, rank=2, env=env, overrides=tuple(candidate_overrides),
                       agent=agent, grader_version=grader))
    return Design("compare", Registry(conds), replicates, {"replicates": replicates, "baseline": baseline})
