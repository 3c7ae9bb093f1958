"""`nfanalyze`: determinism-ladder statistics from outcome rows (and, optionally, the proxy log).

The group and its default command live here; `nfanalyze gate` lives in gate_cli.py. The analyze
command is parse (analyze_options), read (inputs), compute, build the report (report_doc), print
and write, each step a function."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import click

from noisefloor import outputs
from noisefloor._cli import default_group, progress_bar
from noisefloor.analyzer import audit as audit_mod
from noisefloor.analyzer import audit_checks, floors_report, gate_cli, report, report_doc
from noisefloor.analyzer.analysis import Analysis, analyze
from noisefloor.analyzer.analyze_options import AnalyzeOptions, analyze_options, from_cli
from noisefloor.analyzer.inputs import Inputs, gather
from noisefloor.analyzer.outcome_columns import RowColumns
from noisefloor.analyzer.outcomes import build, build_columns
from noisefloor.display import visible
from noisefloor.errors import EXIT_DRIFT


@default_group("analyze")
def main() -> None:
    """Noise-floor statistics: the determinism ladder (default), floors, and a per-case regression gate."""


@dataclass(frozen=True)
class Study:
    """One analysis and what the rows held beyond it."""

    analysis: Analysis
    audits: list[audit_mod.EndpointAudit] | None  # the floors, when the rows carry endpoints
    gate: Any  # gate_run.GateSection, when the rows hold the gate design's collections


@main.command("analyze")
@analyze_options
def analyze_cmd(**params: Any) -> None:
    """Within-task variance, joint task-bootstrap intervals, contrasts and rerun budgets per condition.

    LOG is an nfproxy store (or several: shards of one study): its graded outcome rows (kept there by
    nfverify and nfladder) are the input, and its exchanges add per-condition call, miss and token
    counts; --outcomes FILE adds rows or replaces the log's rows for the same condition, task and
    replicate.
    """
    o = from_cli(**params)
    for path, option in ((o.json_path, "--json"), (o.md_path, "--markdown"), (o.plot_path, "--plot")):
        outputs.check_writable(path, option)  # before any work: a result that cannot be written is lost
    inputs = gather(o)
    if not len(inputs.rows):  # stores without graded rows: what the agents did, not statistics
        _trajectories(o)
        return
    study = compute(o, inputs.rows)
    parts = report_doc.Parts.kept(
        inputs.kept, log=inputs.log, gate=study.gate.to_json() if study.gate is not None else None,
        floors=floors_report.to_json(study.audits) if study.audits is not None else None,
        floor_notes=report_doc.floor_notes(study.audits or []))
    doc = report_doc.build(study.analysis, parts)
    if not o.quiet and o.json_path != "-":
        _print(study, inputs, doc)
    _write(o, study, inputs, doc)


def _trajectories(o: AnalyzeOptions) -> None:
    """The stores' trajectory summary (text, and JSON with --json) where no outcome rows exist."""
    from noisefloor.analyzer import logstats, trajectories

    summary = trajectories.summarize(logstats.trajectory_steps(list(o.logs)))
    where = ", ".join(map(str, o.logs))
    if o.json_path:
        report.write_json({"schema": report_doc.SCHEMA, "trajectories": summary.to_json(), "store": where},
                          o.json_path)
    shown = trajectories.text(summary, where)
    if o.md_path:
        outputs.write_text(o.md_path, f"# Trajectories\n\n```\n{shown}\n```\n")
    if o.plot_path:
        click.echo(f"nfanalyze: no plot written to {visible(o.plot_path)}: the stores hold no graded rows", err=True)
    if not o.quiet and o.json_path != "-":
        click.echo(shown)


def compute(o: AnalyzeOptions, rows: list[Any] | RowColumns) -> Study:
    """The floors (when the rows carry endpoints), the ladder and the gate section; exit 4 on drift
    unless --allow-drift. Rows as columns (a store's, `inputs.gather`) carry neither floors nor gate."""
    if isinstance(rows, RowColumns):
        data = build_columns(rows, missing_tasks=o.missing_tasks, unbalanced=o.unbalanced)
        return Study(analyze(data, o.settings(), progress_bar("bootstrap", o.progress, final=False)), None, None)
    audits = None
    if o.floors or (o.floors is None and audit_mod.is_audit(rows)):
        audits = audit_mod.audit(rows, seed=o.seed, resamples=o.resamples)
        rows = audit_mod.main_arm(rows, audits)
        audit_checks.check_study_set(audits, o.study_set)
        drifted = audit_checks.drift_messages(audits)
        if drifted and o.abort_on_drift:
            click.echo(f"Error: {visible(drifted[0])}; rerun on one model or split the endpoint (or pass "
                       "--allow-drift)", err=True)
            sys.exit(EXIT_DRIFT)
    data = build(rows, missing_tasks=o.missing_tasks, unbalanced=o.unbalanced)
    result = analyze(data, o.settings(), progress_bar("bootstrap", o.progress, final=False))
    return Study(result, audits, _gate_section(rows))


def _gate_section(rows: list[Any]) -> Any:
    """The gate of nfladder's gate design, when the rows hold its three collections."""
    from noisefloor.analyzer import gate as g
    from noisefloor.analyzer import gate_run

    names = {r.condition for r in rows}
    if not set(g.GATE_CONDITIONS) <= names:
        return None
    runs = [g.run_of([r for r in rows if r.condition == n]) for n in g.GATE_CONDITIONS]
    return gate_run.section(runs)


def _print(study: Study, inputs: Inputs, doc: dict[str, Any]) -> None:
    click.echo(report.table(study.analysis, inputs.log))
    if study.audits is not None:
        click.echo("\n" + floors_report.table(study.audits))
    kept = inputs.kept or {}
    if kept.get("judge_parse"):
        click.echo("\njudge replies: " + "; ".join(f"{c}: {', '.join(f'{k} {n}' for k, n in sorted(v.items()))}"
                                                 for c, v in kept["judge_parse"].items()))
    if kept.get("compare"):
        click.echo("\n" + _compare_line(kept["compare"]))
    if kept.get("provenance"):
        pv = kept["provenance"]
        models = pv.get("models") or {}
        click.echo(f"\nprovenance (kept by nfladder): design {kept.get('design')}, recording {pv.get('recording_id')}, "
                   f"task set sha256 {str((pv.get('task_set') or {}).get('sha256'))[:16]}..., models requested "
                   f"{', '.join(models.get('requested') or []) or '-'}, served "
                   f"{', '.join(models.get('served') or []) or '-'}")
    g = study.gate
    if g is not None:
        click.echo("\ngate: " + (f"refused ({g.refused})" if g.refused else ", ".join(
            f"{n} {k}" for k, n in g.counts().items()) + f"; re-run to k>8: {', '.join(g.escalated) or 'none'}"))
    for w in doc["warnings"][len(study.analysis.warnings):]:  # the analysis' own are in the table
        click.echo(f"warning: {visible(w)}")


def _compare_line(cmp: Any) -> str:
    """The compare design's two numbers, as nfladder kept them, each with the claim it supports."""
    out = [f"compare (kept by nfladder): {len(cmp.get('coupled_tasks') or [])} tasks coupled, "
           f"{len(cmp.get('broken_tasks') or [])} broken"]
    for name, what in (("paired", "coupled, paired B - A"), ("fresh", "broken, fresh B - live A")):
        part = cmp.get(name)
        if isinstance(part, dict):
            lo, hi = (part.get("ci") or [None, None])[:2]
            out.append(f"  {what} = {part.get('estimate')} [{lo}, {hi}]: {visible(part.get('claim'))}")
    return "\n".join(out)


def _write(o: AnalyzeOptions, study: Study, inputs: Inputs, doc: dict[str, Any]) -> None:
    if o.json_path:
        report.write_json(doc, o.json_path)
    if o.md_path:
        floors = floors_report.markdown(study.audits) if study.audits else None
        outputs.write_text(o.md_path, report.markdown(study.analysis, inputs.log, floors))
    if o.plot_path:
        report.plot(study.analysis, o.plot_path)
        if not o.quiet:
            click.echo(f"plot written to {o.plot_path}", err=True)


gate_cli.register(main)


if __name__ == "__main__":  # last: every subcommand is defined by now
    main()
