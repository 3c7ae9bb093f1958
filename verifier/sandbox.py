"""Run untrusted candidate code in a subprocess with limits.

Containment, strongest first, as far as the machine allows:
- as root: each worker slot runs under its own unprivileged uid (60000 + slot), so it cannot
  touch files it does not own, signal the verifier, or exceed RLIMIT_NPROC (which root ignores);
  in a fresh network namespace (no interfaces up: no loopback, no internet); and every process
  of that uid is killed when the run ends, whatever it did with setsid.
- not root: RLIMIT_NPROC applies to the user's own processes, sockets are refused inside the
  candidate's Python process (best effort), and the process group is killed at the end.
Always: a new session, a fresh temporary working directory, limits on CPU time, address space,
file size, open files and processes, stdout/stderr discarded, a wall-clock limit, and the
candidate runs in a grandchild so killing its parent does not reach the verifier.

CPU time, not wall time, is the primary limit: a loaded machine stretches wall time but not CPU
time, so the verdict on an unchanged candidate does not depend on what else is running (the
seed study's replay flips came from a wall-clock alarm). The wall limit is a backstop at
`wall_factor` times the CPU limit.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("_worker.py")
BASE_UID = 60000
UID_RANGE = 4096  # slot uids are BASE_UID .. BASE_UID + UID_RANGE - 1
_UID_LOCKS = Path(tempfile.gettempdir()) / "noisefloor-sandbox-uids"
_CLONE_NEWNET = 0x40000000
_MAX_OUTPUT = 512 << 20  # bytes of worker output kept at most


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 10
    wall_factor: float = 3.0
    memory_mb: int = 2048
    fsize_mb: int = 16
    nproc: int = 32
    nofile: int = 64

    def job(self) -> dict[str, int]:
        return {"cpu_s": self.cpu_s, "memory_mb": self.memory_mb, "fsize_mb": self.fsize_mb, "nproc": self.nproc,
                "nofile": self.nofile}


@dataclass(frozen=True)
class RunResult:
    load: dict[str, Any] | None  # the load line: ok, or why not
    results: list[dict[str, Any]]  # one per input that finished
    timed_out: bool
    signal_name: str | None  # how the candidate process ended, if by a signal
    worker_killed: bool  # the relay parent itself died (the candidate killed it)
    wall_s: float
    cpu_s: float | None  # CPU time the candidate process used
    notes: list[str] = field(default_factory=list)


@lru_cache(maxsize=1)
def isolation() -> str:
    """'uid+netns', 'uid' or 'none': what this machine allows (checked once, by trying)."""
    if os.geteuid() != 0:
        return "none"
    probe = subprocess.run(
        [sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)"],
        preexec_fn=_preexec(netns=True), capture_output=True, text=True, timeout=30,
    )
    return "uid+netns" if "unreachable" in probe.stderr or "Errno 101" in probe.stderr else "uid"


def _unshare_net() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")


def _preexec(netns: bool) -> Any:
    """New session and, where possible, a network namespace with nothing in it.

    The uid is dropped later, inside the worker's candidate process: Python and its standard
    library often live where an unprivileged uid cannot read (e.g. under /root), so the worker
    starts privileged, loads what candidates commonly import, and only then becomes the slot uid.
    """

    def setup() -> None:
        os.setsid()
        if netns:
            try:
                _unshare_net()
            except OSError:
                pass  # isolation() found out; the worker then bans sockets

    return setup


class Sandbox:
    """A pool of worker slots; `run` is thread-safe and blocks for one slot."""

    def __init__(self, workers: int = 1, limits: Limits = Limits()) -> None:
        self.limits = limits
        self.workers = max(1, workers)
        self.mode = isolation()
        # Every slot owns a uid no other sandbox (in this or another process) uses at the same time,
        # because the end of a run kills every process of the slot's uid.
        self._locks = [_claim_uid() for _ in range(self.workers)] if self.mode != "none" else []
        self._slots: queue.Queue[int | None] = queue.Queue()
        for i in range(self.workers):
            self._slots.put(self._locks[i][0] if self._locks else None)

    @property
    def uids(self) -> list[int]:
        return [uid for uid, _ in self._locks]

    @contextmanager
    def _slot(self) -> Iterator[int | None]:
        slot = self._slots.get()
        try:
            yield slot
        finally:
            self._slots.put(slot)

    def run(self, code: str, entry_point: str, inputs_encoded: Any, unordered: bool = False,
            cpu_s: float | None = None) -> RunResult:
        """Run `code`'s `entry_point` on each input; `unordered`: large outputs are digested as sets;
        `cpu_s` raises the CPU limit above the default for this run."""
        with self._slot() as uid:
            workdir = Path(tempfile.mkdtemp(prefix="nfverify-"))
            try:
                if uid is not None:
                    os.chown(workdir, uid, uid)
                limits = replace(self.limits, cpu_s=max(self.limits.cpu_s, math.ceil(cpu_s or 0)))
                job = {"code": code, "entry_point": entry_point, "inputs": inputs_encoded, "workdir": str(workdir),
                       "limits": limits.job(), "ban_sockets": self.mode != "uid+netns", "uid": uid,
                       "unordered": unordered}
                return self._execute(job, limits)
            finally:
                if uid is not None:
                    kill_uid(uid)
                shutil.rmtree(workdir, ignore_errors=True)

    def _execute(self, job: dict[str, Any], limits: Limits) -> RunResult:
        start = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-I", str(WORKER)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            preexec_fn=_preexec(netns=self.mode == "uid+netns"), cwd=job["workdir"],
        )
        wall = limits.cpu_s * limits.wall_factor + 2
        timed_out = False
        try:
            out, _ = proc.communicate(json.dumps(job).encode(), timeout=wall)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            out, _ = proc.communicate()
        finally:
            _kill_group(proc.pid)
        return parse(out[:_MAX_OUTPUT], timed_out, time.monotonic() - start, limits.cpu_s)


def parse(raw: bytes, timed_out: bool, wall_s: float, cpu_limit: float) -> RunResult:
    load, results, end = None, [], None
    for line in raw.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("phase") == "load" and load is None:
            load = doc
        elif doc.get("phase") == "end":
            end = doc
        elif "i" in doc:
            results.append(doc)
    sig = end.get("signal_name") if end else None
    cpu = end.get("cpu_s") if end else None
    worker_killed = end is None and not timed_out
    if sig == "SIGXCPU" or (sig == "SIGKILL" and cpu is not None and cpu >= cpu_limit - 0.05):
        timed_out = True
    return RunResult(load, results, timed_out, sig, worker_killed, wall_s, cpu)


def _claim_uid() -> tuple[int, Any]:
    """An unused slot uid, held by an exclusive lock on its lock file for this process's lifetime."""
    _UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    for uid in range(BASE_UID, BASE_UID + UID_RANGE):
        fh = open(_UID_LOCKS / f"{uid}.lock", "a")  # noqa: SIM115 - kept open: the lock lives with it
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            continue
        return uid, fh
    raise RuntimeError(f"all {UID_RANGE} sandbox uids are in use; too many verifiers run at once")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def live_pids(uid: int) -> list[int]:
    """Processes of `uid` that are still running (zombies, already dead, are left to their reaper)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            pids.append(int(entry.name))
    return pids


def kill_uid(uid: int) -> int:
    """SIGKILL every live process owned by `uid` (root only); returns how many were signalled."""
    killed = 0
    for _ in range(20):  # a fork bomb may fork between the scan and the kill: sweep until quiet
        pids = live_pids(uid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
        killed += len(pids)
        if not pids:
            break
        time.sleep(0.02)
    return killed
