"""`nfverify`: grade candidates by execution (HumanEval+ / MBPP+) or by AST (BFCL), write outcome rows."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from noisefloor._cli import VERSION, Command, progress_bar
from noisefloor.outcome_rows import OutcomeRow, write_jsonl
from noisefloor.verifier.grading import GradeOptions, grade_options
from noisefloor.verifier.resume import Progress, attempt_key

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
    from noisefloor.proxy.store import StoreError
    from noisefloor.verifier.datasets import DatasetError
    from noisefloor.verifier.sandbox import SandboxError

    options = GradeOptions(jobs, max_inputs, timeout, memory_mb, isolation)
    if bool(logs) == (samples is not None):
        raise click.UsageError("give either nfproxy LOGs or --samples FILE")
    if suite == "bfcl" and samples is not None:
        raise click.UsageError("bfcl grades tool calls from a LOG; --samples is for humaneval+ and mbpp+")
    _check_writable(out)  # before any work: a missing folder must not cost a whole grading run
    for log in logs:
        _open_log(log).close()  # a wrong path is the user's first problem, before any dataset work
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
            rows, where = (_bfcl(logs, dataset, progress, function_names, parallel_matching) if suite == "bfcl"
                           else _code(suite, logs, samples, dataset, options, condition, progress))
    except (DatasetError, SandboxError, StoreError) as exc:
        progress.close()
        raise click.ClickException(str(exc)) from None
    except _Interrupted as stop:
        progress.close()
        graded = list(progress.done.values())
        for log in logs:  # the log keeps what is graded too, as it does after a whole run
            _keep_in_log(log, [r for r in graded if progress.where.get(r.session or "") == log])
        click.echo(f"nfverify: interrupted; {len(graded)} graded rows kept in {progress.path}; run the same "
                   "command again to grade only the rest", err=True)
        raise SystemExit(stop.code) from None
    write_jsonl(rows, out)
    progress.finish()
    for log in logs:
        _keep_in_log(log, [r for r in rows if where.get(r.session or "") == log])
    click.echo(_summary(rows, out), err=True)


class _Interrupted(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@contextmanager
def _interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM end grading with 130 / 143 (the shell's convention) after what is
    running finishes; graded rows are already in the partial file."""
    def on_term(signum: int, frame: Any) -> None:
        raise _Interrupted(143)

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    except KeyboardInterrupt:
        raise _Interrupted(130) from None
    finally:
        signal.signal(signal.SIGTERM, old)


def _check_writable(out: Path) -> None:
    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir():
        raise click.ClickException(f"cannot write {out}: folder {folder} does not exist; create it or pass "
                                   "--outcomes PATH in an existing folder")
    if out.is_dir():
        raise click.ClickException(f"cannot write {out}: it is a folder; pass --outcomes FILE")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.ClickException(f"cannot write {out}: folder {folder} is not writable; pass --outcomes PATH "
                                   "in a folder you can write")


def _keep_in_log(log: Path, rows: list[OutcomeRow]) -> None:
    """The rows also go into the log beside the exchanges they grade: `nfanalyze LOG` needs nothing else."""
    from noisefloor.proxy.store import Store, StoreError
    from noisefloor.proxy.store_env import is_read_only

    if not rows:
        return
    if is_read_only(log):
        click.echo(f"nfverify: {log} is read-only; outcome rows are only in the outcomes file", err=True)
        return
    try:
        with Store.open(log, write=True) as store:
            store.put_outcomes([r.to_json() for r in rows])
    except StoreError as exc:
        click.echo(f"nfverify: outcome rows not kept in the log ({exc}); they are in the outcomes file", err=True)


def _open_log(log: Path) -> Any:
    from noisefloor.proxy.store import Store

    return Store.open(log, write=False)  # a StoreError is one line: the command's error handling


def _log_attempts(logs: tuple[Path, ...], prompts: dict[str, str]) -> tuple[list[Any], dict[str, Path]]:
    """Every store's attempts, and which store each session is in; a session in two stores is refused."""
    from noisefloor.verifier.candidates import attempts

    found: list[Any] = []
    where: dict[str, Path] = {}
    for log in logs:
        with _open_log(log) as store:
            for a in attempts(store, prompts):
                if a.session in where:
                    raise click.ClickException(f"session {a.session!r} is in {where[a.session]} and in {log}: the "
                                               "stores are not shards of one study; grade them apart")
                where[a.session] = log
                found.append(a)
    return found, where


def _code(suite: str, logs: tuple[Path, ...], samples: Path | None, dataset: Path | None, options: GradeOptions,
          condition: str, progress: Progress) -> tuple[list[OutcomeRow], dict[str, Path]]:
    from noisefloor.verifier.datasets import locate
    from noisefloor.verifier.differential import ExpectedError
    from noisefloor.verifier.grading import code_grader

    path = locate(suite, dataset)
    diff = code_grader(suite, path, options)
    with diff.sandbox:  # its fork servers and their root folder go with it
        tasks = list(diff.tasks.values())
        if samples is not None:
            items, meta = _read_samples(samples, diff.tasks, condition)
            where: dict[str, Path] = {}
        else:
            from noisefloor.verifier.candidates import response_text

            found, where = _log_attempts(logs, {t.task_id: t.prompt for t in tasks})
            progress.where = where
            unknown = [a.session for a in found if a.task_id not in diff.tasks]
            if unknown:
                click.echo(f"nfverify: {len(unknown)} sessions match no {suite} task and are skipped "
                           f"(e.g. {unknown[0]}); label them with x-nf-task", err=True)
            found = [a for a in found if a.task_id in diff.tasks]
            items = [(a.task_id, response_text(a.body)) for a in found]
            meta = [_attempt_meta(a) for a in found]
        keys = [attempt_key({**m, "task_id": it[0]}) for it, m in zip(items, meta)]
        todo = [i for i, k in enumerate(keys) if k not in progress.done]
        if todo:
            try:
                diff.expected(progress_bar("reference outputs", delay=0))
            except ExpectedError as exc:
                raise click.ClickException(f"{exc}; check the dataset file, or raise --memory-mb") from None

            def keep(j: int, v: Any) -> None:
                i = todo[j]
                progress.add(OutcomeRow(task_id=v.task_id, outcome=v.outcome, failure=v.failure, detail=v.detail,
                                        **meta[i]))

            diff.grade_many([items[i] for i in todo], progress_bar("grading", delay=0), programs=samples is not None,
                            on_verdict=keep)
        return [progress.done[k] for k in keys], where


def _attempt_meta(a: Any) -> dict[str, Any]:
    ex = a.exchange
    return {"condition": a.condition, "replicate": a.replicate, "session": a.session,
            "fingerprint": ex.fingerprint if ex else None, "model": ex.model if ex else None}


def _read_samples(path: Path, tasks: dict[str, Any], condition: str) -> tuple[list[tuple[str, str]], list[dict]]:
    items, meta = [], []
    seen: dict[str, int] = defaultdict(int)
    with path.open() as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                raise click.ClickException(f"{path}:{n}: not JSON; samples are JSON Lines with task_id and solution") from None
            tid = doc.get("task_id")
            if tid not in tasks:
                raise click.ClickException(f"{path}:{n}: unknown task_id {tid!r} for this dataset")
            if "solution" in doc:
                program = doc["solution"]
            elif "completion" in doc:
                program = tasks[tid].prompt + doc["completion"]
            else:
                raise click.ClickException(f"{path}:{n}: a sample needs 'solution' or 'completion'")
            items.append((tid, program))
            meta.append({"condition": condition, "replicate": seen[tid]})
            seen[tid] += 1
    return items, meta


def _bfcl(logs: tuple[Path, ...], dataset: Path | None, progress: Progress, names: str = "underscore",
          parallel: str = "first-fit") -> tuple[list[OutcomeRow], dict[str, Path]]:
    from noisefloor.verifier.bfcl import Rules, grade_response
    from noisefloor.verifier.datasets import load_bfcl

    rules = Rules(names=names, parallel=parallel)  # type: ignore[arg-type]
    if rules.departs():
        click.echo(f"nfverify: {rules.departs()}", err=True)
    tasks = {t.task_id: t for cat in ("multiple", "parallel") for t in load_bfcl(cat, dataset)}
    prompts = {tid: t.question[-1][-1]["content"] for tid, t in tasks.items()}
    found, where = _log_attempts(logs, prompts)
    progress.where = where
    found = [a for a in found if a.task_id in tasks]
    keys = []
    for a in found:
        ex = a.exchange
        meta = _attempt_meta(a) | {"endpoint": a.condition, "variant": ex.perturbation if ex else None}
        keys.append(attempt_key({**meta, "task_id": a.task_id}))
        if keys[-1] in progress.done:
            continue
        v = grade_response(tasks[a.task_id], a.body, rules)
        progress.add(OutcomeRow(task_id=a.task_id, outcome=v.outcome, failure=v.failure, detail=v.detail, **meta))
    return [progress.done[k] for k in keys], where


if __name__ == "__main__":
    main()
