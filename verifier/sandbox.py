"""Run untrusted candidate code in a pre-started fork server per worker slot, with limits.

Containment, as root (the default wherever the verifier runs as root, and then required):
- each slot's fork server runs in an empty network namespace (no interfaces up: no loopback,
  no internet; abstract Unix sockets are per namespace too);
- each candidate gets its own mount namespace whose root is a fresh tmpfs holding only the
  interpreter's folders and `/usr`, read-only, plus its own `/tmp`, `/var/tmp`, `/dev/shm` and
  working folder (`_jail`): datasets, caches, stores, home folders, the repository and any
  filesystem socket outside do not exist for it, and what it writes vanishes with it;
- it runs under the slot's own unprivileged uid (BASE_UID + n, claimed under a lock), so
  RLIMIT_NPROC bites and every process of that uid can be killed at the end of a run.
Isolation fails closed: if any step cannot be taken the candidate does not run and
`SandboxError` says why; nothing is graded on a half-built sandbox.

Without root (or with `isolation="process"`): no namespaces and no uid change; sockets are
refused inside the candidate's Python (best effort), files are the user's own permissions, and
each candidate gets a fresh temporary working folder.

Always: an allow-listed environment (no credentials, nothing of the verifier's beyond what a
program needs), a new session, limits on CPU time, address space, file size, open files and
processes, stdout/stderr discarded, and a wall-clock backstop. CPU time, not wall time, decides
timeouts, so machine load cannot flip a verdict (the seed study's replay flips came from a
wall-clock alarm). The fork server imports common modules once, so a quick candidate costs a
fork, not an interpreter start.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import queue
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from noisefloor.errors import StateError
from noisefloor.proxy import secrets as secrets_mod
from noisefloor.verifier import _jail
from noisefloor.verifier.values import decode

WORKER = Path(__file__).with_name("_worker.py")
BASE_UID = 60000
UID_RANGE = 4096  # slot uids are BASE_UID .. BASE_UID + UID_RANGE - 1
_UID_LOCKS = Path(tempfile.gettempdir()) / "noisefloor-sandbox-uids"
_MAX_OUTPUT = 512 << 20  # bytes of worker output kept at most
_START_TIMEOUT_S = 60.0

# The only variables a candidate sees. OPENBLAS_* are kept because some processors need them for
# a correct numpy (see the machine notes); nothing else of the verifier's environment passes.
_ENV_PASS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_ENV_FIXED = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/candidate",
              "TMPDIR": "/tmp", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "OPENBLAS_NUM_THREADS": "1",
              "OMP_NUM_THREADS": "1"}
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|SESSION", re.I)


class SandboxError(StateError):
    """Isolation could not be set up; no candidate was run (fail closed)."""


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 10
    wall_factor: float = 3.0
    memory_mb: int = 2048
    fsize_mb: int = 16
    nproc: int = 32
    nofile: int = 64
    tmpfs_mb: int = 64  # the candidate's whole writable view (working folder and /tmp), as root

    def job(self) -> dict[str, int]:
        return {"cpu_s": self.cpu_s, "memory_mb": self.memory_mb, "fsize_mb": self.fsize_mb, "nproc": self.nproc,
                "nofile": self.nofile, "tmpfs_mb": self.tmpfs_mb}


@dataclass(frozen=True)
class RunResult:
    load: dict[str, Any] | None  # the load line: ok, or why not
    results: list[dict[str, Any]]  # one per input that finished
    timed_out: bool
    signal_name: str | None  # how the candidate process ended, if by a signal
    worker_killed: bool  # the fork server itself died (the candidate killed it)
    cpu_s: float | None  # CPU time the candidate process used
    violation: str | None = None  # the candidate broke the line protocol (it alone fails: sandbox_violation)


def default_isolation() -> str:
    """'namespaces' as root (uid, network and mount namespaces), else 'process'."""
    return "namespaces" if os.geteuid() == 0 else "process"


def candidate_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {**{k: environ[k] for k in _ENV_PASS if k in environ}, **_ENV_FIXED}


def known_secrets(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Values in the verifier's environment that look like credentials, longest first."""
    environ = os.environ if environ is None else environ
    vals = {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= secrets_mod.MIN_SECRET}
    return tuple(sorted(vals, key=len, reverse=True))


class _Server:
    """One slot's fork server process and the framed lines it writes."""

    def __init__(self, namespaces: bool, root: str | None) -> None:
        def setup() -> None:
            os.setsid()
            if namespaces:  # in the child, before exec: the server's own, empty network namespace
                _jail.unshare(_jail.CLONE_NEWNET)

        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-s", "-P", str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, preexec_fn=setup, cwd=root or "/", env=candidate_env(),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxError(f"could not start the sandbox worker in its own network namespace: {exc}; "
                               "run as root on Linux, or choose isolation='process' (weaker)") from exc
        self._buf = bytearray()
        tag, ready = self.frame(time.monotonic() + _START_TIMEOUT_S)
        if tag != b"R":
            self.close()
            raise SandboxError("the sandbox worker did not start (it printed no ready line)")
        info = json.loads(ready)
        if namespaces and info["interfaces"] not in ([], ["lo"]):
            self.close()
            raise SandboxError(f"the sandbox's network namespace is not empty: {info['interfaces']}")

    def send(self, job: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job).encode() + b"\n")
        self.proc.stdin.flush()

    def frame(self, deadline: float) -> tuple[bytes, bytes] | tuple[None, None]:
        """The next (tag, payload), or (None, None) at the deadline or when the server is gone."""
        out: IO[bytes] = self.proc.stdout  # type: ignore[assignment]
        fd = out.fileno()
        end = self._buf.find(b"\n")
        while end < 0:  # a candidate's output line can be 32 MiB: only the new bytes are searched
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None, None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None, None
            found = chunk.find(b"\n")
            end = len(self._buf) + found if found >= 0 else -1
            self._buf += chunk
        line = bytes(self._buf[:end])
        del self._buf[:end + 1]
        tag, _, payload = line.partition(b" ")
        return tag, payload

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        _kill_group(self.proc.pid)
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f:
                f.close()


class Sandbox:
    """A pool of worker slots, each with its fork server; `run` is thread-safe and blocks for one
    slot. `isolation`: 'namespaces' (root; fails closed), 'process', or None for what the uid allows."""

    def __init__(self, workers: int = 1, limits: Limits = Limits(), isolation: str | None = None) -> None:
        self.limits = limits
        self.workers = max(1, workers)
        self.mode = isolation or default_isolation()
        if self.mode not in ("namespaces", "process"):
            raise SandboxError(f"unknown isolation {self.mode!r}; choose 'namespaces' or 'process'")
        if self.mode == "namespaces" and os.geteuid() != 0:
            raise SandboxError("namespace isolation needs root; run the verifier as root or choose 'process'")
        self.secrets = known_secrets()
        # Every slot owns a uid no other sandbox (in this or another process) uses at the same time,
        # because the end of a run kills every process of the slot's uid.
        self._locks = [_claim_uid() for _ in range(self.workers)] if self.mode == "namespaces" else []
        self._root = tempfile.mkdtemp(prefix="nfsandbox-root-") if self.mode == "namespaces" else None
        self._servers: list[_Server | None] = [None] * self.workers
        self._slots: queue.Queue[int] = queue.Queue()
        for i in range(self.workers):
            self._slots.put(i)

    @property
    def uids(self) -> list[int]:
        return [uid for uid, _ in self._locks]

    @contextmanager
    def _slot(self) -> Iterator[int]:
        slot = self._slots.get()
        try:
            yield slot
        finally:
            self._slots.put(slot)

    def _server(self, slot: int) -> _Server:
        srv = self._servers[slot]
        if srv is None or not srv.alive():
            srv = self._servers[slot] = _Server(self.mode == "namespaces", self._root)
        return srv

    def run(self, code: str, entry_point: str, inputs_encoded: Any, unordered: bool = False,
            cpu_s: float | None = None) -> RunResult:
        """Run `code`'s `entry_point` on each input; `unordered`: large outputs are digested as sets;
        `cpu_s` raises the CPU limit above the default for this run."""
        limits = replace(self.limits, cpu_s=max(self.limits.cpu_s, math.ceil(cpu_s or 0)))
        job: dict[str, Any] = {"code": code, "entry_point": entry_point, "inputs": inputs_encoded,
                               "limits": limits.job(), "ban_sockets": self.mode != "namespaces",
                               "unordered": unordered}
        with self._slot() as slot:
            if self.mode == "namespaces":
                job |= {"uid": self._locks[slot][0], "root": self._root}
                return self._execute(slot, job, limits)
            workdir = tempfile.mkdtemp(prefix="nfverify-")
            try:
                return self._execute(slot, job | {"workdir": workdir}, limits)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)

    def _execute(self, slot: int, job: dict[str, Any], limits: Limits) -> RunResult:
        srv = self._server(slot)
        srv.send(job)
        deadline = time.monotonic() + limits.cpu_s * limits.wall_factor + 2
        lines = CandidateLines(len(job["inputs"]) if isinstance(job["inputs"], list) else 0)
        end, pid, isolation, kept, timed_out = None, None, None, 0, False
        while end is None:
            tag, payload = srv.frame(deadline)
            if tag is None:
                if timed_out or not srv.alive():
                    break  # the server is gone (a candidate can kill it without root) or stuck
                timed_out = True
                self._stop(job, pid)
                deadline = time.monotonic() + 10  # the server reports the end once the pipe closes
                continue
            if tag == b"S":
                pid = json.loads(payload)["pid"]
            elif tag == b"I":
                isolation = _parse_line(payload) or {"isolated": False, "exc": "unreadable isolation report"}
            elif tag == b"E":
                end = json.loads(payload)
            elif tag == b"C" and kept < _MAX_OUTPUT and lines.violation is None:
                kept += len(payload)
                lines.take(payload)
                if lines.violation is not None:
                    self._stop(job, pid)  # what it writes from here on is read and dropped
        self._stop(job, pid)
        if end is None:
            srv.close()
            self._servers[slot] = None
        if isolation is not None and isolation.get("isolated") is not True:
            raise SandboxError(f"sandbox isolation failed, candidate not run: {isolation.get('exc')}")
        return _result(lines.load, lines.results, end, timed_out and lines.violation is None, limits.cpu_s,
                       self.secrets, lines.violation)

    def _stop(self, job: dict[str, Any], pid: int | None) -> None:
        if "uid" in job:
            kill_uid(job["uid"])
        elif pid is not None:
            _kill_group(pid)

    def close(self) -> None:
        for i, srv in enumerate(self._servers):
            if srv is not None:
                srv.close()
                self._servers[i] = None
        if self._root:
            shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _parse_line(payload: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(payload)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


_LOAD_KINDS = ("syntax_error", "exception", "no_code")


class CandidateLines:
    """A candidate's lines checked against their schema as they arrive: one load report, then one
    result per input in order, nothing else. The candidate's process can write anything on this
    pipe, so the first line that departs (malformed, forged, early, late or one too many) ends the
    candidate with a violation; nothing it writes is kept beyond the inputs' count."""

    def __init__(self, inputs: int) -> None:
        self.inputs = inputs
        self.load: dict[str, Any] | None = None
        self.results: list[dict[str, Any]] = []
        self.violation: str | None = None

    def take(self, payload: bytes) -> None:
        if self.violation is not None:
            return
        doc = _parse_line(payload)
        if doc is None:
            self.violation = f"a line that is not a JSON object: {_preview(payload)}"
        elif self.load is None:
            if _is_load(doc):
                self.load = doc
            else:
                self.violation = f"the first line is not the load report: {_preview(payload)}"
        elif not self.load["ok"]:
            self.violation = "a line after a failed load"
        elif len(self.results) >= self.inputs:
            self.violation = f"more lines than the {self.inputs} inputs"
        elif not _is_result(doc, len(self.results)):
            self.violation = f"not the result of input {len(self.results)}: {_preview(payload)}"
        else:
            self.results.append(doc)


def _preview(payload: bytes) -> str:
    return repr(payload[:60])[2:-1] + ("..." if len(payload) > 60 else "")


def _is_load(doc: dict[str, Any]) -> bool:
    if doc.get("phase") != "load" or type(doc.get("ok")) is not bool or not set(doc) <= {"phase", "ok", "kind", "exc"}:
        return False
    if doc["ok"]:
        return set(doc) == {"phase", "ok"}
    return doc.get("kind") in _LOAD_KINDS and isinstance(doc.get("exc"), str)


def _is_result(doc: dict[str, Any], index: int) -> bool:
    if type(doc.get("i")) is not int or doc["i"] != index or type(doc.get("ok")) is not bool:
        return False
    if doc["ok"]:
        if set(doc) != {"i", "ok", "out"}:
            return False
        try:
            decode(doc["out"])
        except Exception:  # noqa: BLE001 - any value the decoder refuses is not an output
            return False
        return True
    return set(doc) == {"i", "ok", "exc"} and isinstance(doc["exc"], str)


def _result(load: dict[str, Any] | None, results: list[dict[str, Any]], end: dict[str, Any] | None,
            timed_out: bool, cpu_limit: float, secrets: tuple[str, ...], violation: str | None = None) -> RunResult:
    sig = end.get("signal_name") if end else None
    cpu = end.get("cpu_s") if end else None
    if sig == "SIGXCPU" or (sig == "SIGKILL" and cpu is not None and cpu >= cpu_limit - 0.05):
        timed_out = True
    if secrets:  # defence in depth: the candidate's environment has none, but text could carry one
        if load is not None and "exc" in load:
            load = load | {"exc": secrets_mod.erase_text(str(load["exc"]), secrets)}
        results = [r | {"exc": secrets_mod.erase_text(str(r["exc"]), secrets)} if "exc" in r else r for r in results]
    if violation is not None:
        violation = secrets_mod.erase_text(violation, secrets) if secrets else violation
        return RunResult(load, results, False, sig, False, cpu, violation)
    return RunResult(load, results, timed_out, sig, end is None and not timed_out, cpu)


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
