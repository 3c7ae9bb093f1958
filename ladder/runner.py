"""The ladder end to end: agent x task x replicate x condition through nfproxy, then nfverify's
grading and nfanalyze's statistics.

One nfproxy process per condition serves every agent run of that condition; each run is its own
session, named in the base URL the agent is given (`/_nf/session=...,task=.../v1`), so the agent
needs no change at all. live records at the agent's own temperature, t0 records with the proxy
imposing `--set /temperature=0`, replay answers strictly from one chosen recorded replicate.

Runs are recorded in OUT/attempts.jsonl as they finish; a rerun of the same command skips them
(resume). Everything lands in OUT: log.lmdb, attempts.jsonl, outcomes.jsonl, report.json,
report.md, ladder.png.
"""

from __future__ import annotations

import json
import shlex
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from noisefloor.analyzer.bootstrap import DEFAULT_RESAMPLES
from noisefloor.errors import StateError
from noisefloor.ladder.agent_run import AgentRun, Attempt, session_name
from noisefloor.ladder.executors import Executor, ExecutorError, LocalExecutor
from noisefloor.outcome_rows import OutcomeRow
from noisefloor.verifier.grading import GradeOptions

CONDITIONS = ("live", "t0", "replay")
OVERRIDES = {"live": [], "t0": ["--set", "/temperature=0"]}  # how the proxy imposes each recorded condition


class LadderError(StateError):
    """A run that cannot go on or whose result cannot be trusted; the message says why."""


@dataclass(frozen=True)
class Config:
    out: Path
    agent: list[str]  # argv with a `{task_file}` placeholder
    tasks: list[Any]  # CodeTask-like: task_id, prompt, entry_point
    dataset: Path  # EvalPlus-format file the verifier grades against
    upstream: str  # provider URL (the built-in one's, or the user's)
    replicates: int = 5
    conditions: tuple[str, ...] = CONDITIONS
    replay_source: tuple[str, int] = ("t0", 0)
    jobs: int = 2
    agent_timeout: float = 120.0
    seed: int = 0
    bootstrap: int = DEFAULT_RESAMPLES
    grading: GradeOptions = field(default_factory=GradeOptions)
    replay_env: dict[str, str] = field(default_factory=dict)  # extra environment for replay runs only
    executor: str = "local"  # or "ray"
    ray_address: str | None = None  # ray: the cluster to join (None: start or join a local Ray)


class Ladder:
    def __init__(self, config: Config, progress: Callable[[str], None] = lambda s: None,
                 executor: Executor | None = None) -> None:
        self.c = config
        self.progress = progress
        self.c.out.mkdir(parents=True, exist_ok=True)
        self.store = self.c.out / "log.lmdb"
        self.attempts_file = self.c.out / "attempts.jsonl"
        self.done: dict[str, Attempt] = {}
        self.proxy_exit: dict[str, int] = {}  # condition -> its nfproxy's exit status, this run
        if self.attempts_file.exists():
            for line in self.attempts_file.read_text().splitlines():
                if line.strip():
                    a = Attempt(**json.loads(line))
                    self.done[a.session] = a
        if self.done:  # a recorded run whose exchanges the log lost (a proxy that could not record) runs again
            kept = self._logged_sessions()
            self.done = {s: a for s, a in self.done.items() if a.condition == "replay" or s in kept}
        self._lock = threading.Lock()
        self.executor = executor or LocalExecutor(self.c.jobs, self.c.out / "tasks")

    # -- running -----------------------------------------------------------------------------

    def run_condition(self, condition: str) -> None:
        todo = [(r, t) for r in range(self.c.replicates) for t in self.c.tasks
                if session_name(condition, r, t.task_id) not in self.done]
        planned = self.c.replicates * len(self.c.tasks)
        if not todo:
            self.progress(f"[{condition}] all {planned} runs done earlier")
            return
        if len(todo) < planned:  # a resume: say what an earlier run of this command already did
            earlier = [a for a in self.done.values() if a.condition == condition]
            failed = sum(a.returncode != 0 for a in earlier)
            self.progress(f"[{condition}] resuming: {planned - len(todo)} of {planned} runs done earlier"
                          f"{f' ({failed} of them failed)' if failed else ''}; {len(todo)} to run")
        args = ["--upstream", self.c.upstream, "--condition", condition, "-q"]
        replay_from = None
        if condition == "replay":
            # the requests must be keyed as the source condition keyed them: same overrides
            args += ["--mode", "replay", "--strict", *OVERRIDES[self.c.replay_source[0]]]
            replay_from = self.c.replay_source
        else:
            args += ["--mode", "record", *OVERRIDES[condition]]
        runs = [AgentRun(condition, r, t.task_id, t.prompt, t.entry_point, tuple(self.c.agent), self.c.agent_timeout,
                         session_name(replay_from[0], replay_from[1], t.task_id) if replay_from else None,
                         tuple(self.c.replay_env.items()) if condition == "replay" else ())
                for r, t in todo]
        per_rep: dict[int, int] = {}
        total = {r: sum(1 for rr, _ in todo if rr == r) for r in range(self.c.replicates)}
        clock = _Progress(len(todo))

        def finished(attempt: Attempt) -> None:
            with self._lock:
                with self.attempts_file.open("a") as fh:
                    fh.write(json.dumps(asdict(attempt)) + "\n")
                self.done[attempt.session] = attempt
                per_rep[attempt.replicate] = per_rep.get(attempt.replicate, 0) + 1
                line = clock.step(attempt.returncode != 0)
                if per_rep[attempt.replicate] == total[attempt.replicate] or clock.done == len(todo):
                    self.progress(f"[{condition}] replicate {attempt.replicate + 1}/{self.c.replicates} done: {line}")
                elif clock.due():
                    self.progress(f"[{condition}] {line}")

        try:
            code = self.executor.run(runs, args, self.store, finished)
        except ExecutorError as exc:
            raise LadderError(str(exc)) from None
        self.proxy_exit[condition] = code
        if condition != "replay" and code != 0:
            raise LadderError(f"the {condition} proxy exited {code}: it could not record every exchange (its errors "
                              f"are above), so the recording is incomplete and the ladder stops; fix the cause (a "
                              f"full disk, a damaged store) and rerun the same command: the lost runs run again")
        if condition == "replay" and code == 3:
            self.progress("[replay] nfproxy reported replay misses, order violations or errors")

    # -- grading -----------------------------------------------------------------------------

    def outcomes(self, grade: Callable[[list[tuple[str, str]]], list[Any]]) -> list[OutcomeRow]:
        """One row per attempt: graded from the log, or failed with the agent's stderr tail."""
        from noisefloor.proxy.store import Store
        from noisefloor.verifier.candidates import attempts as log_attempts
        from noisefloor.verifier.candidates import response_text

        with Store.open(self.store, write=False) as store:
            found = {a.session: a for a in log_attempts(store)}
        rows: list[OutcomeRow] = []
        to_grade: list[tuple[int, str, str]] = []
        task_ids = {t.task_id for t in self.c.tasks}
        for session, att in sorted(self.done.items()):
            # this run's study only: a resume with fewer tasks or replicates leaves earlier runs in the log
            if att.condition not in self.c.conditions or att.task_id not in task_ids \
                    or att.replicate >= self.c.replicates:
                continue
            base = OutcomeRow(att.task_id, att.condition, att.replicate, 0, session=session)
            cand = found.get(session)
            if cand is None or cand.body is None:
                why = "agent_timeout" if att.timed_out else "agent_error"
                rows.append(replace(base, failure=why, detail=att.stderr_tail[-500:]))
                continue
            rows.append(replace(base, fingerprint=cand.exchange.fingerprint if cand.exchange else None,
                                model=cand.exchange.model if cand.exchange else None))
            to_grade.append((len(rows) - 1, att.task_id, response_text(cand.body)))
        verdicts = grade([(tid, text) for _, tid, text in to_grade])
        for (i, _, _), v in zip(to_grade, verdicts):
            rows[i] = replace(rows[i], outcome=v.outcome, failure=v.failure, detail=v.detail)
        return rows

    def _logged_sessions(self) -> set[str]:
        from noisefloor.proxy.store import Store

        if not (self.store / "data.mdb").exists():
            return set()
        with Store.open(self.store, write=False) as store:  # the replay index: no record to decompress
            return {e.session for e in store.recorded_entries()}

    def replay_failures(self) -> list[str]:
        """Replay sessions that saw a miss or an order violation: the recording was not reproduced."""
        from noisefloor.proxy.store import Store

        bad = set()
        with Store.open(self.store, write=False) as store:
            for ex in store.exchanges():
                if ex.mode == "replay" and ex.replay_result in ("miss", "order_violation"):
                    bad.add(ex.session)
        return sorted(bad)

    def provider_counts(self) -> dict[tuple[str, float], int]:
        """Requests per (task, temperature) already recorded: restores a provider's draw counters on resume."""
        from noisefloor.proxy.store import Store

        counts: dict[tuple[str, float], int] = {}
        if not (self.store / "data.mdb").exists():
            return counts
        with Store.open(self.store, write=False) as store:
            for ex in store.exchanges():
                if ex.mode != "record" or not ex.task:
                    continue
                body = store.part_body(ex.request, ex.id, "request")
                try:
                    temp = float(json.loads(body or b"{}").get("temperature", 1.0))
                except (ValueError, AttributeError):
                    continue
                counts[(ex.task, temp)] = counts.get((ex.task, temp), 0) + 1
        return counts


BUILTIN_AGENTS = {"builtin": [], "completions": ["--completions"]}


class _Progress:
    """Counts, rate and ETA of one condition's runs, for a line at most every `every` seconds."""

    def __init__(self, total: int, every: float = 10.0) -> None:
        self.total, self.every = total, every
        self.done = self.failed = 0
        self.start = self.last = time.monotonic()

    def step(self, failed: bool) -> str:
        self.done += 1
        self.failed += failed
        elapsed = time.monotonic() - self.start
        left = (self.total - self.done) * elapsed / self.done
        eta = "" if self.done == self.total else f", ETA {_duration(left)}"
        fails = f", {self.failed} failed" if self.failed else ""
        return (f"{self.done}/{self.total} runs ({self.done / self.total:.0%}){fails}, "
                f"{self.done / max(elapsed, 1e-9):.2f} runs/s, {_duration(elapsed)} so far{eta}")

    def due(self) -> bool:
        now = time.monotonic()
        if now - self.last < self.every:
            return False
        self.last = now
        return True


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def parse_agent(command: str) -> list[str]:
    if command in BUILTIN_AGENTS:
        return [sys.executable, "-m", "noisefloor.ladder.agent", *BUILTIN_AGENTS[command], "{task_file}"]
    argv = shlex.split(command)
    if not argv:
        raise LadderError("--agent is empty; give a command such as 'python agent.py {task_file}'")
    if not any("{task_file}" in a for a in argv):
        argv.append("{task_file}")
    return argv
