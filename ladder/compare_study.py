"""The compare design: did a change to the agent help, or is it noise?

Order: the baseline A is recorded R times per task (or an earlier recording of it in --out is
reused); the candidate B is strictly replayed against each of A's recorded runs (replicate r
against replicate r); each task gets a coupling verdict (`analyzer.coupling`) from the log; the
tasks whose coupling broke are generated fresh for B, R times. Outcomes are graded from what each
agent printed (its final answer): a downstream change shows there, not in the recorded responses.

Reported side by side, never pooled: on coupled tasks the paired contrast B - A conditional on the
recording (task bootstrap); on broken tasks B's fresh runs against A's live runs as independent
streams (seed 000 Eq. 2), with the rerun budget for the planning difference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from noisefloor.analyzer import coupling
from noisefloor.analyzer.intervals import fmt_ci
from noisefloor.analyzer.ladder import Planning
from noisefloor.display import visible
from noisefloor.ladder import pipeline
from noisefloor.ladder.agent_run import session_name
from noisefloor.ladder.designs import COMPARE_FRESH, COMPARE_REPLAY, Design
from noisefloor.ladder.executors import Executor
from noisefloor.ladder.runner import Config, Ladder, LadderError, unanswered
from noisefloor.outcome_rows import OutcomeRow
from noisefloor.verifier.rows import Pending, grade_pending

DEMO_CHANGED = 4  # the built-in candidate's downstream change: on this many tasks


@dataclass(frozen=True)
class Step:
    """One request of a run, as the log holds it."""

    exchange_id: int
    key: str
    result: str  # record: "recorded"; replay: hit / miss / order_violation


def run_compare(cfg: Config, design: Design, kind: str, builtin: Any | None, executor: Executor,
                say: Callable[[str], None]) -> pipeline.LadderResult:
    base = cfg.conditions[design.settings["baseline"]]
    replayed, fresh = cfg.conditions[COMPARE_REPLAY], cfg.conditions[COMPARE_FRESH]
    r = cfg.replicates_of(base)
    ladder = pipeline.start(cfg, executor, builtin, say)
    say(f"[{base.name}] {r} recorded runs x {len(cfg.tasks)} tasks (A)")
    ladder.run_condition(base)
    say(f"[{replayed.name}] the candidate replayed against each recorded run (B)")
    ladder.run_condition(replayed)
    verdicts = task_couplings(ladder, cfg, base.name, replayed.name, r)
    broken = [t for t in cfg.tasks if not verdicts[t.task_id].coupled]
    if broken:
        say(f"[{fresh.name}] coupling broke on {len(broken)} tasks: the candidate generated fresh there")
        ladder.run_condition(fresh, tasks=broken)
    if builtin is not None:
        builtin.stop()
    say("verifying what each agent printed")
    rows = graded_outputs(ladder, lambda items: executor.grade(kind, cfg.dataset, cfg.grading, items),
                          {base.name, replayed.name, fresh.name})
    pipeline.keep_rows(ladder, rows)
    say("analyzing")
    result = contrasts(cfg, rows, verdicts, base.name, r)
    baseline_rows = [x for x in rows if x.condition == base.name]
    analysis, parts, drifted = pipeline.analysis_doc(cfg, design, ladder, rows, analyzed=baseline_rows)
    known = truth(builtin, cfg, result) if builtin is not None else None
    doc_part = to_json(result)
    parts = replace(parts, compare=doc_part, truth=known)
    text = table(result, known)
    doc = pipeline.write_reports(cfg, analysis, parts, rows, [text], plot=False)
    return pipeline.LadderResult(analysis, doc, drifted, [], False, [text])


# -- coupling from the log -------------------------------------------------------------------------


def steps_by_session(ladder: Ladder, wanted: set[str]) -> dict[str, list[Step]]:
    """Each wanted session's requests in the order its agent sent them."""
    from noisefloor.proxy.store.log import Store

    found: dict[str, list[tuple[int, int, Step]]] = {s: [] for s in wanted}
    with Store.open(ladder.store, write=False) as store:
        for ex in store.exchanges():
            if ex.session in found:
                result = (ex.replay_result or "miss") if ex.mode == "replay" else "recorded"
                found[ex.session].append((ex.seq, ex.id, Step(ex.id, ex.key, result)))
    return {s: [st for _, _, st in sorted(v)] for s, v in found.items()}


def task_couplings(ladder: Ladder, cfg: Config, base: str, replayed: str, replicates: int,
                   ) -> dict[str, coupling.TaskCoupling]:
    """Every task's coupling verdict: B's run r against A's recorded run r, for each r."""
    names = {session_name(c, r, t.task_id) for t in cfg.tasks for r in range(replicates) for c in (base, replayed)}
    steps = steps_by_session(ladder, names)
    out = {}
    for t in cfg.tasks:
        pairs = []
        for r in range(replicates):
            a, b = steps[session_name(base, r, t.task_id)], steps[session_name(replayed, r, t.task_id)]
            if not a:
                raise LadderError(f"the recording holds no request of {session_name(base, r, t.task_id)}: the "
                                  "baseline agent did not reach the provider there; fix the agent and rerun")
            v = coupling.pair_verdict([s.key for s in a], [s.key for s in b], [s.result for s in b])
            if not v.coupled and v.step is not None and v.step < len(b) and v.step < len(a):
                v = replace(v, path=_first_path(ladder, a[v.step].exchange_id, b[v.step].exchange_id))
            pairs.append(v)
        out[t.task_id] = coupling.TaskCoupling(t.task_id, tuple(pairs))
    return out


def _first_path(ladder: Ladder, recorded_id: int, replayed_id: int) -> str | None:
    """The first JSON pointer where B's request differs from A's at the same step."""
    from noisefloor.proxy.replay.diagnosis import first_difference, recorded_request
    from noisefloor.proxy.request.keys import Rules
    from noisefloor.proxy.store.log import Store

    rules = Rules()  # nfladder's proxies key with the default rules
    with Store.open(ladder.store, write=False) as store:
        a, b = recorded_request(store, rules, recorded_id), recorded_request(store, rules, replayed_id)
    return None if a is None or b is None else first_difference(a.as_dict(), b.as_dict())


# -- outcomes from what the agents printed --------------------------------------------------------


def graded_outputs(ladder: Ladder, grade: Callable[[list[tuple[str, str]]], list[Any]], names: set[str],
                   ) -> list[OutcomeRow]:
    """One row per run of these conditions, graded from the agent's printed answer."""
    found = ladder.candidates(names)
    rows: dict[str, OutcomeRow] = {}
    pending: list[Pending] = []
    for session, att in ladder.study_attempts(names):
        base = ladder.base_row(session, att, found.get(session))
        if att.returncode != 0 or not att.output.strip():
            rows[session] = unanswered(base, att)
        else:
            rows[session] = base
            pending.append(Pending(base, att.output))
    for row in grade_pending(pending, grade):  # type: ignore[arg-type]
        rows[row.session or ""] = row
    return list(rows.values())


# -- the two contrasts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CompareResult:
    couplings: Mapping[str, coupling.TaskCoupling]
    paired: coupling.PairedContrast | None  # coupled tasks
    fresh: coupling.IndependentContrast | None  # broken tasks
    coupled_ids: tuple[str, ...]
    broken_ids: tuple[str, ...]
    replicates: int
    missing: tuple[str, ...] = ()  # broken tasks whose fresh runs are not all there
    baseline: str = "baseline"  # A's condition: run r of B followed A's recorded session of run r


def _matrix(rows: Sequence[OutcomeRow], condition: str, ids: Sequence[str], replicates: int) -> np.ndarray:
    y = np.full((len(ids), replicates), np.nan)
    where = {tid: i for i, tid in enumerate(ids)}
    for row in rows:
        if row.condition == condition and row.task_id in where and 0 <= int(row.replicate) < replicates:
            y[where[row.task_id], int(row.replicate)] = row.outcome
    return y


def contrasts(cfg: Config, rows: Sequence[OutcomeRow], verdicts: Mapping[str, coupling.TaskCoupling], base: str,
              replicates: int) -> CompareResult:
    ids = [t.task_id for t in cfg.tasks]
    coupled = tuple(i for i in ids if verdicts[i].coupled)
    broken = tuple(i for i in ids if not verdicts[i].coupled)
    paired = fresh = None
    if coupled:
        a, b = _matrix(rows, base, coupled, replicates), _matrix(rows, COMPARE_REPLAY, coupled, replicates)
        if np.isnan(a).any() or np.isnan(b).any():
            raise LadderError("a coupled task lacks a graded run of A or B; rerun the same command to finish them")
        paired = coupling.paired_contrast(a, b, cfg.bootstrap, cfg.seed)
    missing: tuple[str, ...] = ()
    if broken:
        a, b = _matrix(rows, base, broken, replicates), _matrix(rows, COMPARE_FRESH, broken, replicates)
        missing = tuple(i for i, ok in zip(broken, ~np.isnan(b).any(axis=1) & ~np.isnan(a).any(axis=1)) if not ok)
        if not missing and replicates >= 2:
            fresh = coupling.independent_contrast(a, b, Planning())
    return CompareResult(verdicts, paired, fresh, coupled, broken, replicates, missing, base)


def to_json(res: CompareResult) -> dict[str, Any]:
    tasks = {}
    for tid, tc in res.couplings.items():
        first = tc.first_broken
        runs = [{"replayed_session": session_name(COMPARE_REPLAY, r, tid),
                 "followed": session_name(res.baseline, r, tid), **asdict(p)} for r, p in enumerate(tc.pairs)]
        entry: dict[str, Any] = {"coupled": tc.coupled, "runs": runs}
        if first is not None:
            entry["diverged"] = {"replicate": first[0], "step": first[1].step, "reason": first[1].reason,
                                 "path": first[1].path, "unreachable": first[1].unreachable,
                                 "recorded_steps": first[1].recorded_steps}
        tasks[tid] = entry
    out: dict[str, Any] = {"replicates": res.replicates, "coupled_tasks": list(res.coupled_ids),
                           "broken_tasks": list(res.broken_ids), "tasks": tasks,
                           "fresh_missing": list(res.missing)}
    if res.paired is not None:
        p = res.paired
        out["paired"] = {"claim": p.claim, "tasks": p.tasks, "replicates": p.replicates, "mean_a": p.mean_a,
                         "mean_b": p.mean_b, "estimate": p.estimate, "ci": p.ci.to_json(), "resamples": p.resamples,
                         "method": "task bootstrap of per-task mean paired differences"}
    if res.fresh is not None:
        f = res.fresh
        out["fresh"] = {"claim": f.claim, "tasks": f.tasks, "replicates": f.replicates_a, "mean_a": f.mean_a,
                        "mean_b": f.mean_b, "estimate": f.estimate, "w_a": f.w_a, "w_b": f.w_b, "se": f.se,
                        "ci": f.ci.to_json(), "delta": f.delta, "budget": f.budget, "mde": f.mde,
                        "method": "independent streams, SE = sqrt((w_A + w_B) / (N R)) (seed 000 Eq. 2)"}
    return out


# -- the built-in candidate and its known truth -----------------------------------------------------


def demo_candidate(task_ids: Sequence[str], seed: int, tasks: Sequence[Any]) -> dict[str, str]:
    """The built-in candidate: its prompt changes on the tasks where the built-in provider answers a
    changed prompt with other pass rates (coupling breaks there), and its downstream code changes
    on DEMO_CHANGED tasks the baseline sometimes passes (coupled, effect: minus that pass rate)."""
    from noisefloor.ladder.designs import CANDIDATE_MARK_ENV
    from noisefloor.ladder.provider import CANDIDATE_MARK, candidate_models, task_models

    models = task_models(list(tasks), seed)
    changed = candidate_models(models)
    prompt = [i for i in task_ids if changed[i] != models[i]]
    cut = [i for i in task_ids if i not in prompt and models[i].q > 0][:DEMO_CHANGED]
    return {CANDIDATE_MARK_ENV: CANDIDATE_MARK, "NF_AGENT_PROMPT_SUFFIX_TASKS": ",".join(prompt),
            "NF_AGENT_CUT_TASKS": ",".join(cut)}


def truth(builtin: Any, cfg: Config, res: CompareResult) -> dict[str, Any]:
    """The built-in candidate's true effects: per coupled task B - A in pass rate (minus A's rate where
    its answer is cut, else 0), per broken task the changed prompt's rate minus A's."""
    from noisefloor.ladder.pipeline import true_temperature

    env = dict(cfg.conditions[COMPARE_REPLAY].env)
    cut = set(filter(None, env.get("NF_AGENT_CUT_TASKS", "").split(",")))
    prompt = set(filter(None, env.get("NF_AGENT_PROMPT_SUFFIX_TASKS", "").split(",")))
    temp = true_temperature(cfg, next(iter(cfg.conditions)).name)
    effects = {}
    for t in cfg.tasks:
        pa = builtin.models[t.task_id].p(temp)
        pb = builtin.candidate_models[t.task_id].p(temp) if t.task_id in prompt else pa
        effects[t.task_id] = {"true_a": pa, "true_b": 0.0 if t.task_id in cut else pb,
                              "change": "downstream" if t.task_id in cut else ("prompt" if t.task_id in prompt else None)}
    out: dict[str, Any] = {"tasks": effects, "prompt_changed": sorted(prompt), "downstream_changed": sorted(cut)}
    for name, ids, est in (("paired", res.coupled_ids, res.paired), ("fresh", res.broken_ids, res.fresh)):
        if ids and est is not None:
            true = float(np.mean([effects[i]["true_b"] - effects[i]["true_a"] for i in ids]))
            out[name] = {"true_effect": true, "covered": est.ci.low - 1e-12 <= true <= est.ci.high + 1e-12}
    out["broken_as_changed"] = sorted(res.broken_ids) == sorted(prompt)
    return out


def table(res: CompareResult, known: Mapping[str, Any] | None = None) -> str:
    lines = [f"Compare: the candidate B replayed against each of the baseline A's {res.replicates} recorded runs "
             f"per task; {len(res.coupled_ids)} tasks coupled, {len(res.broken_ids)} broken"]
    for tid in res.broken_ids:
        first = res.couplings[tid].first_broken
        if first is None:
            continue
        r, v = first
        where = f" at {v.path}" if v.path else ""
        lines.append(f"  broken {visible(tid)}: run {r} (following {visible(session_name(res.baseline, r, tid))}), "
                     f"step {v.step} ({v.reason}){where}; {v.unreachable} of {v.recorded_steps} recorded steps made "
                     "unreachable")
    lines.append("")
    if res.paired is not None:
        p = res.paired
        lines.append(f"coupled tasks ({p.tasks}), paired B - A = {p.estimate:+.4f} 95% CI {fmt_ci(p.ci, '+.4f')} "
                     f"(A {p.mean_a:.4f}, B {p.mean_b:.4f}; task bootstrap, {p.resamples} resamples)")
        lines.append(f"  claim: {p.claim}")
    else:
        lines.append("coupled tasks: none (no paired contrast)")
    if res.fresh is not None:
        f = res.fresh
        lines.append(f"broken tasks ({f.tasks}), fresh B - live A = {f.estimate:+.4f} 95% CI {fmt_ci(f.ci, '+.4f')} "
                     f"(A {f.mean_a:.4f}, B {f.mean_b:.4f}; SE {f.se:.4f} from w_A {f.w_a:.4f}, w_B {f.w_b:.4f}, "
                     f"Eq. 2)")
        lines.append(f"  claim: {f.claim}")
        if f.w_a + f.w_b == 0:
            lines.append("  no run varied in either arm: the zero-width interval describes these runs, it does not "
                         "show that a rerun cannot differ")
        lines.append(f"  budget: {f.budget} runs per arm detect a difference of {f.delta:g} with 80% power "
                     f"(this run's {f.replicates_a} detect {f.mde:.4f})")
    elif res.broken_ids:
        lines.append(f"broken tasks: fresh runs missing for {', '.join(visible(i) for i in res.missing)}: "
                     "rerun the same command")
    else:
        lines.append("broken tasks: none")
    lines.append("The two numbers answer different questions and are not pooled.")
    if known:
        for name in ("paired", "fresh"):
            if name in known:
                k = known[name]
                lines.append(f"Known truth ({name}): effect {k['true_effect']:+.4f}, "
                             f"{'inside' if k['covered'] else 'OUTSIDE'} the interval")
        lines.append(f"Known truth: prompt changed on {', '.join(known['prompt_changed']) or 'none'}; "
                     f"broken tasks {'match' if known['broken_as_changed'] else 'DO NOT match'}")
    return "\n".join(lines)
