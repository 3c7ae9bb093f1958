"""The options every nfladder command that runs a design shares (`design_options`, declared
once for `run` and `demo`), and the Design they describe (`design_from`)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from noisefloor._cli import options
from noisefloor.analyzer.bootstrap import DEFAULT_RESAMPLES
from noisefloor.ladder import designs
from noisefloor.ladder.conditions import LADDER_NAMES, RECORDED, ConditionError, Override, Registry
from noisefloor.ladder.runner import parse_agent

DEFAULT_OUT = Path("nf-ladder")

design_options = options(
    click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_OUT,
                 show_default=True, help="Folder for the log, outcomes, report and plot (reruns resume)."),
    click.option("-j", "--jobs", default=os.cpu_count() or 2, show_default=True, type=click.IntRange(min=1)),
    click.option("--seed", default=0, show_default=True, type=int, help="Provider draws and bootstrap."),
    click.option("--bootstrap", default=DEFAULT_RESAMPLES, show_default=True, type=click.IntRange(min=100)),
    click.option("--design", type=click.Choice(designs.DESIGNS), default="ladder", show_default=True,
                 help="ladder (live, t0, replay), judge (frozen candidates judged at T=0.7 and T=0), audit "
                      "(BFCL tool calling: reruns and prompt perturbations), gate (baselines A, B, candidate), compare "
                      "(the candidate replayed against the baseline's recorded runs; fresh where coupling breaks)."),
    click.option("--judge-repeats", default=20, show_default=True, type=click.IntRange(min=2),
                 help="judge: verdicts per candidate and temperature."),
    click.option("--judge-temperatures", default="0.7,0", show_default=True, help="judge: the judge's temperatures."),
    click.option("--samples", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 help="judge: frozen candidates from an EvalPlus samples file (task_id, solution/completion) "
                      "instead of one recorded generation."),
    click.option("--categories", default="multiple,parallel", show_default=True, help="audit: BFCL categories."),
    click.option("--per-category", default=20, show_default=True, type=click.IntRange(min=1),
                 help="audit: the first N tasks of each category."),
    click.option("--bfcl", "bfcl_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
                 help="audit: folder of BFCL v4 files (default: shared data or the cache)."),
    click.option("--main-runs", default=10, show_default=True, type=click.IntRange(min=2),
                 help="audit: main-arm reruns."),
    click.option("--perturbed-runs", default=5, show_default=True, type=click.IntRange(min=1),
                 help="audit: reruns per perturbation variant."),
    click.option("--variants", default=",".join(designs.PERTURBATIONS), show_default=True,
                 help="audit: perturbation variants (the four named ones, or names from --perturb-file)."),
    click.option("--perturb-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 help="audit: user perturbation variants (JSON; see nfproxy --perturb-file)."),
    click.option("--k", "gate_k", default=8, show_default=True, type=click.IntRange(min=2),
                 help="gate: repeats per case."),
    click.option("--escalate-at", default=16, show_default=True, type=click.IntRange(min=2),
                 help="gate: inconclusive cases are re-run to this many repeats."),
    click.option("--candidate-agent", help="gate, compare: the candidate's agent command (default: the baseline's)."),
    click.option("--candidate-env", multiple=True, metavar="KEY=VALUE",
                 help="gate, compare: environment of the candidate agent."),
    click.option("--candidate-set", multiple=True, metavar="POINTER=VALUE",
                 help="gate, compare: proxy overrides of the candidate (unstamped fields only)."),
    click.option("--baseline", default=designs.COMPARE_BASELINE, show_default=True,
                 help="compare: the condition whose recorded runs are A; runs of it an earlier study recorded in "
                      "--out (nfladder's session names) are reused, not run again."),
)


def design_from(p: dict[str, Any], grader: str, builtin: bool, tasks: Sequence[Any] = ()) -> designs.Design:
    """The Design the parsed options describe; a bad value is a usage error naming its option."""
    name = p["design"]
    if p.get("custom_conditions") is not None:
        if name != "ladder":
            raise click.ClickException(f"[[condition]] tables declare a ladder's conditions; the {name} design "
                                       "builds its own (set its options instead)")
        return designs.Design("ladder", _graded(p["custom_conditions"], grader), p["replicates"], {})
    try:
        if name == "judge":
            temps = tuple(float(t) for t in p["judge_temperatures"].split(",") if t.strip())
            return designs.judge(p["judge_repeats"], temps, samples=str(p["samples"]) if p["samples"] else None)
        if name == "audit":
            return designs.audit(main_runs=p["main_runs"], perturbed_runs=p["perturbed_runs"],
                                 variants=_names(p["variants"]), per_category=p["per_category"],
                                 categories=_names(p["categories"]))
        if name == "gate":
            return _gate(p, grader, builtin)
        if name == "compare":
            return _compare(p, grader, builtin, tasks)
    except (ValueError, ConditionError) as exc:
        raise click.BadParameter(str(exc), param_hint="--design options") from None
    return _ladder(p, grader)


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _gate(p: dict[str, Any], grader: str, builtin: bool) -> designs.Design:
    env = _kv(p["candidate_env"], "--candidate-env")
    if builtin and not env and not p["candidate_agent"] and not p["candidate_set"]:
        from noisefloor.ladder.provider import CANDIDATE_MARK

        env = {designs.CANDIDATE_MARK_ENV: CANDIDATE_MARK}  # the demo's changed agent
    sets = [Override(k, _json(v)) for k, v in _kv(p["candidate_set"], "--candidate-set").items()]
    agent = parse_agent(p["candidate_agent"]) if p["candidate_agent"] else None
    return designs.gate(p["gate_k"], p["escalate_at"], env, sets, agent, grader)


def _compare(p: dict[str, Any], grader: str, builtin: bool, tasks: Sequence[Any]) -> designs.Design:
    env = _kv(p["candidate_env"], "--candidate-env")
    if builtin and not env and not p["candidate_agent"] and not p["candidate_set"]:
        from noisefloor.ladder.compare_study import demo_candidate

        env = demo_candidate([t.task_id for t in tasks], p["seed"], tasks)  # the demo's changed agent
    sets = [Override(k, _json(v)) for k, v in _kv(p["candidate_set"], "--candidate-set").items()]
    agent = parse_agent(p["candidate_agent"]) if p["candidate_agent"] else None
    return designs.compare(p["replicates"], env, sets, agent, grader, p["baseline"])


def _ladder(p: dict[str, Any], grader: str) -> designs.Design:
    conds = _names(p["conditions"])
    unknown = [c for c in conds if c not in LADDER_NAMES]
    if unknown:
        raise click.BadParameter(f"unknown condition {unknown[0]!r}; choose from {', '.join(LADDER_NAMES)}",
                                 param_hint="--conditions")
    src_cond, _, src_rep = p["replay_source"].partition(":")
    if src_cond not in RECORDED or not src_rep.isdigit() or int(src_rep) >= p["replicates"]:
        raise click.BadParameter(f"{p['replay_source']!r} is not CONDITION:N with N < --replicates and CONDITION "
                                 f"one of {', '.join(RECORDED)}", param_hint="--replay-source")
    if "replay" in conds and src_cond not in conds:
        raise click.BadParameter(f"replay serves the {src_cond} recording: include {src_cond} in --conditions",
                                 param_hint="--conditions")
    return designs.ladder(p["replicates"], conds, (src_cond, int(src_rep)), grader)


def _kv(items: tuple[str, ...], what: str) -> dict[str, Any]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=what)
        out[k] = v
    return out


def _graded(reg: Any, grader: str) -> Registry:
    return Registry(tuple(replace(c, grader_version=c.grader_version or grader) for c in reg))


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
