"""Sandbox worker: runs one candidate program on a list of inputs and reports its outputs.

Started by `verifier.sandbox` as `python -I _worker.py`, already in its own session, network
namespace and (when the verifier runs as root) an unprivileged uid. It reads one JSON job on
stdin, then forks: the child applies the resource limits, silences stdout/stderr, runs the
candidate and writes one JSON line per input to a pipe; this parent only relays those lines and
reports how the child ended. The parent exists so that a candidate that kills its parent
(`os.kill(os.getppid(), 9)`) kills this relay, not the verifier.

The worker never sees expected outputs: it cannot compare, so a candidate cannot forge a pass.
Standard library only.
"""

from __future__ import annotations

import copy
import json
import os
import resource
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from values import decode, encode_output  # noqa: E402

MAX_LINE = 32 << 20  # one encoded output larger than this is reported as too large


def _limit(job: dict) -> None:
    lim = job["limits"]
    mb = 1 << 20
    try:  # SIGXCPU at the soft limit names the cause; the hard limit a second later is the backstop
        resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))
    except (ValueError, OSError):
        pass
    for res, value in (
        (resource.RLIMIT_AS, lim["memory_mb"] * mb),
        (resource.RLIMIT_FSIZE, lim["fsize_mb"] * mb),
        (resource.RLIMIT_NPROC, lim["nproc"]),
        (resource.RLIMIT_NOFILE, lim["nofile"]),
        (resource.RLIMIT_CORE, 0),
    ):
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            pass


def _no_sockets() -> None:
    """Best-effort socket ban, used only where no network namespace could be made."""
    import socket

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


# Loaded before the uid drop: the unprivileged uid may not be able to read the standard library.
PRELOAD = (
    "array", "bisect", "cmath", "collections", "collections.abc", "copy", "dataclasses", "datetime", "decimal",
    "enum", "fractions", "functools", "hashlib", "heapq", "itertools", "json", "math", "numbers", "operator",
    "random", "re", "statistics", "string", "textwrap", "typing", "unicodedata", "sys", "os", "time", "queue",
    "calendar", "struct", "binascii", "base64", "difflib", "pprint", "contextlib", "abc",
)


def _preload(code: str) -> None:
    import importlib

    for name in PRELOAD + (("numpy",) if "numpy" in code else ()):  # numpy is slow to import: only on demand
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional module (numpy) may be missing
            pass


def _drop_privileges(uid: int | None) -> None:
    if uid is None:
        return
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _child(job: dict, out_fd: int) -> None:
    _preload(job["code"])
    os.chdir(job["workdir"])
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    _drop_privileges(job.get("uid"))
    _limit(job)
    if job.get("ban_sockets"):
        _no_sockets()
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


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"[:500]
    except Exception:  # noqa: BLE001 - a hostile __str__
        return type(exc).__name__


def main() -> None:
    job = json.loads(sys.stdin.buffer.read())
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            _child(job, write_fd)
        finally:
            os._exit(0)
    os.close(write_fd)
    out = sys.stdout.buffer
    with os.fdopen(read_fd, "rb") as pipe:
        for line in pipe:
            out.write(line)
            out.flush()
    _, status, usage = os.wait4(pid, 0)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    end = {"phase": "end", "signal": sig, "signal_name": signal.Signals(sig).name if sig else None,
           "cpu_s": usage.ru_utime + usage.ru_stime}
    out.write(json.dumps(end).encode() + b"\n")
    out.flush()


if __name__ == "__main__":
    main()
