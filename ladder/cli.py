"""`nfladder`: run an unchanged agent through live, temperature-0 and replay, verify, analyze, plot."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from noisefloor import outputs
from noisefloor._cli import VERSION, Group
from noisefloor.analyzer.bootstrap import DEFAULT_RESAMPLES
from noisefloor.errors import EXIT_DRIFT, EXIT_REPLAY_FAILED, InputError
from noisefloor.ladder import pipeline
from noisefloor.ladder.runner import CONDITIONS, Config, LadderError, parse_agent


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(**VERSION)
def main() -> None:
    """The determinism ladder for your agent: live, temperature 0 and replay, R replicates per task."""


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


def execute(cfg: Config, kind: str, builtin: Any | None, abort_on_drift: bool = True) -> int:
    """Run the pipeline, print what it found, return the exit status."""
    from noisefloor.analyzer import report

    r = pipeline.run(cfg, kind, builtin, _say)
    click.echo(report.table(r.analysis, r.doc["log"]))
    if "truth" in r.doc:
        click.echo("\n" + report.truth_line(r.doc["truth"]))
    click.echo(f"\nwrote {cfg.out}/report.json, report.md, ladder.png, outcomes.jsonl, log.lmdb")
    if r.drifted:
        click.echo("nfladder: the served model changed within a condition: " + "; ".join(
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
    return 0


def _common(f: Any) -> Any:
    opts = [
        click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("nf-ladder"),
                     show_default=True, help="Folder for the log, outcomes, report and plot (reruns resume)."),
        click.option("-j", "--jobs", default=os.cpu_count() or 2, show_default=True, type=click.IntRange(min=1)),
        click.option("--seed", default=0, show_default=True, type=int, help="Provider draws and bootstrap."),
        click.option("--bootstrap", default=DEFAULT_RESAMPLES, show_default=True, type=click.IntRange(min=100)),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@main.command("run")
@click.option("--agent", "agent_cmd", default="builtin", show_default=True,
              help="Agent command with {task_file}, e.g. 'python agent.py {task_file}'; 'builtin' is a stdlib chat "
                   "agent, 'completions' a stdlib agent for base models (/v1/completions with stop sequences).")
@click.option("--suite", default="builtin", show_default=True, help="builtin, humaneval+, mbpp+, or an EvalPlus-format file.")
@click.option("--tasks", "limit", type=click.IntRange(min=1), help="Use the first N tasks of the suite.")
@click.option("--task-ids", help="Only these tasks: comma-separated ids, or @FILE with one id per line.")
@click.option("--replicates", "-R", default=5, show_default=True, type=click.IntRange(min=2))
@click.option("--conditions", default=",".join(CONDITIONS), show_default=True)
@click.option("--provider", default="builtin", show_default=True, help="builtin, or the provider's base URL (origin).")
@click.option("--replay-source", default="t0:0", show_default=True, help="CONDITION:REPLICATE whose recording replay serves.")
@click.option("--agent-timeout", default=120.0, show_default=True, type=float, help="Seconds before an agent run is killed.")
@click.option("--inject-violation", is_flag=True, help="Make the built-in agent change its requests on replay (must fail).")
@click.option("--fault-429", default=0.0, type=click.FloatRange(0, 1), help="Built-in provider: share of 429 answers.")
@click.option("--fault-drop", default=0.0, type=click.FloatRange(0, 1), help="Built-in provider: share of dropped connections.")
@click.option("--latency-ms", default=0.0, type=click.FloatRange(min=0), help="Built-in provider: added latency.")
@click.option("--abort-on-drift/--allow-drift", default=True, show_default=True,
              help="Exit 4 when a condition's served model changed mid-study; --allow-drift reports it as a warning.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Where agent runs and grading happen: this machine, or a Ray cluster (pip install 'noisefloor[ray]').")
@click.option("--ray-address", help="The Ray cluster to join (default: start or join a local Ray).")
@_common
def run_cmd(agent_cmd: str, suite: str, limit: int | None, task_ids: str | None, replicates: int, conditions: str, provider: str,
            replay_source: str, agent_timeout: float, inject_violation: bool, fault_429: float, fault_drop: float,
            latency_ms: float, abort_on_drift: bool, executor: str, ray_address: str | None, out: Path, jobs: int, seed: int, bootstrap: int) -> None:
    """Run the ladder for an agent and write the report to --out."""
    conds = tuple(c.strip() for c in conditions.split(",") if c.strip())
    unknown = [c for c in conds if c not in CONDITIONS]
    if unknown:
        raise click.BadParameter(f"unknown condition {unknown[0]!r}; choose from {', '.join(CONDITIONS)}",
                                 param_hint="--conditions")
    src_cond, _, src_rep = replay_source.partition(":")
    if src_cond not in ("live", "t0") or not src_rep.isdigit() or int(src_rep) >= replicates:
        raise click.BadParameter(f"{replay_source!r} is not live:N or t0:N with N < --replicates", param_hint="--replay-source")
    if "replay" in conds and src_cond not in conds:
        raise click.BadParameter(f"replay serves the {src_cond} recording: include {src_cond} in --conditions",
                                 param_hint="--conditions")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot create the folder ({exc.strerror}); choose another path") from None
    outputs.check_writable(out / "report.json", "--out")  # before any agent runs: a report that cannot be written is lost
    tasks, dataset, kind = _suite(suite, out)
    if task_ids:
        tasks = _select(tasks, task_ids)
    tasks = tasks[:limit]
    agent = parse_agent(agent_cmd)
    builtin = None
    if provider == "builtin":
        if suite != "builtin":
            raise click.BadParameter("the built-in provider only answers the built-in suite; give --provider URL",
                                     param_hint="--provider")
        from noisefloor.ladder.provider import BuiltinProvider, Faults

        builtin = BuiltinProvider(tasks, seed, Faults(fault_429, fault_drop, latency_ms)).start()
        upstream = builtin.url
    else:
        upstream = provider
    cfg = Config(out=out, agent=agent, tasks=tasks, dataset=dataset, upstream=upstream, replicates=replicates,
                 conditions=conds, replay_source=(src_cond, int(src_rep)), jobs=jobs, agent_timeout=agent_timeout,
                 seed=seed, bootstrap=bootstrap, replay_env={"NF_AGENT_NOISE": "1"} if inject_violation else {},
                 executor=executor, ray_address=ray_address)
    try:
        code = execute(cfg, kind, builtin, abort_on_drift)
    except LadderError as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)


@main.command("demo")
@click.option("--replicates", "-R", default=5, show_default=True, type=click.IntRange(min=2))
@_common
@click.pass_context
def demo_cmd(ctx: click.Context, replicates: int, out: Path, jobs: int, seed: int, bootstrap: int) -> None:
    """The whole ladder on the built-in suite, provider and agent (no network, no API key)."""
    if out == Path("nf-ladder"):
        out = Path("nf-demo")
    ctx.invoke(run_cmd, agent_cmd="builtin", suite="builtin", limit=None, task_ids=None, replicates=replicates,
               conditions=",".join(CONDITIONS), provider="builtin", replay_source="t0:0", agent_timeout=60.0,
               inject_violation=False, fault_429=0.0, fault_drop=0.0, latency_ms=0.0, abort_on_drift=True,
               executor="local", ray_address=None, out=out,
               jobs=jobs, seed=seed,
               bootstrap=bootstrap)


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
