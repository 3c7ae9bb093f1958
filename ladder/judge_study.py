"""The judge design: freeze one candidate per task, execute it for
the reference, ask a judge R times per temperature through nfproxy (so the judge study is itself
recorded and replays), parse every reply, analyze verdict variance and agreement.

Replies are parsed leniently (a verdict word near the start, a confidence anywhere); a reply with
no verdict is kept in the log, counted per condition and left out of the verdict rows, never
read as a rejection (a judge run that loses most of its verdicts to truncation would otherwise
look like a harsh judge).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from noisefloor import outputs
from noisefloor.ladder import pipeline
from noisefloor.ladder.designs import Design
from noisefloor.ladder.executors import Executor
from noisefloor.ladder.runner import Config, LadderError
from noisefloor.outcome_rows import OutcomeRow

PASS_WORDS = ("pass", "correct", "yes", "accept", "true")
FAIL_WORDS = ("fail", "incorrect", "wrong", "no", "reject", "false")
_VERDICT = re.compile(r"verdict\s*[:=\-]?\s*\**\s*([a-z]+)", re.I)
_FIRST_WORD = re.compile(r"^[\W_]*([a-z]+)", re.I)
_CONF = re.compile(r"confidence\s*[:=\-]?\s*\**\s*([0-9]*\.?[0-9]+)\s*(%?)", re.I)


def judge_prompt(task_prompt: str, code: str, examples: Sequence[str]) -> str:
    """The task, the frozen candidate and the original example checks; verdict first, then confidence."""
    from noisefloor.ladder.provider import JUDGE_MARK

    checks = "\n".join(examples) if examples else "(the examples in the task's docstring)"
    return (f"You are reviewing a candidate solution to a Python programming task.\n\nTask:\n{task_prompt}\n\n"
            f"Candidate solution:\n```python\n{code}\n```\n\nExample checks the solution must satisfy:\n{checks}\n\n"
            f"Decide whether the candidate is correct on every valid input. {JUDGE_MARK} on the first line, "
            "then CONFIDENCE: a number between 0 and 1 on the second line, then at most two sentences of reasons.")


def parse_verdict(text: str) -> tuple[int | None, float | None]:
    """(1 pass / 0 fail / None unparseable, confidence in [0, 1] or None). The verdict is the word
    after "verdict", else the reply's first word; a confidence above 1 is read as a percentage."""
    word = None
    m = _VERDICT.search(text or "")
    if m:
        word = m.group(1).lower()
    else:
        first = _FIRST_WORD.match((text or "").strip())
        word = first.group(1).lower() if first else None
    verdict = 1 if word in PASS_WORDS else 0 if word in FAIL_WORDS else None
    conf = None
    c = _CONF.search(text or "")
    if c:
        value = float(c.group(1)) / (100 if c.group(2) or float(c.group(1)) > 1 else 1)
        conf = value if 0 <= value <= 1 else None
    return verdict, conf


def _examples(task: Any) -> list[str]:
    inputs = getattr(task, "inputs", None)
    if not inputs:
        return []
    return [f"{task.entry_point}({', '.join(repr(a) for a in args)}) must return the right value" for args in inputs[:3]]


def _samples(path: Path, tasks: dict[str, Any]) -> dict[str, str]:
    """task id -> program, the first sample of each task in an EvalPlus samples file."""
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            raise LadderError(f"{path}:{n}: not JSON; a samples file has one JSON object per line") from None
        tid = doc.get("task_id")
        if tid in tasks and tid not in out:
            program = doc.get("solution") or (tasks[tid].prompt + doc["completion"] if "completion" in doc else None)
            if program is None:
                raise LadderError(f"{path}:{n}: a sample needs 'solution' or 'completion'")
            out[tid] = program
    return out


def run_judge(cfg: Config, design: Design, kind: str, builtin: Any | None, executor: Executor,
              say: Callable[[str], None]) -> pipeline.LadderResult:
    ladder = pipeline.start(cfg, executor, builtin, say)
    programs, source = _frozen(cfg, design, ladder, say)
    tasks = [t for t in cfg.tasks if programs.get(t.task_id)]
    if not tasks:
        raise LadderError("no frozen candidate to judge: the generation produced no code; check the agent")
    say(f"executing {len(tasks)} frozen candidates for the reference")
    verdicts = executor.grade(kind, cfg.dataset, cfg.grading,
                              [(t.task_id, f"```python\n{programs[t.task_id]}\n```") for t in tasks])
    reference = {t.task_id: v.outcome for t, v in zip(tasks, verdicts)}
    outputs.write_text(cfg.out / "candidates.jsonl", "".join(
        json.dumps({"task_id": t.task_id, "solution": programs[t.task_id], "reference": reference[t.task_id]}) + "\n"
        for t in tasks))
    prompts = {t.task_id: judge_prompt(t.prompt, programs[t.task_id], _examples(t)) for t in tasks}
    judges = cfg.conditions.of_role("judge")
    env = (("NF_JUDGE_MAX_TOKENS", str(design.settings.get("max_tokens", 400))),)
    for cond in judges:
        say(f"[{cond.name}] {cfg.replicates_of(cond)} verdicts x {len(tasks)} candidates")
        ladder.run_condition(replace(cond, env=cond.env + env), tasks=tasks, prompts=prompts)
    if builtin is not None:
        builtin.stop()
    rows, parse = _verdict_rows(ladder, judges, reference)
    pipeline.keep_rows(ladder, rows)
    say("analyzing")
    result, parts, drifted = pipeline.analysis_doc(cfg, design, ladder, rows)
    known = truth(builtin, cfg, tasks, programs, reference, result) if builtin is not None else None
    parts = replace(parts, judge_parse={c: dict(n) for c, n in parse.items()}, truth=known,
                    study_settings={**(parts.study_settings or {}), "candidates_from": source})
    text = table(result, parts.judge_parse or {}, known, source)
    doc = pipeline.write_reports(cfg, result, parts, rows, [text], plot=False)
    return pipeline.LadderResult(result, doc, drifted, [], False, [text])


def _frozen(cfg: Config, design: Design, ladder: Any, say: Callable[[str], None]) -> tuple[dict[str, str], str]:
    """task id -> the program judged, and where the programs came from: a samples file, or one
    recorded generation per task (the `candidates` condition, replicate 0)."""
    from noisefloor.verifier.candidates import response_text
    from noisefloor.verifier.extract import extract_code

    by_id = {t.task_id: t for t in cfg.tasks}
    if design.settings.get("samples"):
        return _samples(Path(design.settings["samples"]), by_id), f"samples file {design.settings['samples']}"
    gen = cfg.conditions["candidates"]
    say(f"[{gen.name}] freezing one candidate per task ({len(cfg.tasks)} tasks)")
    ladder.run_condition(gen)
    found = ladder.candidates({gen.name})
    programs = {}
    for session, att in ladder.study_attempts({gen.name}):
        cand = found.get(session)
        if cand is not None and cand.body is not None:
            programs[att.task_id] = extract_code(response_text(cand.body), by_id[att.task_id].entry_point)
    return programs, f"the recorded {gen.name} condition (replicate 0)"


def _verdict_rows(ladder: Any, judges: Sequence[Any], reference: dict[str, int]
                  ) -> tuple[list[OutcomeRow], dict[str, Counter[str]]]:
    """A row per parsed verdict, and per judge condition the replies parsed, unparseable and missing."""
    from noisefloor.verifier.candidates import response_text

    names = {c.name for c in judges}
    found = ladder.candidates(names)
    rows: list[OutcomeRow] = []
    parse: dict[str, Counter[str]] = {c.name: Counter() for c in judges}
    for session, att in ladder.study_attempts(names):
        cand = found.get(session)
        if cand is None or cand.body is None:
            parse[att.condition]["no_answer"] += 1
            continue
        verdict, conf = parse_verdict(response_text(cand.body))
        if verdict is None:
            parse[att.condition]["unparseable"] += 1
            continue
        parse[att.condition]["parsed"] += 1
        base = ladder.base_row(session, att, cand)
        rows.append(replace(base, outcome=verdict, reference=reference[att.task_id], confidence=conf))
    return rows, parse


def truth(builtin: Any, cfg: Config, tasks: Sequence[Any], programs: dict[str, str], reference: dict[str, int],
          result: Any) -> dict[str, Any]:
    """Per judge condition: the true verdict variance and the true disagreement of the majority
    verdict with the executed reference (exact binomial at the analyzed repeats; a tie counts as
    a disagreement, as the analyzer counts it)."""
    from scipy import stats  # here, not at import: every nfladder start would pay for scipy.stats

    out: dict[str, Any] = {"judge": {}}
    for cond in cfg.conditions.of_role("judge"):
        c = next((x for x in result.conditions if x.name == cond.name), None)
        if c is None:
            continue
        temp = cond.stamp.temperature or 0.0
        r = c.stats.replicates
        ws, dis, disagree_set = [], [], []
        for t in tasks:
            right = builtin.candidate_is_right(t, programs[t.task_id])
            p = builtin.judges[t.task_id].p_accept(bool(right) if right is not None else reference[t.task_id] == 1, temp)
            ws.append(p * (1 - p))
            ref = reference[t.task_id]
            # P(majority disagrees): majority accept when > r/2 accepts; tie when exactly r/2
            p_major_accept = 1 - stats.binom.cdf(math.floor(r / 2), r, p)
            p_tie = stats.binom.pmf(r // 2, r, p) if r % 2 == 0 else 0.0
            d = p_tie + (p_major_accept if ref == 0 else 1 - p_major_accept - p_tie)
            dis.append(float(d))
            if temp <= 0 and d > 0.5:
                disagree_set.append(t.task_id)
        j = result.judge.get(cond.name)
        value = sum(dis) / len(dis)
        out["judge"][cond.name] = {
            "true_verdict_variance": sum(ws) / len(ws), "measured_verdict_variance": c.stats.w,
            "true_disagreement": value, "measured_disagreement": j.disagreement if j else None,
            "disagreement_ci": list(j.disagreement_ci) if j else None,
            "covered": bool(j and j.disagreement_ci[0] - 1e-12 <= value <= j.disagreement_ci[1] + 1e-12),
            "disagreement_set": disagree_set if temp <= 0 else None, "repeats": r}
    return out


def table(result: Any, parse: dict[str, dict[str, int]], truth_doc: dict[str, Any] | None, source: str) -> str:
    lines = [f"Judge study: candidates frozen from {source}; reference = executed outcome"]
    truths = (truth_doc or {}).get("judge", {})
    for c in result.conditions:
        j = result.judge.get(c.name)
        if j is None:
            continue
        n = parse.get(c.name, {})
        w_ci = "[no interval: one task]" if c.w_ci is None else f"[{c.w_ci[0]:.5f}, {c.w_ci[1]:.5f}]"
        trimmed = (f" on the first {c.stats.replicates} verdicts of each task (tasks had {c.trimmed_from[0]} to "
                   f"{c.trimmed_from[1]})" if c.trimmed_from else "")
        line = (f"  {c.name}: verdict variance w {c.stats.w:.5f} {w_ci}{trimmed}; majority vs "
                f"reference disagreement {j.disagreement:.3f} [{j.disagreement_ci[0]:.3f}, {j.disagreement_ci[1]:.3f}] "
                f"({j.false_accepts} false accepts, {j.false_rejects} false rejects, {j.ties} ties); replies "
                f"parsed {n.get('parsed', 0)}, unparseable {n.get('unparseable', 0)} (kept in the log, counted, not "
                f"read as verdicts), no answer {n.get('no_answer', 0)}")
        t = truths.get(c.name)
        if t:
            line += (f"\n    known truth: verdict variance {t['true_verdict_variance']:.5f}, disagreement "
                     f"{t['true_disagreement']:.3f} ({'inside' if t['covered'] else 'OUTSIDE'} its interval)")
            if t["disagreement_set"] is not None:
                line += f"; the T=0 judge disagrees on {', '.join(t['disagreement_set']) or 'no task'}"
        lines.append(line)
    return "\n".join(lines)
