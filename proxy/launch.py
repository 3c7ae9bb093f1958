"""Start an `nfproxy run` subprocess and wait until it listens: the one launcher that nfladder,
the benchmarks and the tests share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from noisefloor.errors import StateError

START_TIMEOUT_S = 60.0
# The contract between this launcher and `nfproxy run` (serve.py), kept here so that a launcher
# (nfladder, a Ray worker) does not import the server to start one.
READY = "NFPROXY_READY "  # the ready line's prefix: then host:port
READY_LINE_ENV = "NFPROXY_READY_LINE"  # set by `start`: print the ready line even with -q
# Ends the run like SIGTERM, but the exit status is the run's own (0, 1 exchanges not recorded, 3 a
# strict replay that failed): how a program that started a proxy stops it and learns what it saw.
FINISH_SIGNAL = signal.SIGUSR1


_STARTED: set[subprocess.Popen[str]] = set()  # proxies started here and not stopped yet
_LOCK = threading.Lock()


def kill_started() -> None:
    """SIGKILL every proxy this process started and has not stopped: the last resort of a command
    that cannot unwind (its SIGTERM deadline), so no proxy outlives it."""
    with _LOCK:
        procs = list(_STARTED)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()


class ProxyStartError(StateError):
    """nfproxy exited or did not listen in time; the message holds its last lines."""


def nfproxy_argv() -> list[str]:
    """The installed `nfproxy` beside this interpreter, else the module."""
    exe = Path(sys.executable).with_name("nfproxy")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "noisefloor.proxy.cli"]


@dataclass
class RunningProxy:
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)  # everything it printed (stdout and stderr)
    port: int = 0
    reader: threading.Thread | None = None  # reads its output into `lines`

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self, sig: int = FINISH_SIGNAL, timeout: float = 30) -> int:
        """Signal it, wait for its exit status (SIGKILL if it hangs). The default signal ends the
        proxy with the run's own status (0, 1, 3); SIGINT / SIGTERM end it with 130 / 143."""
        with _LOCK:
            _STARTED.discard(self.proc)
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        if self.reader is not None:
            self.reader.join(5)  # the summary line is read before the caller looks at the output
        return code


def start(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
          timeout: float = START_TIMEOUT_S) -> RunningProxy:
    """`nfproxy run --listen 127.0.0.1:0 ARGS...`, returned once it has printed its ready line."""
    proc = subprocess.Popen(
        [*nfproxy_argv(), "run", "--listen", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
        env={**os.environ, READY_LINE_ENV: "1", **(env or {})},  # the port even under -q
    )
    with _LOCK:
        _STARTED.add(proc)
    running = RunningProxy(proc)
    try:
        return _until_ready(running, timeout)
    except BaseException:  # an interrupt while it starts, or a start that failed: it does not live on
        running.stop(signal.SIGKILL, timeout=10)
        raise


def _until_ready(running: RunningProxy, timeout: float) -> RunningProxy:
    proc = running.proc
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            running.lines.append(line)
            if line.startswith(READY):
                running.port = int(line.rsplit(":", 1)[1])
                ready.set()
        ready.set()

    running.reader = threading.Thread(target=pump, daemon=True)
    running.reader.start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.05):
        if time.monotonic() > deadline:
            proc.kill()
            raise ProxyStartError(f"nfproxy did not listen within {timeout:g} s: " + " | ".join(running.lines[-5:]))
    if not running.port:
        proc.wait(10)
        raise ProxyStartError(f"nfproxy exited before listening (status {proc.returncode}): "
                              + " | ".join(running.lines[-5:]))
    return running
