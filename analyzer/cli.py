"""`nfanalyze`: determinism-ladder statistics from outcome rows (and, optionally, the proxy log)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from analyzer import report
from analyzer.analysis import Analysis, Settings, analyze
from analyzer.ladder import Planning
from analyzer.outcomes import OutcomeError, build, load


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


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option("-q", "--quiet", is_flag=True, help="No table on stdout.")
def main(log: Path | None, outcomes: Path | None, example: bool, json_path: str | None, md_path: Path | None,
         plot_path: Path | None, resamples: int, seed: int, delta: float, alpha: float, power: float,
         contrasts: tuple[str, ...], compare_batches: tuple[str, str] | None, missing_tasks: str, unbalanced: str,
         top: int, progress: bool | None, quiet: bool) -> None:
    """Within-task variance, joint task-bootstrap intervals, contrasts and rerun budgets per condition.

    LOG is an optional nfproxy store whose exchanges add per-condition call, miss and token counts.
    """
    if not outcomes and not example and not log:
        raise click.UsageError("give --outcomes FILE (or a LOG, or --example)")
    log_doc = None
    if log is not None:
        from analyzer.logstats import from_store
        from proxy.store import StoreError

        try:
            log_doc = from_store(log)
        except StoreError as exc:
            raise click.ClickException(str(exc)) from None
    if not outcomes and not example:
        assert log_doc is not None
        for cond, s in log_doc["conditions"].items():
            click.echo(f"{cond}: {s}")
        return
    try:
        plan = Planning(delta, alpha, power)
        if example:
            from analyzer.simulate import example as make_example

            data = build(make_example().rows)
        else:
            assert outcomes is not None
            data = load(outcomes, missing_tasks=missing_tasks, unbalanced=unbalanced)
        settings = Settings(resamples, seed, plan, tuple(_pair(c) for c in contrasts),
                            tuple(compare_batches) if compare_batches else None, top)
        result: Analysis = analyze(data, settings, _progress_bar(progress))
    except (OutcomeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    doc = result.to_json()
    if log_doc is not None:
        doc["log"] = log_doc
    if not quiet and json_path != "-":
        click.echo(report.table(result, log_doc))
    if json_path:
        report.write_json(doc, json_path)
    if md_path:
        md_path.write_text(report.markdown(result, log_doc))
    if plot_path:
        report.plot(result, plot_path)
        if not quiet:
            click.echo(f"plot written to {plot_path}", err=True)


if __name__ == "__main__":
    main()
