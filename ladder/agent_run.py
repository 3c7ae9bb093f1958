"""One agent run: the unchanged agent as a subprocess, pointed at a proxy by its environment (or
a built-in client, given the same environment, in this thread).

A plain function over plain data, so any executor can run it wherever the proxy is: a thread
here, a Ray task on another machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from noisefloor import exit_codes
from noisefloor.outcome_rows import replicate_label
from noisefloor.proxy.providers import sdk_env

STDERR_TAIL = 2000
OUTPUT_TAIL = 65536  # the end of what an agent printed: its final answer (the compare design grades it)
_RUNNING: set[subprocess.Popen[str]] = set()  # agents started here and not finished: killed on an interrupt
_LOCK = threading.Lock()
_stopping = False  # set by an interrupt: an agent that starts after it is killed at once


def kill_running() -> None:
    """Kill every agent this process started that is still running (and what each started), and
    any that a thread starts from now on: an interrupt landing between a run's task file and its
    agent's registration must not leave that agent running (the command would wait out its whole
    run, up to the timeout, before it could exit). `accept_runs` ends this state."""
    global _stopping
    with _LOCK:
        _stopping = True
        procs = list(_RUNNING)
    for proc in procs:
        _kill(proc)


def accept_runs() -> None:
    """Start agents again (an executor's run begins: an earlier interrupt in this process is over)."""
    global _stopping
    with _LOCK:
        _stopping = False


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


INLINE = "nf-inline:"  # an agent argv of one word `nf-inline:MODULE[:FUNCTION]`: a built-in client run in this thread


@dataclass(frozen=True)
class AgentRun:
    condition: str
    replicate: int
    task_id: str
    prompt: str
    entry_point: str
    agent: tuple[str, ...]  # argv with a `{task_file}` placeholder
    timeout: float
    replay_from: str | None = None  # replay: the recorded session that answers this one
    env: tuple[tuple[str, str], ...] = field(default=())  # extra environment (replay-only settings)
    extra: str = ""  # a JSON object merged into the task file (a tool-calling task's tools)

    @property
    def session(self) -> str:
        return session_name(self.condition, self.replicate, self.task_id)


@dataclass
class Attempt:
    session: str
    task_id: str
    condition: str
    replicate: int
    returncode: int | None
    timed_out: bool
    seconds: float
    stderr_tail: str = ""
    output: str = ""  # the end of the agent's stdout (its final answer), OUTPUT_TAIL characters at most


def session_name(condition: str, replicate: int, task_id: str) -> str:
    return f"{condition}-r{replicate}-{task_id}"


def run_agent(run: AgentRun, port: int, taskdir: Path) -> Attempt:
    """Run the agent once against the proxy on loopback `port`; the session is named in its base URL."""
    labels = {"session": run.session, "task": run.task_id, "replicate": replicate_label(run.replicate), "condition": run.condition}
    if run.replay_from:
        labels["replay_from"] = run.replay_from
    base = f"http://127.0.0.1:{port}/_nf/" + ",".join(f"{k}={quote(v, safe='')}" for k, v in labels.items())
    taskdir.mkdir(parents=True, exist_ok=True)
    task_file = taskdir / f"{run.session.replace('/', '_')}.json"
    task_file.write_text(json.dumps({**(json.loads(run.extra) if run.extra else {}), "task_id": run.task_id,
                                     "prompt": run.prompt, "entry_point": run.entry_point}))
    env = {**os.environ, **sdk_env(base), "NF_TASK_FILE": str(task_file), "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "sk-nfladder"),
           "ANTHROPIC_API_KEY": os.environ.get("ANTHROPIC_API_KEY", "sk-nfladder"), **dict(run.env)}
    argv = [a.replace("{task_file}", str(task_file)) for a in run.agent]
    start = time.monotonic()
    if argv and argv[0].startswith(INLINE):  # no interpreter per run: a study's hundreds of short runs
        return _run_inline(run, argv[0][len(INLINE):], task_file, env, start)
    timed_out, code, err, printed = False, None, "", ""
    try:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as exc:
        proc, code, err = None, exit_codes.NOT_STARTED, f"cannot start agent: {exc}"
    if proc is not None:
        with _LOCK:
            _RUNNING.add(proc)
            late = _stopping
        if late:  # the interrupt came while it started: it is not left to run its course
            _kill(proc)
        try:
            printed, err = proc.communicate(timeout=run.timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # the agent and anything it started
            _, err = proc.communicate()
        finally:
            with _LOCK:
                _RUNNING.discard(proc)
    return Attempt(run.session, run.task_id, run.condition, run.replicate, code, timed_out,
                   round(time.monotonic() - start, 3), err[-STDERR_TAIL:], (printed or "")[-OUTPUT_TAIL:])


def _run_inline(run: AgentRun, spec: str, task_file: Path, env: dict[str, str], start: float) -> Attempt:
    """A built-in client (`MODULE[:FUNCTION]` of this package, `run` by default) in this thread; its
    HTTP calls are bounded by the run's timeout, as a script's would be by the kill."""
    import importlib

    module, _, function = spec.partition(":")
    client = getattr(importlib.import_module(f"noisefloor.ladder.{module}"), function or "run")
    env = {**env, "NF_AGENT_HTTP_TIMEOUT": env.get("NF_AGENT_HTTP_TIMEOUT", str(min(60.0, run.timeout)))}
    code, printed, err = client(json.loads(task_file.read_text()), env)
    return Attempt(run.session, run.task_id, run.condition, run.replicate, code, False,
                   round(time.monotonic() - start, 3), err[-STDERR_TAIL:], printed[-OUTPUT_TAIL:])
