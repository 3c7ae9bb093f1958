"""`nfverify`: grade candidates by execution (HumanEval+ / MBPP+) or by AST (BFCL), write outcome rows."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from noisefloor import exit_codes
from noisefloor._cli import VERSION, Command
from noisefloor.outcome_rows import OutcomeRow, write_jsonl
from noisefloor.outputs import check_writable
from noisefloor.verifier.grading import GradeOptions, grade_options
from noisefloor.verifier.resume import Progress

SUITES = ("humaneval+", "mbpp+", "bfcl")


def _summary(rows: list[OutcomeRow], out: Path) -> str:
    by = Counter(r.failure for r in rows)
    passed = sum(r.outcome for r in rows)
    return f"nfverify: {passed}/{len(rows)} passed; " + ", ".join(f"{k} {v}" for k, v in by.most_common()) + f" -> {out}"


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(**VERSION)
@click.argument("suite", type=click.Choice(SUITES))
@click.argument("logs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--samples", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="EvalPlus samples.jsonl (task_id with solution or completion) instead of LOGs.")
@click.option("--dataset", type=click.Path(exists=True, path_type=Path),
              help="EvalPlus .jsonl(.gz) file, or the folder of BFCL v4 files (default: shared data or cache).")
@click.option("--outcomes", "out", type=click.Path(dir_okay=False, path_type=Path), default=Path("outcomes.jsonl"),
              show_default=True, help="Outcome rows are written here (JSON Lines); graded from a LOG, they are also "
                                      "kept in the log for `nfanalyze LOG`.")
@click.option("-j", "--jobs", default=os.cpu_count() or 1, show_default=True, type=click.IntRange(min=1))
@grade_options
@click.option("--condition", default="samples", show_default=True, help="Condition label for --samples rows.")
@click.option("--function-names", type=click.Choice(["underscore", "declared"]), default="underscore", show_default=True,
              help="bfcl: the spelling a call must use, as BFCL's model config implies: underscore (API models: "
                   "math.factorial is called math_factorial) or declared (configs that keep dots).")
@click.option("--parallel-matching", type=click.Choice(["first-fit", "bipartite"]), default="first-fit",
              show_default=True, help="bfcl: first-fit is BFCL's order-dependent rule; bipartite accepts any "
                                      "assignment of calls to answers (departs from BFCL).")
def main(suite: str, logs: tuple[Path, ...], samples: Path | None, dataset: Path | None, out: Path, jobs: int,
         max_inputs: int, timeout: int, memory_mb: int, isolation: str | None, condition: str, function_names: str,
         parallel_matching: str) -> None:
    """Grade SUITE candidates from nfproxy LOGs (one per session; several stores are shards of one
    study) or from --samples."""
    from noisefloor.verifier.verify import open_log

    if bool(logs) == (samples is not None):
        raise click.UsageError("give either nfproxy LOGs or --samples FILE")
    if suite == "bfcl" and samples is not None:
        raise click.UsageError("bfcl grades tool calls from a LOG; --samples is for humaneval+ and mbpp+")
    check_writable(out, "--outcomes")  # before any work: a missing folder must not cost a whole grading run
    for log in logs:
        open_log(log).close()  # a wrong path is the user's first problem, before any dataset work
    identity = {"suite": suite, "logs": [str(p.resolve()) for p in logs],
                "samples": str(samples.resolve()) if samples else None,
                "dataset": str(dataset.resolve()) if dataset else None, "condition": condition,
                "grading": [max_inputs, timeout, memory_mb, isolation, function_names, parallel_matching]}
    progress = Progress(out, identity)
    if progress.done:
        click.echo(f"nfverify: resuming: {len(progress.done)} rows already graded in {progress.path}", err=True)
    elif progress.stale:
        click.echo(f"nfverify: {progress.path} is from another command; grading from the start", err=True)
    try:
        with _interrupts():
            if suite == "bfcl":
                rows = _bfcl(logs, dataset, progress, function_names, parallel_matching)
            else:
                rows = _code(suite, logs, samples, dataset, GradeOptions(jobs, max_inputs, timeout, memory_mb,
                                                                          isolation), condition, progress)
    except _Interrupted as stop:
        progress.close()
        graded = list(progress.done.values())
        _keep(logs, graded, progress.where)  # the log keeps what is graded too, as after a whole run
        click.echo(f"nfverify: interrupted; {len(graded)} graded rows kept in {progress.path}; run the same "
                   "command again to grade only the rest", err=True)
        raise SystemExit(stop.code) from None
    finally:
        progress.close()
    write_jsonl(rows, out)
    progress.finish()
    _keep(logs, rows, progress.where)
    click.echo(_summary(rows, out), err=True)


def _keep(logs: tuple[Path, ...], rows: list[OutcomeRow], where: dict[str, Path]) -> None:
    from noisefloor.verifier.verify import keep_in_log

    for log in logs:
        keep_in_log(log, [r for r in rows if where.get(r.session or "") == log])


class _Interrupted(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@contextmanager
def _interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM end grading with 130 / 143 (the shell's convention) after what is
    running finishes; graded rows are already in the partial file."""
    def on_term(signum: int, frame: Any) -> None:
        raise _Interrupted(exit_codes.TERMINATED)

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    except KeyboardInterrupt:
        raise _Interrupted(exit_codes.INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, old)


def _code(suite: str, logs: tuple[Path, ...], samples: Path | None, dataset: Path | None, options: GradeOptions,
          condition: str, progress: Progress) -> list[OutcomeRow]:
    from noisefloor.verifier.datasets import locate
    from noisefloor.verifier.grading import code_grader
    from noisefloor.verifier.verify import code_rows

    diff = code_grader(suite, locate(suite, dataset), options)
    with diff.sandbox:  # its fork servers and their root folder go with it
        return code_rows(suite, diff, logs, samples, condition, progress)


def _bfcl(logs: tuple[Path, ...], dataset: Path | None, progress: Progress, names: str = "underscore",
          parallel: str = "first-fit") -> list[OutcomeRow]:
    from noisefloor.verifier.bfcl import Rules
    from noisefloor.verifier.verify import bfcl_rows

    rules = Rules(names=names, parallel=parallel)  # type: ignore[arg-type]
    if rules.departs():
        click.echo(f"nfverify: {rules.departs()}", err=True)
    return bfcl_rows(logs, dataset, progress, rules)


if __name__ == "__main__":
    main()
