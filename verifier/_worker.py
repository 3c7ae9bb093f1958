"""Sandbox fork server: one per worker slot, forks a fresh process per candidate.

Started by `verifier.sandbox` in its own session, with an allow-listed environment and, as root,
in an empty network namespace. It imports what candidates commonly use once, says it is ready,
then reads one JSON job per line on stdin. For each job it forks a child that (as root) enters a
private filesystem view (`_jail`), drops to the slot's unprivileged uid, applies the resource
limits, closes every inherited descriptor, and only then runs the candidate, writing one JSON line
per input to a pipe. If any of those steps fails the candidate never runs: the child reports a
`sandbox_error` instead. This server relays the child's lines framed so that a candidate cannot
forge the server's own lines, and reports how the child ended.

Frames on stdout, one per line: `R {ready}`, `S {started: pid}`, `I {isolated}` (from the child
before the candidate's code, on a pipe it closes first), `C <candidate line>`, `E {end}`.
The server never sees expected outputs: it cannot compare, so a candidate cannot forge a pass.
Standard library only.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import resource
import select
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if TYPE_CHECKING:  # the same two files, as the type checker finds them: in the installed package
    from noisefloor.verifier import _jail
    from noisefloor.verifier.values import decode, encode_output
else:
    import _jail
    from values import decode, encode_output

sys.path.pop(0)  # the candidate must not import the verifier's own modules

MAX_LINE = 32 << 20  # one encoded output larger than this is reported as too large
MAX_OUTPUT = 512 << 20  # bytes relayed per candidate at most
_POLL_S = 0.05
_DRAIN_S = 1.0  # after the child exits, how long its descendants' writes are still relayed
_ISOLATE_S = 60.0  # how long the isolation steps may take before the candidate counts as not isolated

# Imported once here, so a candidate pays nothing for them (and numpy is the slow one).
PRELOAD = (
    "array", "bisect", "cmath", "collections", "collections.abc", "copy", "dataclasses", "datetime", "decimal",
    "enum", "fractions", "functools", "hashlib", "heapq", "itertools", "json", "math", "numbers", "operator",
    "random", "re", "statistics", "string", "textwrap", "typing", "unicodedata", "sys", "os", "time", "queue",
    "calendar", "struct", "binascii", "base64", "difflib", "pprint", "contextlib", "abc", "numpy",
)


class _SandboxStepFailed(Exception):
    """An isolation step failed: the candidate must not run."""


def _preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional module (numpy) may be missing
            pass


def _limit(lim: dict) -> None:
    mb = 1 << 20
    # SIGXCPU at the soft limit names the cause; the hard limit a second later is the backstop
    for res, soft, hard in (
        (resource.RLIMIT_CPU, lim["cpu_s"], lim["cpu_s"] + 1),
        (resource.RLIMIT_AS, lim["memory_mb"] * mb, lim["memory_mb"] * mb),
        (resource.RLIMIT_FSIZE, lim["fsize_mb"] * mb, lim["fsize_mb"] * mb),
        (resource.RLIMIT_NPROC, lim["nproc"], lim["nproc"]),
        (resource.RLIMIT_NOFILE, lim["nofile"], lim["nofile"]),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        try:
            resource.setrlimit(res, (soft, hard))
        except (ValueError, OSError) as exc:
            raise _SandboxStepFailed(f"setrlimit({res}) failed: {exc}") from exc


def _no_sockets() -> None:
    """Best-effort socket ban, for the unprivileged mode that has no network namespace."""

    def refuse(*_a: object, **_k: object) -> None:
        raise OSError("network access is disabled in the noisefloor sandbox")

    socket.socket = refuse  # type: ignore[assignment,misc]
    socket.create_connection = refuse  # type: ignore[assignment]
    socket.socketpair = refuse  # type: ignore[assignment]


def _emit(fd: int, doc: dict) -> None:
    line = json.dumps(doc)
    if len(line) > MAX_LINE:
        line = json.dumps({k: v for k, v in doc.items() if k != "out"} | {"ok": False, "exc": "OutputTooLarge"})
    os.write(fd, line.encode() + b"\n")


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"[:500]
    except Exception:  # noqa: BLE001 - a hostile __str__
        return type(exc).__name__


def _isolate(job: dict, out_fd: int, ctl_fd: int, view: dict | None) -> None:
    """Every containment step, in order; raises _SandboxStepFailed if one cannot be taken."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    keep = sorted({0, 1, 2, out_fd, ctl_fd})
    for lo, hi in zip(keep, keep[1:] + [resource.getrlimit(resource.RLIMIT_NOFILE)[0]]):
        os.closerange(lo + 1, hi)  # the server's job and frame pipes above all
    uid = job.get("uid")
    try:
        if uid is not None:
            _jail.enter(job["root"], view or {}, uid, job["limits"]["tmpfs_mb"])
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            if os.getuid() != uid or os.geteuid() != uid:
                raise _SandboxStepFailed("the uid drop did not hold")
        else:
            os.chdir(job["workdir"])
    except OSError as exc:
        raise _SandboxStepFailed(str(exc)) from exc
    _limit(job["limits"])
    if job.get("ban_sockets"):
        _no_sockets()


def _candidate(job: dict, out_fd: int) -> None:
    try:
        code = compile(job["code"], "candidate.py", "exec")
    except (SyntaxError, ValueError) as exc:
        _emit(out_fd, {"phase": "load", "ok": False, "kind": "syntax_error", "exc": f"{type(exc).__name__}: {exc}"})
        return
    namespace: dict = {"__name__": "__candidate__"}
    try:
        exec(code, namespace)
    except BaseException as exc:  # noqa: BLE001 - any failure of candidate code is its result
        _emit(out_fd, {"phase": "load", "ok": False, "kind": "exception", "exc": _describe(exc)})
        return
    fn = namespace.get(job["entry_point"])
    if not callable(fn):
        _emit(out_fd, {"phase": "load", "ok": False, "kind": "no_code", "exc": f"no function {job['entry_point']}"})
        return
    _emit(out_fd, {"phase": "load", "ok": True})
    for i, args in enumerate(decode(job["inputs"])):
        try:
            out = fn(*copy.deepcopy(args))
            doc = {"i": i, "ok": True, "out": encode_output(out, job.get("unordered", False))}
        except BaseException as exc:  # noqa: BLE001
            doc = {"i": i, "ok": False, "exc": _describe(exc)}
        try:
            _emit(out_fd, doc)
        except (ValueError, TypeError, RecursionError) as exc:  # an output JSON cannot carry
            _emit(out_fd, {"i": i, "ok": False, "exc": "unencodable output: " + _describe(exc)})


def _child(job: dict, out_fd: int, ctl_fd: int, view: dict | None) -> None:
    """Isolation, then its verdict on the control pipe, which is closed before the candidate's code
    runs: the candidate holds no descriptor on which a word of it would be believed."""
    try:
        _isolate(job, out_fd, ctl_fd, view)
    except _SandboxStepFailed as exc:
        _emit(ctl_fd, {"isolated": False, "exc": str(exc)[:500]})
        return
    _emit(ctl_fd, {"isolated": True})
    os.close(ctl_fd)
    _candidate(job, out_fd)


def _frame(tag: bytes, payload: bytes) -> None:
    os.write(1, tag + b" " + payload + b"\n")


def _relay(pid: int, read_fd: int) -> tuple[int, resource.struct_rusage]:
    """Forward the child's lines until it exits and its pipe is at EOF; a descendant that keeps the
    pipe open after the child is gone is read for _DRAIN_S more (what it writes then is a late line,
    which fails the candidate) and then no longer."""
    pending, sent, status, drain_until = b"", 0, None, None
    while drain_until is None or time.monotonic() < drain_until:
        ready, _, _ = select.select([read_fd], [], [], _POLL_S)
        chunk = os.read(read_fd, 1 << 16) if ready else b""
        if ready and not chunk:
            break  # EOF: every writer is gone
        if chunk and sent < MAX_OUTPUT:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                sent += len(line)
                if sent <= MAX_OUTPUT:
                    _frame(b"C", line)
            if len(pending) > MAX_LINE + 4096:
                pending = b""  # a line no honest output makes: dropped
        if status is None:
            done, st, usage = os.wait4(pid, os.WNOHANG)
            if done:
                status = (st, usage)
                drain_until = time.monotonic() + _DRAIN_S
    if status is None:
        _, st, usage = os.wait4(pid, 0)
        status = (st, usage)
    return status


def _isolation(ctl_fd: int) -> bytes:
    """The child's isolation verdict (one line, written before any candidate code ran)."""
    got, deadline = b"", time.monotonic() + _ISOLATE_S
    while b"\n" not in got and len(got) < 4096:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([ctl_fd], [], [], left)[0]:
            break
        chunk = os.read(ctl_fd, 4096)
        if not chunk:
            break
        got += chunk
    line = got.split(b"\n", 1)[0]
    return line or json.dumps({"isolated": False, "exc": "the candidate process reported no isolation"}).encode()


def _reap() -> None:
    """Collect candidates' orphans (this server is their subreaper) before the next candidate."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve() -> None:
    _jail.become_subreaper()
    _preload()
    view = _jail.plan() if os.geteuid() == 0 else None
    interfaces = sorted(name for _, name in socket.if_nameindex())
    _frame(b"R", json.dumps({"pid": os.getpid(), "interfaces": interfaces}).encode())
    for raw in sys.stdin.buffer:
        job = json.loads(raw)
        _reap()
        read_fd, write_fd = os.pipe()
        ctl_read, ctl_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            os.close(ctl_read)
            try:
                _child(job, write_fd, ctl_write, view)
            finally:
                os._exit(0)
        os.close(write_fd)
        os.close(ctl_write)
        _frame(b"S", json.dumps({"pid": pid}).encode())
        _frame(b"I", _isolation(ctl_read))
        os.close(ctl_read)
        st, usage = _relay(pid, read_fd)
        os.close(read_fd)
        sig = os.WTERMSIG(st) if os.WIFSIGNALED(st) else None
        end = {"signal": sig, "signal_name": signal.Signals(sig).name if sig else None,
               "cpu_s": usage.ru_utime + usage.ru_stime}
        _frame(b"E", json.dumps(end).encode())


if __name__ == "__main__":
    serve()
