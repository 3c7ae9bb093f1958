"""The ladder end to end: agent x task x replicate x condition through nfproxy, then nfverify's
grading and nfanalyze's statistics.

One nfproxy process per condition serves every agent run of that condition; each run is its own
session, named in the base URL the agent is given (`/_nf/session=...,task=.../v1`), so the agent
needs no change at all. What the proxy does for a condition (record or strict replay, the
overrides it imposes, the perturbation it applies) is the condition's own (`conditions.py`).

Runs are recorded in OUT/attempts.jsonl as they finish; a rerun of the same command skips them
(resume). Everything lands in OUT: log.lmdb, attempts.jsonl, outcomes.jsonl, report.json,
report.md, ladder.png.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from noisefloor import exit_codes
from noisefloor.analyzer.bootstrap import DEFAULT_RESAMPLES
from noisefloor.errors import StateError
from noisefloor.ladder.agent_run import AgentRun, Attempt, session_name
from noisefloor.ladder.conditions import Condition, Registry
from noisefloor.ladder.executors import Executor, ExecutorError, LocalExecutor
from noisefloor.outcome_rows import OutcomeRow
from noisefloor.verifier.grading import GradeOptions


class LadderError(StateError):
    """A run that cannot go on or whose result cannot be trusted; the message says why."""


@dataclass(frozen=True)
class Config:
    out: Path
    agent: list[str]  # argv with a `{task_file}` placeholder
    tasks: list[Any]  # CodeTask-like: task_id, prompt, entry_point
    dataset: Path  # EvalPlus-format file the verifier grades against
    upstream: str  # provider URL (the built-in one's, or the user's)
    replicates: int = 5  # for conditions that do not set their own
    conditions: Registry = field(default_factory=Registry)
    jobs: int = 2
    agent_timeout: float = 120.0
    seed: int = 0
    bootstrap: int = DEFAULT_RESAMPLES
    grading: GradeOptions = field(default_factory=GradeOptions)
    replay_env: dict[str, str] = field(default_factory=dict)  # extra environment for replay runs only
    executor: str = "local"  # or "ray"
    ray_address: str | None = None  # ray: the cluster to join (None: start or join a local Ray)
    design: str = "ladder"
    perturb_file: Path | None = None  # user perturbation variants (nfproxy --perturb-file)
    provider_listing: dict[str, Any] | None = None  # what the provider listed at /v1/models, once per run
    plot: bool = True  # ladder: draw ladder.png

    def replicates_of(self, c: Condition) -> int:
        return c.replicates or self.replicates


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
        self.planned: dict[tuple[str, str], int] = {}  # (condition, task) -> replicates of this run's study
        if self.attempts_file.exists():
            for line in self.attempts_file.read_text().splitlines():
                if line.strip():
                    a = Attempt(**json.loads(line))
                    self.done[a.session] = a
        if self.done:  # a recorded run whose exchanges the log lost (a proxy that could not record) runs again
            kept = self._logged_sessions()
            replayed = {c.name for c in self.c.conditions if c.replays}
            self.done = {s: a for s, a in self.done.items() if a.condition in replayed or s in kept}
        self._lock = threading.Lock()
        self.executor = executor or LocalExecutor(self.c.jobs, self.c.out / "tasks")

    # -- running -----------------------------------------------------------------------------

    def run_condition(self, cond: Condition, replicates: range | None = None, tasks: list[Any] | None = None,
                      prompts: dict[str, str] | None = None, extra: dict[str, str] | None = None) -> None:
        """Every (replicate, task) run of `cond` not done yet; `prompts` replaces a task's prompt
        (a judge condition's prompt holds the frozen candidate)."""
        name = cond.name
        reps = replicates if replicates is not None else range(self.c.replicates_of(cond))
        tasks = tasks if tasks is not None else self.c.tasks
        for t in tasks:
            self.planned[(name, t.task_id)] = max(self.planned.get((name, t.task_id), 0), reps.stop)
        wanted = [(r, t) for r in reps for t in tasks]
        todo = [(r, t) for r, t in wanted if session_name(name, r, t.task_id) not in self.done]
        planned = len(wanted)
        if not todo:
            self.progress(f"[{name}] all {planned} runs done earlier")
            return
        if len(todo) < planned:  # a resume: say what an earlier run of this command already did
            earlier = [self.done[s] for s in (session_name(name, r, t.task_id) for r, t in wanted) if s in self.done]
            failed = sum(a.returncode != 0 for a in earlier)
            self.progress(f"[{name}] resuming: {planned - len(todo)} of {planned} runs done earlier"
                          f"{f' ({failed} of them failed)' if failed else ''}; {len(todo)} to run")
        args = self.c.conditions.proxy_args(cond, self.c.upstream, str(self.c.perturb_file) if self.c.perturb_file else None)
        src = cond.replay_from
        env = tuple(cond.env) + (tuple(self.c.replay_env.items()) if cond.replays else ())
        runs = [AgentRun(name, r, t.task_id, (prompts or {}).get(t.task_id, t.prompt), t.entry_point,
                         tuple(cond.agent or self.c.agent), self.c.agent_timeout,
                         session_name(src[0], r if cond.replay_each else src[1], t.task_id) if src else None, env,
                         (extra or {}).get(t.task_id, ""))
                for r, t in todo]
        per_rep: dict[int, int] = {}
        total = {r: sum(1 for rr, _ in todo if rr == r) for r in reps}
        clock = _Progress(len(todo))

        def finished(attempt: Attempt) -> None:
            with self._lock:
                with self.attempts_file.open("a") as fh:
                    fh.write(json.dumps(asdict(attempt)) + "\n")
                self.done[attempt.session] = attempt
                per_rep[attempt.replicate] = per_rep.get(attempt.replicate, 0) + 1
                line = clock.step(attempt.returncode != 0)
                if per_rep[attempt.replicate] == total[attempt.replicate] or clock.done == len(todo):
                    self.progress(f"[{name}] replicate {attempt.replicate + 1}/{reps.stop} done: {line}")
                elif clock.due():
                    self.progress(f"[{name}] {line}")

        try:
            code = self.executor.run(runs, args, self.store, finished, replay=cond.replays)
        except ExecutorError as exc:
            raise LadderError(str(exc)) from None
        self.proxy_exit[name] = max(code, self.proxy_exit.get(name, 0))
        if code in (exit_codes.INTERRUPTED, exit_codes.TERMINATED):  # the signal reached the proxy first: the
            self.progress(f"[{name}] interrupted: {clock.summary()}")  # study stopped (resumable), none failed by it
            if code == exit_codes.TERMINATED:
                raise SystemExit(code)
            raise KeyboardInterrupt
        if not cond.replays and code != 0:
            raise LadderError(f"the {name} proxy exited {code}: it could not record every exchange (its errors "
                              f"are above), so the recording is incomplete and the study stops; fix the cause (a "
                              f"full disk, a damaged store) and rerun the same command: the lost runs run again")
        if cond.replays and code == 3:
            self.progress(f"[{name}] nfproxy reported replay misses, order violations or errors")

    # -- grading -----------------------------------------------------------------------------

    def candidates(self, names: set[str] | None = None) -> dict[str, Any]:
        """This study's candidates (session -> verifier Candidate) found in the log."""
        from noisefloor.proxy.store.log import Store
        from noisefloor.verifier.candidates import candidates

        with Store.open(self.store, write=False) as store:
            return {c.session: c for c in candidates(store) if names is None or c.condition in names}

    def study_attempts(self, names: set[str] | None = None) -> list[tuple[str, Attempt]]:
        """(session, attempt) of this run's study only: a resume with fewer tasks or replicates
        leaves earlier runs in the log."""
        out = []
        for session, att in sorted(self.done.items()):
            planned = self.planned.get((att.condition, att.task_id), 0)
            if att.replicate < planned and (names is None or att.condition in names):
                out.append((session, att))
        return out

    def base_row(self, session: str, att: Attempt, cand: Any) -> OutcomeRow:
        """The row's identity and stamp: what the candidate's request carried (after the proxy's
        overrides), the condition's stamp where it carried nothing, the condition's grader."""
        from noisefloor.verifier.rows import candidate_row

        cond = self.c.conditions[att.condition]
        stamp = self.c.conditions.stamp(cond)
        ident: dict[str, Any] = {"task_id": att.task_id, "condition": att.condition, "replicate": att.replicate, "session": session}
        row = candidate_row(cand, **ident) if cand is not None else OutcomeRow(**ident, outcome=0)
        return replace(row, model=row.model or stamp.model,
                       temperature=stamp.temperature if row.temperature is None else row.temperature,
                       top_p=stamp.top_p if row.top_p is None else row.top_p,
                       seed=stamp.seed if row.seed is None else row.seed,
                       grader_version=stamp.grader_version, endpoint=cond.endpoint,
                       variant=(self.c.conditions.keying(cond).variant or ("main" if cond.endpoint else None)))

    def outcomes(self, grade: Callable[[list[tuple[str, str]]], list[Any]], names: set[str] | None = None,
                 ) -> list[OutcomeRow]:
        """One row per attempt: graded from the log, or failed with the agent's stderr tail."""
        from noisefloor.verifier.candidates import response_text
        from noisefloor.verifier.rows import Pending, grade_pending

        found = self.candidates(names)
        rows: dict[str, OutcomeRow] = {}
        pending: list[Pending] = []
        for session, att in self.study_attempts(names):
            cand = found.get(session)
            base = self.base_row(session, att, cand)
            if cand is None or cand.body is None:
                rows[session] = unanswered(base, att)
            else:
                rows[session] = base
                pending.append(Pending(base, response_text(cand.body)))
        for row in grade_pending(pending, grade):  # type: ignore[arg-type]
            rows[row.session or ""] = row
        return list(rows.values())

    def _logged_sessions(self) -> set[str]:
        from noisefloor.proxy.store.log import Store

        if not (self.store / "data.mdb").exists():
            return set()
        with Store.open(self.store, write=False) as store:  # the replay index: no record to decompress
            return {e.session for e in store.index.entries()}

    def served_models(self) -> dict[tuple[str, str], set[str]]:
        """(condition, model as requested) -> the models that answered, over every recorded exchange
        of this study's conditions (an agent's every call, not only its final one)."""
        from noisefloor.proxy.store.log import Store
        from noisefloor.verifier.candidates import request_doc, requested

        names = set(self.c.conditions.names)
        out: dict[tuple[str, str], set[str]] = {}
        with Store.open(self.store, write=False) as store:
            for ex in store.exchanges():
                if ex.mode != "record" or ex.condition not in names or not ex.model:
                    continue
                asked = requested(request_doc(store, ex)).model or "?"
                out.setdefault((ex.condition, asked), set()).add(ex.model)
        return out

    def replay_failures(self) -> list[str]:
        """Replay sessions that saw a miss or an order violation: the recording was not reproduced."""
        from noisefloor.proxy.store.log import Store

        bad = set()
        with Store.open(self.store, write=False) as store:
            for ex in store.exchanges():
                if ex.mode == "replay" and ex.replay_result in ("miss", "order_violation"):
                    bad.add(ex.session)
        return sorted(bad)

    def provider_counts(self) -> dict[tuple[str, float], int]:
        """Requests per (task, temperature) already recorded: restores a provider's draw counters on resume."""
        from noisefloor.proxy.store.log import Store
        from noisefloor.verifier.candidates import request_doc, requested

        counts: dict[tuple[str, float], int] = {}
        if not (self.store / "data.mdb").exists():
            return counts
        with Store.open(self.store, write=False) as store:
            for ex in store.exchanges():
                if ex.mode != "record" or not ex.task:
                    continue
                temp = requested({"temperature": 1.0} | request_doc(store, ex)).temperature
                if temp is not None:
                    counts[(ex.task, temp)] = counts.get((ex.task, temp), 0) + 1
        return counts


def unanswered(base: OutcomeRow, att: Attempt) -> OutcomeRow:
    """The row of an attempt whose agent left no answer in the log: failed, with its stderr tail."""
    return replace(base, failure="agent_timeout" if att.timed_out else "agent_error", detail=att.stderr_tail[-500:])


# the built-in clients, run in the executor's thread (no interpreter per run): MODULE[:FUNCTION] of this package
INLINE_AGENTS = {"builtin": "agent", "completions": "agent:run_completions", "tools": "agent_tools",
                 "judge": "agent_judge"}


class _Progress:
    """Counts, rate and ETA of one condition's runs, for a line at most every `every` seconds.

    The rate is measured from the first finished run on (the start-up before it is no rate), and
    the ETA shows once `RATE_RUNS` runs have given one."""

    RATE_RUNS = 5

    def __init__(self, total: int, every: float = 10.0) -> None:
        self.total, self.every = total, every
        self.done = self.failed = 0
        self.start = self.last = time.monotonic()
        self.first = 0.0

    def step(self, failed: bool) -> str:
        now = time.monotonic()
        self.done += 1
        self.failed += failed
        if self.done == 1:
            self.first = now
        eta = ""
        if self.done < self.total and self.done >= self.RATE_RUNS and now > self.first:
            eta = f", ETA {_duration((self.total - self.done) * (now - self.first) / (self.done - 1))}"
        return f"{self.summary()}, {self.done / max(now - self.start, 1e-9):.2f} runs/s, " \
               f"{_duration(now - self.start)} so far{eta}"

    def summary(self) -> str:
        fails = f", {self.failed} failed" if self.failed else ""
        return f"{self.done}/{self.total} runs ({self.done / self.total:.0%}){fails}"

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
    if command in INLINE_AGENTS:
        from noisefloor.ladder.agent_run import INLINE

        return [f"{INLINE}{INLINE_AGENTS[command]}"]
    argv = shlex.split(command)
    if not argv:
        raise LadderError("--agent is empty; give a command such as 'python agent.py {task_file}'")
    if not any("{task_file}" in a for a in argv):
        argv.append("{task_file}")
    return argv
