"""`nfanalyze`: determinism-ladder statistics from outcome rows (and, optionally, the proxy log)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from noisefloor.analyzer import audit as audit_mod
from noisefloor.analyzer import report
from noisefloor.analyzer.analysis import Analysis, Settings, analyze
from noisefloor.analyzer.ladder import Planning
from noisefloor.analyzer.outcomes import OutcomeError, build, parse_rows, read_rows


def _progress_bar(enabled: bool | None) -> Callable[[int, int], None]:
    """A bar on stderr, shown only once the bootstrap has taken more than a second."""
    start = time.monotonic()
    show = sys.stderr.isatty() if enabled is None else enabled
    drawn = False

    def update(done: int, total: int) -> None:
        nonlocal drawn
        if not show or (time.monotonic() - start < 1.0 and not drawn):
            return
        drawn = True
        filled = int(30 * done / total)
        sys.stderr.write(f"\rbootstrap [{'#' * filled}{' ' * (30 - filled)}] {done}/{total}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return update


def _pair(text: str) -> tuple[str, str]:
    a, sep, b = text.partition(":")
    if not sep or not a or not b:
        raise click.BadParameter(f"{text!r} is not A:B (two condition names)", param_hint="--contrast")
    return a, b


class _DefaultToAnalyze(click.Group):
    """`nfanalyze LOG --outcomes F` means `nfanalyze analyze LOG --outcomes F`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["analyze", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultToAnalyze, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Noise-floor statistics: the determinism ladder (default), floors, and a per-case regression gate."""


@main.command("analyze")
@click.argument("log", required=False, type=click.Path(path_type=Path))
@click.option("--outcomes", type=click.Path(path_type=Path), help="Outcome rows: .jsonl or .csv (task_id, condition, replicate, outcome).")
@click.option("--example", is_flag=True, help="Analyze a built-in simulated ladder (live, t0, replay) with known truth.")
@click.option("--json", "json_path", metavar="PATH", help="Write the JSON report ('-' for stdout).")
@click.option("--markdown", "md_path", type=click.Path(path_type=Path), help="Write a Markdown report.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), help="Write the ladder plot (PNG).")
@click.option("--bootstrap", "resamples", default=20_000, show_default=True, type=click.IntRange(min=1))
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
@click.option("--abort-on-drift", is_flag=True, help="Exit 4 when an endpoint's served model changed within the study.")
@click.option("-q", "--quiet", is_flag=True, help="No table on stdout.")
def analyze_cmd(log: Path | None, outcomes: Path | None, example: bool, json_path: str | None, md_path: Path | None,
                plot_path: Path | None, resamples: int, seed: int, delta: float, alpha: float, power: float,
                contrasts: tuple[str, ...], compare_batches: tuple[str, str] | None, missing_tasks: str,
                unbalanced: str, top: int, progress: bool | None, floors_flag: bool | None, study_set: str | None,
                abort_on_drift: bool, quiet: bool) -> None:
    """Within-task variance, joint task-bootstrap intervals, contrasts and rerun budgets per condition.

    LOG is an optional nfproxy store whose exchanges add per-condition call, miss and token counts.
    """
    if not outcomes and not example and not log:
        raise click.UsageError("give --outcomes FILE (or a LOG, or --example)")
    log_doc = None
    if log is not None:
        from noisefloor.analyzer.logstats import from_store
        from noisefloor.proxy.store import StoreError

        try:
            log_doc = from_store(log)
        except StoreError as exc:
            raise click.ClickException(str(exc)) from None
    if not outcomes and not example:
        assert log_doc is not None
        for cond, s in log_doc["conditions"].items():
            click.echo(f"{cond}: {s}")
        return
    audits = None
    try:
        plan = Planning(delta, alpha, power)
        if example:
            from noisefloor.analyzer.simulate import example as make_example

            rows = list(make_example().rows)
        else:
            assert outcomes is not None
            rows = parse_rows(read_rows(outcomes), str(outcomes))
        if floors_flag or (floors_flag is None and audit_mod.is_audit(rows)):
            audits = audit_mod.audit(rows, seed=seed)
            rows = audit_mod.main_arm(rows)
            _check_study(audits, study_set, abort_on_drift)
        data = build(rows, missing_tasks=missing_tasks, unbalanced=unbalanced)
        settings = Settings(resamples, seed, plan, tuple(_pair(c) for c in contrasts),
                            tuple(compare_batches) if compare_batches else None, top)
        result: Analysis = analyze(data, settings, _progress_bar(progress))
    except (OutcomeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    doc = result.to_json()
    if log_doc is not None:
        doc["log"] = log_doc
    if audits is not None:
        doc["floors"] = audit_mod.to_json(audits)
    if not quiet and json_path != "-":
        click.echo(report.table(result, log_doc))
        if audits is not None:
            click.echo("\n" + audit_mod.table(audits))
    if json_path:
        report.write_json(doc, json_path)
    if md_path:
        md_path.write_text(report.markdown(result, log_doc))
    if plot_path:
        report.plot(result, plot_path)
        if not quiet:
            click.echo(f"plot written to {plot_path}", err=True)


def _check_study(audits: list[audit_mod.EndpointAudit], expected: str | None, abort_on_drift: bool) -> None:
    for a in audits:
        if expected and a.study_set != expected:
            raise click.ClickException(f"endpoint {a.endpoint!r}: the study set changed (sha256 {a.study_set[:16]}..., "
                                       f"expected {expected[:16]}...); compare only runs on the frozen instance list")
        if a.drift and abort_on_drift:
            click.echo(f"Error: endpoint {a.endpoint!r} changed served model within the study "
                       f"({', '.join(a.models)}); rerun on one model or split the endpoint", err=True)
            sys.exit(4)


@main.command("gate")
@click.argument("base_a", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("base_b", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("candidate", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--slack", default=0.05, show_default=True, type=float, help="Jitter below the floor tolerated.")
@click.option("--flake-band", default=0.25, show_default=True, type=float,
              help="Baseline-vs-baseline gap above which a case is quarantined.")
@click.option("--confidence", default=0.95, show_default=True, type=click.FloatRange(0.5, 0.9999),
              help="One-sided level of the Wilson bounds.")
@click.option("--json", "json_path", metavar="PATH", help="Write the verdicts as JSON ('-' for stdout).")
def gate_cmd(base_a: Path, base_b: Path, candidate: Path, slack: float, flake_band: float, confidence: float,
             json_path: str | None) -> None:
    """Per-case verdicts for a candidate run against two baseline runs of the same stamp.

    Each file holds outcome rows (task_id, outcome, replicate; optional model, temperature,
    top_p, seed, grader_version). Exit status: 1 when a case regressed, 2 when the stamps differ.
    """
    from scipy import special

    from noisefloor.analyzer import gate as g

    runs = [_gate_run(p) for p in (base_a, base_b, candidate)]
    stamps = {r[1] for r in runs}
    if len(stamps) != 1:
        parts = [f"{p.name}: {r[2]}" for p, r in zip((base_a, base_b, candidate), runs)]
        click.echo("Error: refusing to compare runs with different stamps (model, sampling, grader, cases): "
                   + "; ".join(parts), err=True)
        sys.exit(2)
    settings = g.GateSettings(z=float(special.ndtri(confidence)), slack=slack, flake_band=flake_band)
    verdicts = g.gate(runs[0][0], runs[1][0], runs[2][0], settings)
    for v in verdicts:
        extra = f", {v.more_repeats} more repeats would decide it" if v.more_repeats is not None else ""
        click.echo(f"{v.case_id}: {v.verdict} (baseline {v.base_a.passes}/{v.base_a.n}, {v.base_b.passes}/{v.base_b.n}; "
                   f"candidate {v.candidate.passes}/{v.candidate.n}; floor {v.floor:.3f}{extra})")
    counts = {k: sum(v.verdict == k for v in verdicts) for k in ("within_noise", "inconclusive", "regressed", "quarantine")}
    click.echo("gate: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    if json_path:
        from dataclasses import asdict

        report.write_json({"stamp": runs[0][1], "verdicts": [asdict(v) for v in verdicts], "counts": counts}, json_path)
    sys.exit(1 if counts["regressed"] else 0)


def _gate_run(path: Path) -> tuple[dict, str, str]:
    """Per-case counts, the stamp, and a readable description of the stamp."""
    from noisefloor.analyzer import gate as g

    try:
        raw = list(read_rows(path))
        rows = parse_rows(raw, str(path))
    except OutcomeError as exc:
        raise click.ClickException(str(exc)) from None
    counts: dict[str, list[int]] = {}
    for r in rows:
        c = counts.setdefault(r.task_id, [0, 0])
        c[0] += r.outcome
        c[1] += 1
    recs = [rec for _, rec in raw]
    model = ",".join(sorted({str(x["model"]) for x in recs if x.get("model")})) or None
    sampling = {k: sorted({str(x[k]) for x in recs if x.get(k) not in (None, "")}) for k in ("temperature", "top_p", "seed")}
    sampling = {k: v for k, v in sampling.items() if v}
    grader = ",".join(sorted({str(x["grader_version"]) for x in recs if x.get("grader_version")})) or None
    stamp = g.stamp(model, sampling, grader, list(counts))
    desc = f"model={model} sampling={sampling} grader={grader} cases={len(counts)} -> {stamp}"
    return {k: g.CaseCounts(p, n) for k, (p, n) in counts.items()}, stamp, desc


if __name__ == "__main__":
    main()
