"""`nfladder`: run a design (ladder, judge, audit, gate) for an unchanged agent: its conditions
through nfproxy, graded by nfverify, analyzed by nfanalyze; from options or a study file."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from noisefloor import outputs
from noisefloor._cli import VERSION, Group, exit_on_sigterm
from noisefloor.analyzer.bootstrap import DEFAULT_RESAMPLES
from noisefloor.errors import EXIT_DRIFT, EXIT_REGRESSED, EXIT_REPLAY_FAILED, EXIT_STAMPS, InputError
from noisefloor.ladder import designs, pipeline, provenance, study_file
from noisefloor.ladder.conditions import LADDER_DEFAULT, LADDER_NAMES, RECORDED, ConditionError, Override
from noisefloor.ladder.runner import Config, LadderError, parse_agent


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(**VERSION)
def main() -> None:
    """The seeds' designs for your agent: the determinism ladder (live, temperature 0, replay), a
    judge study, a tool-calling audit and a regression gate."""
    exit_on_sigterm()


def _say(message: str) -> None:
    click.echo(f"{time.strftime('%H:%M:%S')} {message}", err=True)


def _suite(name: str, out: Path) -> tuple[list[Any], Path, str]:
    """Tasks, the EvalPlus-format file to grade against, and the verifier's suite kind."""
    from noisefloor.verifier.datasets import DatasetError, load_code_tasks, locate

    if name == "builtin":
        from noisefloor.ladder.suite import builtin_suite, write_dataset

        tasks = builtin_suite()
        path = write_dataset(tasks, out / "suite.jsonl.gz")
        return tasks, path, "humaneval+"
    try:
        if name in ("humaneval+", "mbpp+"):
            path = locate(name)
            kind = name
        else:  # a file in EvalPlus format (HumanEval-style prompts)
            path, kind = Path(name), "humaneval+"
            if not path.is_file():
                raise DatasetError(f"suite {name!r} is neither builtin, humaneval+, mbpp+ nor a file")
        return load_code_tasks(kind, path), path, kind
    except DatasetError as exc:
        raise click.ClickException(f"suite refused before anything ran: {exc}") from None


def _select(tasks: list[Any], spec: str) -> list[Any]:
    """The suite's tasks named by --task-ids, in the order given."""
    if spec.startswith("@"):
        try:
            text = Path(spec[1:]).read_text()
        except OSError as exc:
            raise click.BadParameter(f"cannot read {spec[1:]}: {exc.strerror}", param_hint="--task-ids") from None
        ids = [line.split("#")[0].strip() for line in text.splitlines()]
    else:
        ids = [part.strip() for part in spec.split(",")]
    ids = [i for i in ids if i]
    by_id = {t.task_id: t for t in tasks}
    unknown = [i for i in ids if i not in by_id]
    if unknown or not ids:
        raise click.BadParameter(f"{len(unknown)} ids are not in the suite (e.g. {unknown[0]!r})" if unknown
                                 else "no task ids given", param_hint="--task-ids")
    return [by_id[i] for i in dict.fromkeys(ids)]


def execute(cfg: Config, design: designs.Design, kind: str, builtin: Any | None, abort_on_drift: bool = True) -> int:
    """Run the design, print what it found, return the exit status (exit_codes.py)."""
    from noisefloor.analyzer import report

    r = pipeline.run(cfg, design, kind, builtin, _say)
    click.echo(report.table(r.analysis, r.doc["log"]))
    for section in r.sections:
        click.echo("\n" + section)
    if "truth" in r.doc and "w" in r.doc["truth"]:
        click.echo("\n" + report.truth_line(r.doc["truth"]))
    click.echo("\n" + provenance.text(r.doc["provenance"]))
    click.echo(f"\nwrote {cfg.out}/report.json, report.md, outcomes.jsonl, log.lmdb")
    if r.drifted:
        click.echo("nfladder: the served model changed for one requested model within a condition: " + "; ".join(
            f"{c}: {', '.join(m)}" for c, m in r.drifted.items()) + " (system fingerprints are kept as a covariate)"
            + ("; exit 4 (pass --allow-drift to accept it)" if abort_on_drift else ""), err=True)
        if abort_on_drift:
            return EXIT_DRIFT
    if r.replay_misses:
        bad = r.replay_misses
        click.echo(f"nfladder: REPLAY FAILED: {len(bad)} replay sessions asked for requests the recording does not "
                   f"hold (e.g. {bad[0]}); the agent changed its requests, so replay does not measure it "
                   f"(see `nfproxy log --store {cfg.out / 'log.lmdb'} --session {bad[0]}`)", err=True)
        return EXIT_REPLAY_FAILED
    if r.replay_proxy_failed:  # no miss in the log, yet replay failed: an error of its own
        click.echo("nfladder: REPLAY FAILED: the replay proxy could not answer every request (see the errors "
                   "it logged above); the replay condition is not a faithful replay", err=True)
        return EXIT_REPLAY_FAILED
    if r.refused:
        click.echo(f"nfladder: the gate refused to compare: {r.refused}; exit 2", err=True)
        return EXIT_STAMPS
    if r.regressed:
        click.echo("nfladder: the gate found a regressed case; exit 1", err=True)
        return EXIT_REGRESSED
    return 0


def _common(f: Any) -> Any:
    opts = [
        click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("nf-ladder"),
                     show_default=True, help="Folder for the log, outcomes, report and plot (reruns resume)."),
        click.option("-j", "--jobs", default=os.cpu_count() or 2, show_default=True, type=click.IntRange(min=1)),
        click.option("--seed", default=0, show_default=True, type=int, help="Provider draws and bootstrap."),
        click.option("--bootstrap", default=DEFAULT_RESAMPLES, show_default=True, type=click.IntRange(min=100)),
        click.option("--design", type=click.Choice(designs.DESIGNS), default="ladder", show_default=True,
                     help="ladder (live, t0, replay), judge (frozen candidates judged at T=0.7 and T=0), audit "
                          "(BFCL tool calling: reruns and prompt perturbations), gate (baselines A, B, candidate)."),
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
        click.option("--main-runs", default=10, show_default=True, type=click.IntRange(min=2), help="audit: main-arm reruns."),
        click.option("--perturbed-runs", default=5, show_default=True, type=click.IntRange(min=1),
                     help="audit: reruns per perturbation variant."),
        click.option("--variants", default=",".join(designs.PERTURBATIONS), show_default=True,
                     help="audit: perturbation variants (the four named ones, or names from --perturb-file)."),
        click.option("--perturb-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="audit: user perturbation variants (JSON; see nfproxy --perturb-file)."),
        click.option("--k", "gate_k", default=8, show_default=True, type=click.IntRange(min=2), help="gate: repeats per case."),
        click.option("--escalate-at", default=16, show_default=True, type=click.IntRange(min=2),
                     help="gate: inconclusive cases are re-run to this many repeats."),
        click.option("--candidate-agent", help="gate: the candidate's agent command (default: the baselines').",),
        click.option("--candidate-env", multiple=True, metavar="KEY=VALUE", help="gate: environment of the candidate agent."),
        click.option("--candidate-set", multiple=True, metavar="POINTER=VALUE",
                     help="gate: proxy overrides of the candidate (unstamped fields only)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _kv(items: tuple[str, ...], what: str) -> dict[str, Any]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=what)
        out[k] = v
    return out


def _design(name: str, p: dict[str, Any], grader: str, builtin: bool) -> designs.Design:
    try:
        if name == "judge":
            temps = tuple(float(t) for t in p["judge_temperatures"].split(",") if t.strip())
            return designs.judge(p["judge_repeats"], temps, samples=str(p["samples"]) if p["samples"] else None)
        if name == "audit":
            return designs.audit(main_runs=p["main_runs"], perturbed_runs=p["perturbed_runs"],
                                 variants=tuple(v.strip() for v in p["variants"].split(",") if v.strip()),
                                 per_category=p["per_category"],
                                 categories=tuple(c.strip() for c in p["categories"].split(",") if c.strip()))
        if name == "gate":
            env = _kv(p["candidate_env"], "--candidate-env")
            if builtin and not env and not p["candidate_agent"] and not p["candidate_set"]:
                from noisefloor.ladder.provider import CANDIDATE_MARK

                env = {designs.CANDIDATE_MARK_ENV: CANDIDATE_MARK}  # the demo's changed agent
            sets = [Override(k, _json(v)) for k, v in _kv(p["candidate_set"], "--candidate-set").items()]
            agent = parse_agent(p["candidate_agent"]) if p["candidate_agent"] else None
            return designs.gate(p["gate_k"], p["escalate_at"], env, sets, agent, grader)
    except (ValueError, ConditionError) as exc:
        raise click.BadParameter(str(exc), param_hint="--design options") from None
    conds = tuple(c.strip() for c in p["conditions"].split(",") if c.strip())
    unknown = [c for c in conds if c not in LADDER_NAMES]
    if unknown:
        raise click.BadParameter(f"unknown condition {unknown[0]!r}; choose from {', '.join(LADDER_NAMES)}",
                                 param_hint="--conditions")
    src_cond, _, src_rep = p["replay_source"].partition(":")
    if src_cond not in RECORDED or not src_rep.isdigit() or int(src_rep) >= p["replicates"]:
        raise click.BadParameter(f"{p['replay_source']!r} is not CONDITION:N with N < --replicates and CONDITION "
                                 f"one of {', '.join(RECORDED)}",
                                 param_hint="--replay-source")
    if "replay" in conds and src_cond not in conds:
        raise click.BadParameter(f"replay serves the {src_cond} recording: include {src_cond} in --conditions",
                                 param_hint="--conditions")
    return designs.ladder(p["replicates"], conds, (src_cond, int(src_rep)), grader)


def _graded(reg: Any, grader: str) -> Any:
    from dataclasses import replace

    from noisefloor.ladder.conditions import Registry

    return Registry(tuple(replace(c, grader_version=c.grader_version or grader) for c in reg))


def _json(text: str) -> Any:
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


@main.command("run")
@click.argument("study", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--agent", "agent_cmd", default="builtin", show_default=True,
              help="Agent command with {task_file}, e.g. 'python agent.py {task_file}'; 'builtin' is a stdlib chat "
                   "agent, 'completions' a stdlib agent for base models (/v1/completions with stop sequences).")
@click.option("--suite", default="builtin", show_default=True, help="builtin, humaneval+, mbpp+, or an EvalPlus-format file.")
@click.option("--tasks", "limit", type=click.IntRange(min=1), help="Use the first N tasks of the suite.")
@click.option("--task-ids", help="Only these tasks: comma-separated ids, or @FILE with one id per line.")
@click.option("--replicates", "-R", default=5, show_default=True, type=click.IntRange(min=2))
@click.option("--conditions", default=",".join(LADDER_DEFAULT), show_default=True,
              help=f"ladder: which of {', '.join(LADDER_NAMES)}.")
@click.option("--provider", default="builtin", show_default=True, help="builtin, or the provider's base URL (origin).")
@click.option("--replay-source", default="t0:0", show_default=True, help="CONDITION:REPLICATE whose recording replay serves.")
@click.option("--agent-timeout", default=120.0, show_default=True, type=float, help="Seconds before an agent run is killed.")
@click.option("--inject-violation", is_flag=True, help="Make the built-in agent change its requests on replay (must fail).")
@click.option("--fault-429", default=0.0, type=click.FloatRange(0, 1), help="Built-in provider: share of 429 answers.")
@click.option("--fault-drop", default=0.0, type=click.FloatRange(0, 1), help="Built-in provider: share of dropped connections.")
@click.option("--latency-ms", default=0.0, type=click.FloatRange(min=0), help="Built-in provider: added latency.")
@click.option("--abort-on-drift/--allow-drift", default=True, show_default=True,
              help="Exit 4 when one requested model was served by two models within a condition; --allow-drift "
                   "reports it as a warning.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Where agent runs and grading happen: this machine, or a Ray cluster (pip install 'noisefloor[ray]').")
@click.option("--ray-address", help="The Ray cluster to join (default: start or join a local Ray).")
@_common
@click.pass_context
def run_cmd(ctx: click.Context, study: Path | None, **p: Any) -> None:
    """Run a design for an agent and write the report to --out; STUDY.toml declares the same
    options (and, for a ladder, its own conditions) in a file; options given here win."""
    if study is not None:
        p = study_file.merge(study, p, ctx)
    code = _run(p)
    sys.exit(code)


def _run(p: dict[str, Any]) -> int:
    from noisefloor.verifier.datasets import DatasetError

    out: Path = p["out"]
    name = p["design"]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot create the folder ({exc.strerror}); choose another path") from None
    outputs.check_writable(out / "report.json", "--out")  # before any agent runs: a report that cannot be written is lost
    builtin_provider = p["provider"] == "builtin"
    try:
        if name == "audit":
            from noisefloor.ladder.audit_study import audit_tasks

            tasks, dataset, kind = audit_tasks(p["bfcl_dir"], p["categories"], p["per_category"])
        else:
            tasks, dataset, kind = _suite(p["suite"], out)
    except DatasetError as exc:
        raise click.ClickException(f"suite refused before anything ran: {exc}") from None
    if p["task_ids"]:
        tasks = _select(tasks, p["task_ids"])
    tasks = tasks[:p["limit"]]
    from noisefloor import __version__ as nf_version

    grader = f"nfverify-{kind}-{nf_version}"
    design = _design(name, p, grader, builtin_provider)
    if p.get("custom_conditions") is not None:
        if name != "ladder":
            raise click.ClickException(f"[[condition]] tables declare a ladder's conditions; the {name} design "
                                       "builds its own (set its options instead)")
        design = designs.Design("ladder", _graded(p["custom_conditions"], grader), p["replicates"], {})
    agent = parse_agent("tools" if name == "audit" and p["agent_cmd"] == "builtin" else p["agent_cmd"])
    builtin = None
    if builtin_provider:
        if p["suite"] != "builtin" and name != "audit":
            raise click.BadParameter("the built-in provider only answers the built-in suite; give --provider URL",
                                     param_hint="--provider")
        from noisefloor.ladder.provider import BuiltinProvider, Faults
        from noisefloor.ladder.suite import builtin_suite

        code_tasks = tasks if name != "audit" else builtin_suite()
        builtin = BuiltinProvider(code_tasks, p["seed"], Faults(p["fault_429"], p["fault_drop"], p["latency_ms"]),
                                  tool_tasks=[t.tool for t in tasks] if name == "audit" else []).start()
        upstream = builtin.url
    else:
        upstream = p["provider"]
    cfg = Config(out=out, agent=agent, tasks=tasks, dataset=dataset, upstream=upstream, replicates=design.replicates,
                 conditions=design.conditions, jobs=p["jobs"], agent_timeout=p["agent_timeout"],
                 seed=p["seed"], bootstrap=p["bootstrap"],
                 replay_env={"NF_AGENT_NOISE": "1"} if p["inject_violation"] else {},
                 executor=p["executor"], ray_address=p["ray_address"], design=name,
                 perturb_file=p["perturb_file"], provider_listing=provenance.provider_models(upstream))
    try:
        return execute(cfg, design, kind, builtin, p["abort_on_drift"])
    except LadderError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if builtin is not None and builtin.running:
            builtin.stop()


DEMO_SIZES = {"ladder": {}, "judge": {"limit": 10}, "audit": {"per_category": 6}, "gate": {"limit": 12}}


@main.command("demo")
@click.option("--replicates", "-R", default=5, show_default=True, type=click.IntRange(min=2))
@_common
@click.pass_context
def demo_cmd(ctx: click.Context, replicates: int, out: Path, design: str, **p: Any) -> None:
    """A design end to end on the built-in suite, provider and agent (no network, no API key),
    with the provider's known truth beside every estimate."""
    if out == Path("nf-ladder"):
        out = Path("nf-demo")
    p = {**p, "replicates": replicates, "out": out, "design": design, "agent_cmd": "builtin", "suite": "builtin",
         "limit": None, "task_ids": None, "conditions": ",".join(LADDER_DEFAULT), "provider": "builtin", "replay_source": "t0:0",
         "agent_timeout": 60.0, "inject_violation": False, "fault_429": 0.0, "fault_drop": 0.0, "latency_ms": 0.0,
         "abort_on_drift": True, "executor": "local", "ray_address": None}
    for k, v in DEMO_SIZES[design].items():
        if ctx.get_parameter_source(k) in (None, click.core.ParameterSource.DEFAULT):
            p[k] = v
    sys.exit(_run(p))


@main.command("provider")
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--seed", default=0, show_default=True, type=int)
def provider_cmd(port: int, seed: int) -> None:
    """Serve the built-in provider on loopback (for trying an agent against it by hand)."""
    from noisefloor.ladder.provider import BuiltinProvider
    from noisefloor.ladder.suite import builtin_suite

    p = BuiltinProvider(builtin_suite(), seed, port=port).start()
    click.echo(f"built-in provider on {p.url} (OpenAI /v1/chat/completions, Anthropic /v1/messages); Ctrl-C stops",
               err=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        p.stop()


if __name__ == "__main__":
    main()
