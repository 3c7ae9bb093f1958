"""`nfanalyze gate`: per-case verdicts of a candidate run against two baseline runs, printed and
written for CI (JSON, JUnit XML, Markdown); registered on nfanalyze's group."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from noisefloor import outputs
from noisefloor.analyzer import report
from noisefloor.display import visible
from noisefloor.errors import EXIT_OK, EXIT_REGRESSED, EXIT_STAMPS


@click.command("gate")
@click.argument("base_a", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("base_b", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("candidate", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--slack", default=0.05, show_default=True, type=float, help="Jitter below the floor tolerated.")
@click.option("--flake-band", default=0.25, show_default=True, type=float,
              help="Baseline-vs-baseline gap above which a case is quarantined.")
@click.option("--confidence", default=0.95, show_default=True, type=click.FloatRange(0.5, 0.9999),
              help="One-sided level of the Wilson bounds (at 0.95, z = 1.645, rounded as commonly tabulated).")
@click.option("--exact-z", is_flag=True, help="Use the exact normal quantile (1.6448536 at 0.95) instead of 1.645.")
@click.option("--escalate-at", default=16, show_default=True, type=click.IntRange(min=1),
              help="Repeats at which a candidate still below the floor is a regression.")
@click.option("--multiplicity", type=click.Choice(["none", "holm", "bh"]), default="none", show_default=True,
              help="Control the suite's false-block rate: a regression must also be significant after Holm "
                   "(family-wise) or Benjamini-Hochberg (false discovery) adjustment over the cases.")
@click.option("--alpha", default=0.05, show_default=True, type=click.FloatRange(0.0001, 0.5),
              help="Level of the --multiplicity mode.")
@click.option("--target-false-block", default=0.05, show_default=True, type=click.FloatRange(0.0001, 0.5),
              help="Suite false-block rate the printed repeats plan aims under.")
@click.option("--condition", help="Use only rows of this condition (a file holding several must name one).")
@click.option("--allow-unstamped", is_flag=True,
              help="Compare runs without model / sampling / grader stamps (refused by default: exit 2).")
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
    _print(result, settings, confidence, to_err=json_path == "-" or md_path == "-")  # stdout: the document only
    _write(result, settings, json_path, junit_path, md_path)
    sys.exit(EXIT_REGRESSED if result.regressed else EXIT_OK)


def _print(result: Any, settings: Any, confidence: float, to_err: bool) -> None:
    oc = result.operating_characteristics
    risk = {r.case_id: r for r in oc.cases}
    k = settings.escalate_at
    for v in result.verdicts:
        extra = ""
        if v.verdict == "inconclusive":
            extra = f"; re-run it at k={k}"
            if v.more_repeats == 0:
                extra += " (its one-sided Wilson upper bound is already below the floor)"
            elif v.more_repeats is not None:
                extra += f" ({v.more_repeats} more repeats at its rate would put it clearly below)"
        r = risk[v.case_id]
        adj = f", adjusted p {v.adjusted_p:.3g}" if v.adjusted_p is not None else ""
        click.echo(f"{visible(v.case_id)}: {v.verdict} (baseline {v.base_a.passes}/{v.base_a.n}, {v.base_b.passes}/"
                   f"{v.base_b.n}; candidate {v.candidate.passes}/{v.candidate.n}; floor {v.floor:.3f}{adj}{extra}; "
                   f"if unchanged: P(regressed) {r.false_regressed:.3f}, P(quarantine) {r.false_quarantine:.3f})",
                   err=to_err)
    click.echo("gate: " + ", ".join(f"{n} {c}" for c, n in result.counts.items()), err=to_err)
    plan = (f"{oc.repeats_for_target} repeats per run bring it under {oc.target:.0%}" if oc.repeats_for_target
            else f"no repeats count up to 1024 brings it under {oc.target:.0%}")
    click.echo(f"operating characteristics (an unchanged model at each case's pooled baseline rate, cases "
               f"independent, one-sided {confidence:.0%} Wilson with z = {settings.z:.7g}, slack {settings.slack}, "
               f"flake band {settings.flake_band}, multiplicity {settings.multiplicity}): the suite blocks with "
               f"probability {oc.suite_false_block:.3f} ({oc.suite_false_block_escalated:.3f} with inconclusive "
               f"cases re-run at k={k}); {plan}", err=to_err)


def _write(result: Any, settings: Any, json_path: str | None, junit_path: Path | None, md_path: str | None) -> None:
    from noisefloor.analyzer import gate_run

    if json_path:
        doc = result.to_json()
        doc.pop("settings")
        doc["z"] = settings.z
        report.write_json(doc, json_path)
    if junit_path:
        with outputs.atomic_path(junit_path) as tmp:  # a CI reader never sees half a report
            tmp.write_bytes(gate_run.junit_xml(result))
    if md_path:
        text = gate_run.markdown(result)
        if md_path == "-":
            click.echo(text, nl=False)
        else:
            with open(md_path, "a", encoding="utf-8") as fh:  # a step summary file collects several steps
                fh.write(text)


def register(group: click.Group) -> None:
    group.add_command(gate_cmd)
