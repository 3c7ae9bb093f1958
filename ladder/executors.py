"""Where agent runs happen. The ladder hands an executor one condition at a time: the runs, the
nfproxy arguments the condition's registry gives (without a store) and the study's log; the executor runs every
agent behind a proxy of that condition, leaves their exchanges in the log, and reports each
attempt as it finishes. Another engine (Slurm, Kubernetes jobs) is one more class like these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from noisefloor import exit_codes
from noisefloor.errors import StateError
from noisefloor.ladder.agent_run import AgentRun, Attempt, accept_runs, kill_running, run_agent
from noisefloor.proxy import launch
from noisefloor.verifier.grading import GradeOptions, code_grader

Items = Sequence[tuple[str, str]]  # (task id, answer text) pairs to grade


class ExecutorError(StateError):
    """An executor that cannot run the study (no cluster, a proxy that will not start)."""


class Executor(Protocol):
    def run(self, runs: Sequence[AgentRun], proxy_args: Sequence[str], store: Path,
            on_done: Callable[[Attempt], None], replay: bool = False) -> int:
        """Run every agent; return the worst nfproxy exit status of the condition (0: all clean).
        `replay`: the proxy answers from `store` (the condition replays), so a remote node needs a copy."""
        ...

    def grade(self, kind: str, dataset: Path, options: GradeOptions, items: Items) -> list[Any]:
        """Verdicts for the items, in order."""
        ...

    def close(self) -> None: ...


def start_proxy(args: Sequence[str]) -> launch.RunningProxy:
    try:
        return launch.start(*args)
    except launch.ProxyStartError as exc:
        raise ExecutorError(str(exc)) from None


class LocalExecutor:
    """This machine: one nfproxy for the condition, `jobs` agents at a time on threads."""

    def __init__(self, jobs: int, taskdir: Path) -> None:
        self.jobs = jobs
        self.taskdir = taskdir

    def run(self, runs: Sequence[AgentRun], proxy_args: Sequence[str], store: Path,
            on_done: Callable[[Attempt], None], replay: bool = False) -> int:
        accept_runs()
        proxy = start_proxy(["--store", str(store), *proxy_args])
        pool = ThreadPoolExecutor(self.jobs)
        ended = False
        try:
            for future in [pool.submit(run_agent, r, proxy.port, self.taskdir) for r in runs]:
                attempt = _result(future)
                if attempt.returncode != 0 and proxy.proc.poll() is not None:
                    ended = True  # cut off by its proxy's end (an interrupt reached it first): not a failed run
                    break
                on_done(attempt)
        except BaseException:  # an interrupt (SIGINT, SIGTERM): stop the agents now, not when they finish
            pool.shutdown(wait=False, cancel_futures=True)
            kill_running()
            raise
        finally:
            pool.shutdown(wait=True)
            if ended:
                pool.shutdown(wait=False, cancel_futures=True)
            code = proxy.stop(timeout=60)
        if ended and code not in (exit_codes.INTERRUPTED, exit_codes.TERMINATED):
            raise ExecutorError(f"the condition's nfproxy ended (exit {code}) before its agent runs did; its "
                                "errors are above; rerun the same command to run the rest")
        return code

    def grade(self, kind: str, dataset: Path, options: GradeOptions, items: Items) -> list[Any]:
        return grade_here(kind, dataset, options, items)

    def close(self) -> None:
        pass


WAKE_S = 0.5  # how long the main thread sleeps at a time while agents run


def _result(future: Future[Attempt]) -> Attempt:
    """The attempt, waited for in short sleeps: a signal handler runs in the main thread only, and
    one whose signal the kernel gave another thread runs when the main thread next wakes, which an
    untimed wait would put off until the agent ends."""
    while True:
        try:
            return future.result(timeout=WAKE_S)
        except TimeoutError:
            continue


def grade_here(kind: str, dataset: Path, options: GradeOptions, items: Items) -> list[Any]:
    diff = code_grader(kind, dataset, options, {tid for tid, _ in items})
    with diff.sandbox:  # its fork servers and their root folder go with it
        return diff.grade_many(items)
