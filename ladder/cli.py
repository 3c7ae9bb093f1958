"""`nfladder`: run a design (ladder, judge, audit, gate) for an unchanged agent: its conditions
through nfproxy, graded by nfverify, analyzed by nfanalyze; from options or a study file."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from noisefloor import outputs
from noisefloor._cli import VERSION, Group, exit_on_sigterm
from noisefloor.display import visible_lines
from noisefloor.errors import EXIT_DRIFT, EXIT_REGRESSED, EXIT_REPLAY_FAILED, EXIT_STAMPS, InputError
from noisefloor.ladder import designs, pipeline, provenance, study_file, task_choice
from noisefloor.ladder.conditions import LADDER_DEFAULT, LADDER_NAMES
from noisefloor.ladder.design_options import DEFAULT_OUT, design_from, design_options
from noisefloor.ladder.runner import Config, LadderError, parse_agent


class _Group(Group):
    interrupted = "nfladder: interrupted; the agent runs that finished are kept in --out: the same command resumes"


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(**VERSION)
def main() -> None:
    """Noise-floor study designs for your agent: the determinism ladder (live, temperature 0, replay), a
    judge study, a tool-calling audit and a regression gate."""
    exit_on_sigterm(hard_stop=_kill_children)


def _kill_children() -> None:
    """The agents and proxies this command started: none outlives a command that could not unwind."""
    from noisefloor.ladder.agent_run import kill_running
    from noisefloor.proxy.launch import kill_started

    kill_running()
    kill_started()


OUTPUTS = ("report.json", "report.md", "ladder.png", "outcomes.jsonl", "log.lmdb")


def _say(message: str) -> None:
    click.echo(f"{time.strftime('%H:%M:%S')} {message}", err=True)


def execute(cfg: Config, design: designs.Design, kind: str, builtin: Any | None, abort_on_drift: bool = True) -> int:
    """Run the design, print what it found, return the exit status (exit_codes.py)."""
    from noisefloor.analyzer import report

    r = pipeline.run(cfg, design, kind, builtin, _say)
    for section in r.sections:  # a design's own result first; the ladder of its conditions below it
        click.echo(visible_lines(section) + "\n")
    click.echo(report.table(r.analysis, r.doc["log"]))
    if "truth" in r.doc and "w" in r.doc["truth"]:
        click.echo("\n" + report.truth_line(r.doc["truth"]))
    click.echo("\n" + provenance.text(r.doc["provenance"]))
    wrote = [n for n in OUTPUTS if (cfg.out / n).exists()]  # ladder.png only where it was drawn
    click.echo(f"\nwrote {cfg.out}/{', '.join(wrote)}")
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
                   f"(see `nfproxy log {cfg.out / 'log.lmdb'} --session {bad[0]}`)", err=True)
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
@click.option("--plot/--no-plot", default=True, show_default=True,
              help="ladder: draw ladder.png (matplotlib's import and drawing cost about a CPU-second a run).")
@design_options
@click.pass_context
def run_cmd(ctx: click.Context, study: Path | None, **p: Any) -> None:
    """Run a design for an agent and write the report to --out; STUDY.toml declares the same
    options (and, for a ladder, its own conditions) in a file; options given here win."""
    if study is not None:
        p = study_file.merge(study, p, ctx)
    code = _run(p)
    sys.exit(code)


def _run(p: dict[str, Any]) -> int:
    out: Path = p["out"]
    name = p["design"]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot create the folder ({exc.strerror}); choose another path") from None
    outputs.check_writable(out / "report.json", "--out")  # before any agent runs: a report that cannot be written is lost
    tasks, dataset, kind = _tasks(p, out)
    from noisefloor import __version__ as nf_version

    design = design_from(p, f"nfverify-{kind}-{nf_version}", p["provider"] == "builtin")
    agent = parse_agent("tools" if name == "audit" and p["agent_cmd"] == "builtin" else p["agent_cmd"])
    builtin = _builtin_provider(p, tasks)
    upstream = builtin.url if builtin is not None else p["provider"]
    cfg = Config(out=out, agent=agent, tasks=tasks, dataset=dataset, upstream=upstream, replicates=design.replicates,
                 conditions=design.conditions, jobs=p["jobs"], agent_timeout=p["agent_timeout"],
                 seed=p["seed"], bootstrap=p["bootstrap"],
                 replay_env={"NF_AGENT_NOISE": "1"} if p["inject_violation"] else {},
                 executor=p["executor"], ray_address=p["ray_address"], design=name,
                 perturb_file=p["perturb_file"], provider_listing=provenance.provider_models(upstream), plot=p["plot"])
    try:
        return execute(cfg, design, kind, builtin, p["abort_on_drift"])
    except LadderError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if builtin is not None and builtin.running:
            builtin.stop()


def _tasks(p: dict[str, Any], out: Path) -> tuple[list[Any], Path, str]:
    """The run's tasks (--suite or the audit's BFCL tasks, then --task-ids and --tasks), the file
    graded against, and the verifier's suite kind."""
    from noisefloor.verifier.datasets import DatasetError

    try:
        if p["design"] == "audit":
            from noisefloor.ladder.audit_study import audit_tasks

            tasks, dataset, kind = audit_tasks(p["bfcl_dir"], p["categories"], p["per_category"])
        else:
            tasks, dataset, kind = task_choice.suite(p["suite"], out)
    except DatasetError as exc:
        raise click.ClickException(f"suite refused before anything ran: {exc}") from None
    if p["task_ids"]:
        tasks = task_choice.select(tasks, p["task_ids"])
    return tasks[:p["limit"]], dataset, kind


def _builtin_provider(p: dict[str, Any], tasks: list[Any]) -> Any:
    """The built-in provider, started, when --provider builtin; None for a provider URL."""
    if p["provider"] != "builtin":
        return None
    audit = p["design"] == "audit"
    if p["suite"] != "builtin" and not audit:
        raise click.BadParameter("the built-in provider only answers the built-in suite; give --provider URL",
                                 param_hint="--provider")
    from noisefloor.ladder.provider import BuiltinProvider, Faults
    from noisefloor.ladder.suite import builtin_suite

    return BuiltinProvider(builtin_suite() if audit else tasks, p["seed"],
                           Faults(p["fault_429"], p["fault_drop"], p["latency_ms"]),
                           tool_tasks=[t.tool for t in tasks] if audit else []).start()


DEMO_SIZES = {"ladder": {}, "judge": {"limit": 10}, "audit": {"per_category": 6}, "gate": {"limit": 12}}


@main.command("demo")
@click.option("--replicates", "-R", default=5, show_default=True, type=click.IntRange(min=2))
@design_options
@click.pass_context
def demo_cmd(ctx: click.Context, replicates: int, out: Path, design: str, **p: Any) -> None:
    """A design end to end on the built-in suite, provider and agent (no network, no API key),
    with the provider's known truth beside every estimate."""
    if out == DEFAULT_OUT:
        out = Path("nf-demo")
    p = {**p, "replicates": replicates, "out": out, "design": design, "agent_cmd": "builtin", "suite": "builtin",
         "limit": None, "task_ids": None, "conditions": ",".join(LADDER_DEFAULT), "provider": "builtin", "replay_source": "t0:0",
         "agent_timeout": 60.0, "inject_violation": False, "fault_429": 0.0, "fault_drop": 0.0, "latency_ms": 0.0,
         "abort_on_drift": True, "executor": "local", "ray_address": None, "plot": True}
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
