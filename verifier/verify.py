"""nfverify's work: candidates from nfproxy logs (or an EvalPlus samples file), graded, each row
kept the moment it is graded (`resume.Progress`), so that an interruption loses nothing.

Memory grows with sessions, not with what they said: one pass over each log keeps per session
its labels and exchange ids (`candidates.sessions`); bodies are read one candidate at a time, and
code candidates are graded in chunks, so only one chunk's answer texts are held at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from noisefloor._cli import progress_bar
from noisefloor.display import visible
from noisefloor.errors import InputError
from noisefloor.outcome_rows import OutcomeRow
from noisefloor.verifier.candidates import Candidate, SessionRef, candidate, response_text, sessions
from noisefloor.verifier.resume import Progress, attempt_key
from noisefloor.verifier.rows import Pending, candidate_row, chunks, with_verdict

CHUNK_PER_JOB = 32  # code candidates in flight per sandbox slot


def open_log(log: Path) -> Any:
    from noisefloor.proxy.store.log import Store

    return Store.open(log, write=False)  # a StoreError is one line: the command's error handling


Refs = list[tuple[Path, SessionRef]]  # (the store it is in, the session)


def log_sessions(logs: Sequence[Path], prompts: dict[str, str]) -> tuple[Refs, dict[str, Path]]:
    """Every store's sessions, and which store each is in; a session in two stores is refused."""
    found: Refs = []
    where: dict[str, Path] = {}
    for log in logs:
        with open_log(log) as store:
            for ref in sessions(store, prompts):
                if ref.session in where:
                    raise InputError(f"session {ref.session!r} is in {where[ref.session]} and in {log}: the stores "
                                     "are not shards of one study; grade them apart")
                where[ref.session] = log
                found.append((log, ref))
    return found, where


def log_candidates(refs: Refs) -> Iterator[Candidate]:
    """The candidates of `refs`, in order, each read when it is reached (each store opened once)."""
    for log in dict.fromkeys(log for log, _ in refs):
        with open_log(log) as store:
            for _, ref in (r for r in refs if r[0] == log):
                yield candidate(store, ref)


def _key(row: OutcomeRow) -> tuple[Any, ...]:
    return attempt_key(row.to_json())


def grade_code(diff: Any, todo: Sequence[Pending] | Iterator[Pending], total: int, progress: Progress,
               programs: bool) -> None:
    """Grade pending code rows chunk by chunk, each row kept in `progress` as its verdict comes."""
    from noisefloor.verifier.differential import ExpectedError

    if not total:
        return
    bar, done = progress_bar("grading", delay=0), 0
    for chunk in chunks(todo, CHUNK_PER_JOB * diff.sandbox.workers):
        try:  # the references of this chunk's tasks only, those not computed yet
            diff.expected(progress_bar("reference outputs", delay=0), {p.item[0] for p in chunk})
        except ExpectedError as exc:
            raise ExpectedError(f"{exc}; check the dataset file, or raise --memory-mb") from None

        def keep(j: int, v: Any, chunk: list[Pending] = chunk) -> None:
            progress.add(with_verdict(chunk[j].row, v))

        diff.grade_many([p.item for p in chunk], lambda n, _t, base=done: bar(base + n, total), programs=programs,
                        on_verdict=keep)
        done += len(chunk)



def matching(refs: Refs, tasks: Mapping[str, Any], suite: str) -> Refs:
    """The sessions whose task is one of `tasks`; the others named on stderr, and none at all refused.

    A log none of whose sessions is a task of the suite is almost always the wrong log or the wrong
    suite: "0/0 passed" with exit 0 would hide that.
    """
    kept = [(log, ref) for log, ref in refs if ref.task_id in tasks]
    unknown = [ref.session for _, ref in refs if ref.task_id not in tasks]
    if unknown and not kept:
        raise InputError(f"no session of the log matches a {suite} task ({len(unknown)} sessions, e.g. "
                         f"{visible(unknown[0])}); label each session with its task (x-nf-task) or pick the suite "
                         "the log was recorded for")
    if unknown:
        click.echo(f"nfverify: {len(unknown)} sessions match no {suite} task and are skipped (e.g. "
                   f"{visible(unknown[0])}); label them with x-nf-task", err=True)
    return kept

def code_rows(suite: str, diff: Any, logs: Sequence[Path], samples: Path | None, condition: str,
              progress: Progress) -> list[OutcomeRow]:
    """humaneval+ / mbpp+: every candidate graded (those in `progress` already are not again)."""
    from noisefloor.verifier.samples import read_samples

    if samples is not None:
        pending = read_samples(samples, diff.tasks, condition)
        keys = [_key(p.row) for p in pending]
        todo = [p for p, k in zip(pending, keys) if k not in progress.done]
        grade_code(diff, todo, len(todo), progress, programs=True)
        return [progress.done[k] for k in keys]
    refs, progress.where = log_sessions(logs, {t.task_id: t.prompt for t in diff.tasks.values()})
    refs = matching(refs, diff.tasks, suite)
    keys = [_key(OutcomeRow(str(ref.task_id), ref.condition, ref.replicate, 0, session=ref.session)) for _, ref in refs]
    left = [r for r, k in zip(refs, keys) if k not in progress.done]
    logged = (Pending(candidate_row(c), response_text(c.body)) for c in log_candidates(left))
    grade_code(diff, logged, len(left), progress, programs=False)
    return [progress.done[k] for k in keys]


def bfcl_rows(logs: Sequence[Path], dataset: Path | None, progress: Progress, rules: Any) -> list[OutcomeRow]:
    """BFCL: each session's tool calls checked against its task's answers, one candidate at a time."""
    from noisefloor.verifier.bfcl import TaskGrader
    from noisefloor.verifier.datasets import load_bfcl

    tasks = {t.task_id: t for cat in ("multiple", "parallel") for t in load_bfcl(cat, dataset)}
    refs, progress.where = log_sessions(logs, {tid: t.question[-1][-1]["content"] for tid, t in tasks.items()})
    keys = []
    graders: dict[str, TaskGrader] = {}  # a task compiled at its first candidate
    for c in log_candidates(matching(refs, tasks, "BFCL")):
        row = candidate_row(c, endpoint=c.condition, variant=c.exchange.perturbation if c.exchange else None)
        keys.append(_key(row))
        if keys[-1] not in progress.done:
            assert c.task_id is not None  # matching() kept only the sessions of a task
            grader = graders.get(c.task_id) or graders.setdefault(c.task_id, TaskGrader(tasks[c.task_id], rules))
            progress.add(with_verdict(row, grader.grade_response(c.body)))
    return [progress.done[k] for k in keys]


def keep_in_log(log: Path, rows: list[OutcomeRow]) -> None:
    """The rows also go into the log beside the exchanges they grade: `nfanalyze LOG` needs nothing else."""
    from noisefloor.proxy.store.env import is_read_only
    from noisefloor.proxy.store.log import Store, StoreError

    if not rows:
        return
    if is_read_only(log):
        click.echo(f"nfverify: {log} is read-only; outcome rows are only in the outcomes file", err=True)
        return
    try:
        with Store.open(log, write=True) as store:
            store.outcomes.put([r.to_json() for r in rows])
    except StoreError as exc:
        click.echo(f"nfverify: outcome rows not kept in the log ({exc}); they are in the outcomes file", err=True)
