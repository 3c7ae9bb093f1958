"""`nfanalyze`: determinism-ladder statistics from outcome rows (and, optionally, the proxy log)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from noisefloor import outputs
from noisefloor._cli import default_group, progress_bar
from noisefloor.analyzer import audit as audit_mod
from noisefloor.analyzer import audit_checks, floors_report, report
from noisefloor.analyzer.analysis import Analysis, Settings, analyze
from noisefloor.analyzer.bootstrap import DEFAULT_RESAMPLES
from noisefloor.analyzer.ladder import Planning
from noisefloor.analyzer.outcomes import build
from noisefloor.display import visible
from noisefloor.errors import EXIT_DRIFT, EXIT_OK, EXIT_REGRESSED, EXIT_STAMPS, NoisefloorError
from noisefloor.outcome_rows import OutcomeError, key_of, parse_rows, read_rows


def _pair(text: str) -> tuple[str, str]:
    a, sep, b = text.partition(":")
    if not sep or not a or not b:
        raise click.BadParameter(f"{text!r} is not A:B (two condition names)", param_hint="--contrast")
    return a, b


@default_group("analyze")
def main() -> None:
    """Noise-floor statistics: the determinism ladder (default), floors, and a per-case regression gate."""


@main.command("analyze")
@click.argument("logs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--outcomes", type=click.Path(path_type=Path), help="Outcome rows: .jsonl or .csv (task_id, condition, replicate, outcome).")
@click.option("--example", is_flag=True, help="Analyze a built-in simulated ladder (live, t0, replay) with known truth.")
@click.option("--json", "json_path", metavar="PATH", help="Write the JSON report ('-' for stdout).")
@click.option("--markdown", "md_path", type=click.Path(path_type=Path), help="Write a Markdown report.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), help="Write the ladder plot (PNG).")
@click.option("--bootstrap", "resamples", default=DEFAULT_RESAMPLES, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--delta", default=0.02, show_default=True, type=float, help="Difference the rerun budget must detect.")
@click.option("--alpha", default=0.05, show_default=True, type=float)
@click.option("--power", default=0.8, show_default=True, type=float)
@click.option("--contrast", "contrasts", multiple=True, metavar="A:B", help="Contrast w_A - w_B; repeatable (default: every pair).")
@click.option("--compare-batches", nargs=2, metavar="A B", help="Two batches of one condition: w_A - w_B with a joint interval.")
@click.option("--missing-tasks", type=click.Choice(["intersect", "error"]), default="intersect", show_default=True,
              help="A task absent from some condition: drop it from all (reported), or refuse.")
@click.option("--unbalanced", type=click.Choice(["trim", "error"]), default="trim", show_default=True,
              help="Unequal replicate counts in a condition: keep the first R_min of each task (reported), or refuse.")
@click.option("--top", default=5, show_default=True, type=click.IntRange(min=0), help="Tasks listed as carrying most of w.")
@click.option("--progress/--no-progress", default=None, help="Bootstrap progress bar (default: on a terminal).")
@click.option("--floors/--no-floors", "floors_flag", default=None,
              help="Rerun / perturbation floors (default: when rows carry endpoint or variant).")
@click.option("--study-set", help="Expected sha256 of the sorted instance ids: refuse if the study set changed.")
@click.option("--abort-on-drift/--allow-drift", default=True, show_default=True,
              help="Exit 4 when an endpoint's served model changed within the study (seed 003's guard); "
                   "--allow-drift analyzes anyway, with the drift in the warnings.")
@click.option("--inspect-logs", "inspect_specs", multiple=True, metavar="[CONDITION=]PATH",
              help="inspect_ai eval logs (a .eval/.json file or a folder) as outcome rows: sample id -> task, "
                   "epoch (and run) -> replicate, first scorer -> outcome; repeatable, one per condition "
                   "(default condition: the folder's name).")
@click.option("--inspect-pass-at", type=float, help="Read numeric inspect scores at or above this as a pass.")
@click.option("-q", "--quiet", is_flag=True, help="No table on stdout.")
def analyze_cmd(logs: tuple[Path, ...], outcomes: Path | None, example: bool, json_path: str | None, md_path: Path | None,
                plot_path: Path | None, resamples: int, seed: int, delta: float, alpha: float, power: float,
                contrasts: tuple[str, ...], compare_batches: tuple[str, str] | None, missing_tasks: str,
                unbalanced: str, top: int, progress: bool | None, floors_flag: bool | None, study_set: str | None,
                abort_on_drift: bool, inspect_specs: tuple[str, ...], inspect_pass_at: float | None,
                quiet: bool) -> None:
    """Within-task variance, joint task-bootstrap intervals, contrasts and rerun budgets per condition.

    LOG is an nfproxy store (or several: shards of one study): its graded outcome rows (kept there by
    nfverify and nfladder) are the input, and its exchanges add per-condition call, miss and token
    counts; --outcomes FILE adds rows or replaces the log's rows for the same condition, task and
    replicate.
    """
    if not outcomes and not example and not logs and not inspect_specs:
        raise click.UsageError("give --outcomes FILE (or a LOG, --inspect-logs PATH, or --example)")
    for path, option in ((json_path, "--json"), (md_path, "--markdown"), (plot_path, "--plot")):
        outputs.check_writable(path, option)  # before any work: a result that cannot be written is lost
    log_doc = None
    logged: list[dict] = []
    log = ", ".join(map(str, logs))
    if logs:
        from noisefloor.analyzer import logstats

        log_doc = logstats.from_store(list(logs))  # a damaged store: one line, from the command's handling
        logged = logstats.outcome_rows(list(logs))
    if not outcomes and not example and not inspect_specs and not logged:
        raise click.ClickException(f"{log} holds exchanges but no graded outcome rows; grade them with "
                                   f"`nfverify SUITE {log}` (which keeps the rows in the log) or pass --outcomes FILE")
    audits = None
    try:
        plan = Planning(delta, alpha, power)
        if example:
            from noisefloor.analyzer.simulate import example as make_example

            rows = list(make_example().rows)
        else:
            rows = parse_rows(read_rows(outcomes), str(outcomes)) if outcomes else []
            if logged:  # the log's own rows, where --outcomes does not give the same (condition, task, replicate)
                given = {key_of(r) for r in rows}
                mine = parse_rows(enumerate(logged, 1), f"outcome rows in {log}")
                rows += [r for r in mine if key_of(r) not in given]
            for spec in inspect_specs:
                from noisefloor.analyzer import inspect_logs

                rows += parse_rows(inspect_logs.rows(spec, inspect_pass_at), spec)
        if floors_flag or (floors_flag is None and audit_mod.is_audit(rows)):
            audits = audit_mod.audit(rows, seed=seed, resamples=resamples)
            rows = audit_mod.main_arm(rows, audits)
            _check_study(audits, study_set, abort_on_drift)
        data = build(rows, missing_tasks=missing_tasks, unbalanced=unbalanced)
        settings = Settings(resamples, seed, plan, tuple(_pair(c) for c in contrasts),
                            tuple(compare_batches) if compare_batches else None, top)
        result: Analysis = analyze(data, settings, progress_bar("bootstrap", progress, final=False))
    except NoisefloorError as exc:
        raise click.ClickException(visible(str(exc))) from None
    doc = result.to_json()
    notes = audit_checks.drift_messages(audits or []) + audit_checks.excluded_messages(audits or [])
    doc["warnings"] = [*doc["warnings"], *notes]
    if log_doc is not None:
        doc["log"] = log_doc
    if audits is not None:
        doc["floors"] = floors_report.to_json(audits)
    kept = logstats_study(logs)
    if kept:
        doc.update({k: v for k, v in kept.items() if k in ("design", "provenance", "judge_parse", "truth")})
    gate_sec = _gate_section(rows)
    if gate_sec is not None:
        doc["gate"] = gate_sec.to_json()
    if not quiet and json_path != "-":
        click.echo(report.table(result, log_doc))
        if audits is not None:
            click.echo("\n" + floors_report.table(audits))
        if kept and kept.get("judge_parse"):
            click.echo("\njudge replies: " + "; ".join(f"{c}: {', '.join(f'{k} {n}' for k, n in sorted(v.items()))}"
                                                     for c, v in kept["judge_parse"].items()))
        if kept and kept.get("provenance"):
            pv = kept["provenance"]
            click.echo(f"\nprovenance (kept by nfladder): design {kept.get('design')}, recording {pv.get('recording_id')}, "
                       f"task set sha256 {str((pv.get('task_set') or {}).get('sha256'))[:16]}..., models requested "
                       f"{', '.join((pv.get('models') or {}).get('requested') or []) or '-'}, served "
                       f"{', '.join((pv.get('models') or {}).get('served') or []) or '-'}")
        if gate_sec is not None:
            click.echo("\ngate: " + (f"refused ({gate_sec.refused})" if gate_sec.refused else ", ".join(
                f"{n} {k}" for k, n in gate_sec.counts().items()) + f"; re-run to k>8: {', '.join(gate_sec.escalated) or 'none'}"))
        for w in notes:
            click.echo(f"warning: {visible(w)}")
    if json_path:
        report.write_json(doc, json_path)
    if md_path:
        outputs.write_text(md_path, report.markdown(result, log_doc, floors_report.markdown(audits) if audits else None))
    if plot_path:
        report.plot(result, plot_path)
        if not quiet:
            click.echo(f"plot written to {plot_path}", err=True)


def logstats_study(logs: tuple[Path, ...]) -> dict | None:
    if not logs:
        return None
    from noisefloor.analyzer import logstats

    return logstats.study(list(logs))


def _gate_section(rows: list) -> Any:
    """The gate of nfladder's gate design, when the rows hold its three collections."""
    from noisefloor.analyzer import gate as g
    from noisefloor.analyzer import gate_run

    names = {r.condition for r in rows}
    if not set(g.GATE_CONDITIONS) <= names:
        return None
    runs = [g.run_of([r for r in rows if r.condition == n]) for n in g.GATE_CONDITIONS]
    return gate_run.section(runs)


def _check_study(audits: list[audit_mod.EndpointAudit], expected: str | None, abort_on_drift: bool) -> None:
    audit_checks.check_study_set(audits, expected)
    drifted = audit_checks.drift_messages(audits)
    if drifted and abort_on_drift:
        click.echo(f"Error: {visible(drifted[0])}; rerun on one model or split the endpoint (or pass --allow-drift)", err=True)
        sys.exit(EXIT_DRIFT)


@main.command("gate")
@click.argument("base_a", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("base_b", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("candidate", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--slack", default=0.05, show_default=True, type=float, help="Jitter below the floor tolerated.")
@click.option("--flake-band", default=0.25, show_default=True, type=float,
              help="Baseline-vs-baseline gap above which a case is quarantined.")
@click.option("--confidence", default=0.95, show_default=True, type=click.FloatRange(0.5, 0.9999),
              help="One-sided level of the Wilson bounds (at 0.95, z = 1.645 as seed 004 writes it).")
@click.option("--exact-z", is_flag=True, help="Use the exact normal quantile (1.6448536 at 0.95) instead of 1.645.")
@click.option("--escalate-at", default=16, show_default=True, type=click.IntRange(min=1),
              help="Repeats at which a candidate still below the floor is a regression (seed 004: k=16).")
@click.option("--multiplicity", type=click.Choice(["none", "holm", "bh"]), default="none", show_default=True,
              help="Control the suite's false-block rate: a regression must also be significant after Holm "
                   "(family-wise) or Benjamini-Hochberg (false discovery) adjustment over the cases.")
@click.option("--alpha", default=0.05, show_default=True, type=click.FloatRange(0.0001, 0.5),
              help="Level of the --multiplicity mode.")
@click.option("--target-false-block", default=0.05, show_default=True, type=click.FloatRange(0.0001, 0.5),
              help="Suite false-block rate the printed repeats plan aims under.")
@click.option("--condition", help="Use only rows of this condition (a file holding several must name one).")
@click.option("--allow-unstamped", is_flag=True,
              help="Compare runs without model / sampling / grader stamps (seed 004 refuses: exit 2).")
@click.option("--json", "json_path", metavar="PATH", help="Write the verdicts as JSON ('-': stdout, which then holds "
              "only the JSON; the text goes to stderr).")
@click.option("--junit-xml", "junit_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write JUnit XML for CI: one test case per case, a regression as a failure.")
@click.option("--markdown", "md_path", metavar="PATH",
              help="Write a Markdown summary for a CI step (e.g. $GITHUB_STEP_SUMMARY; '-' for stdout).")
def gate_cmd(base_a: Path, base_b: Path, candidate: Path, slack: float, flake_band: float, confidence: float,
             exact_z: bool, escalate_at: int, multiplicity: str, alpha: float, target_false_block: float,
             condition: str | None, allow_unstamped: bool, json_path: str | None, junit_path: Path | None,
             md_path: str | None) -> None:
    """Per-case verdicts for a candidate run against two baseline runs of the same stamp.

    Each file holds outcome rows (task_id, replicate, outcome; condition optional; the stamp
    fields model, temperature / top_p / seed and grader_version). Exit status: 1 when a case
    regressed, 2 when the stamps differ or are missing.
    """
    from noisefloor.analyzer import gate as g
    from noisefloor.analyzer import gate_run

    if json_path == "-" and md_path == "-":
        raise click.UsageError("--json - and --markdown - would both write stdout; send one of them to a file")
    for path, option in ((json_path, "--json"), (junit_path, "--junit-xml"), (md_path, "--markdown")):
        outputs.check_writable(path, option)  # before any work
    settings = g.GateSettings(z=g.z_for(confidence, exact_z), slack=slack, flake_band=flake_band,
                              escalate_at=escalate_at, multiplicity=multiplicity, alpha=alpha)
    try:
        result = gate_run.run_files(base_a, base_b, candidate, settings, condition=condition,
                                    allow_unstamped=allow_unstamped, target_false_block=target_false_block)
    except gate_run.StampError as exc:
        click.echo(f"Error: {visible(str(exc))}", err=True)
        sys.exit(EXIT_STAMPS)
    except OutcomeError as exc:
        raise click.ClickException(visible(str(exc))) from None
    to_err = json_path == "-" or md_path == "-"  # stdout holds only the machine-readable document
    oc = result.operating_characteristics
    risk = {r.case_id: r for r in oc.cases}
    for v in result.verdicts:
        extra = ""
        if v.verdict == "inconclusive":
            extra = f"; re-run it at k={escalate_at}"
            if v.more_repeats == 0:
                extra += " (its one-sided Wilson upper bound is already below the floor)"
            elif v.more_repeats is not None:
                extra += f" ({v.more_repeats} more repeats at its rate would put it clearly below)"
        r = risk[v.case_id]
        adj = f", adjusted p {v.adjusted_p:.3g}" if v.adjusted_p is not None else ""
        click.echo(f"{visible(v.case_id)}: {v.verdict} (baseline {v.base_a.passes}/{v.base_a.n}, {v.base_b.passes}/{v.base_b.n}; "
                   f"candidate {v.candidate.passes}/{v.candidate.n}; floor {v.floor:.3f}{adj}{extra}; "
                   f"if unchanged: P(regressed) {r.false_regressed:.3f}, P(quarantine) {r.false_quarantine:.3f})",
                   err=to_err)
    counts = result.counts
    click.echo("gate: " + ", ".join(f"{n} {k}" for k, n in counts.items()), err=to_err)
    plan = (f"{oc.repeats_for_target} repeats per run bring it under {oc.target:.0%}" if oc.repeats_for_target
            else f"no repeats count up to 1024 brings it under {oc.target:.0%}")
    click.echo(f"operating characteristics (an unchanged model at each case's pooled baseline rate, cases "
               f"independent, one-sided {confidence:.0%} Wilson with z = {settings.z:.7g}, slack {slack}, flake band {flake_band}, "
               f"multiplicity {multiplicity}): the suite blocks with probability {oc.suite_false_block:.3f} "
               f"({oc.suite_false_block_escalated:.3f} with inconclusive cases re-run at k={escalate_at}); {plan}",
               err=to_err)
    if json_path:
        doc = result.to_json()
        doc.pop("settings")
        doc["z"] = settings.z
        report.write_json(doc, json_path)
    if junit_path:
        junit_path.write_bytes(gate_run.junit_xml(result))
    if md_path:
        text = gate_run.markdown(result)
        if md_path == "-":
            click.echo(text, nl=False)
        else:
            with open(md_path, "a", encoding="utf-8") as fh:  # a step summary file collects several steps
                fh.write(text)
    sys.exit(EXIT_REGRESSED if result.regressed else EXIT_OK)


if __name__ == "__main__":
    main()
