"""Run untrusted candidate code in a pre-started fork server per worker slot, with limits.

Containment, as root (the default wherever the verifier runs as root, and then required):
- each slot's fork server runs in an empty network namespace (no interfaces up: no loopback,
  no internet; abstract Unix sockets are per namespace too);
- each candidate gets its own mount namespace whose root is a fresh tmpfs holding only the
  interpreter's folders and `/usr`, read-only, plus its own `/tmp`, `/var/tmp`, `/dev/shm` and
  working folder (`_jail`): datasets, caches, stores, home folders, the repository and any
  filesystem socket outside do not exist for it, and what it writes vanishes with it;
- it runs under the slot's own unprivileged uid (claimed under a lock: `uids`), so
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

This module is the pool of slots; `isolation` says what a candidate is given, `forkserver` runs
one slot's server, `protocol` reads what a candidate writes, `uids` claims and sweeps slot uids.
"""

from __future__ import annotations

import json
import math
import queue
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from noisefloor.verifier.forkserver import ForkServer
from noisefloor.verifier.isolation import Limits, SandboxError, isolation_mode, known_secrets
from noisefloor.verifier.protocol import CandidateLines, Decides, RunResult, parse_line, run_result
from noisefloor.verifier.uids import claim_uid, kill_group, kill_uid

_MAX_OUTPUT = 512 << 20  # bytes of worker output kept at most


class Sandbox:
    """A pool of worker slots, each with its fork server; `run` is thread-safe and blocks for one
    slot. `isolation`: 'namespaces' (root; fails closed), 'process', or None for what the uid allows."""

    def __init__(self, workers: int = 1, limits: Limits | None = None, isolation: str | None = None) -> None:
        self.limits = limits or Limits()
        self.workers = max(1, workers)
        self.mode = isolation_mode(isolation)
        self.secrets = known_secrets()
        # Every slot owns a uid no other sandbox (in this or another process) uses at the same time,
        # because the end of a run kills every process of the slot's uid.
        self._locks = [claim_uid() for _ in range(self.workers)] if self.mode == "namespaces" else []
        self._root = tempfile.mkdtemp(prefix="nfsandbox-root-") if self.mode == "namespaces" else None
        self._servers: list[ForkServer | None] = [None] * self.workers
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

    def _server(self, slot: int) -> ForkServer:
        srv = self._servers[slot]
        if srv is None or not srv.alive():
            srv = self._servers[slot] = ForkServer(self.mode == "namespaces", self._root)
        return srv

    def run(self, code: str, entry_point: str, inputs_encoded: Any, unordered: bool = False,
            cpu_s: float | None = None, *, decides: Decides | None = None) -> RunResult:
        """Run `code`'s `entry_point` on each input; `unordered`: large outputs are digested as sets;
        `cpu_s` raises the CPU limit above the default for this run; `decides(i, line, value)`: the
        candidate is stopped at the first result it calls decisive (its verdict is settled there)."""
        limits = replace(self.limits, cpu_s=max(self.limits.cpu_s, math.ceil(cpu_s or 0)))
        job: dict[str, Any] = {"code": code, "entry_point": entry_point, "inputs": inputs_encoded,
                               "limits": limits.job(), "ban_sockets": self.mode != "namespaces",
                               "unordered": unordered}
        with self._slot() as slot:
            if self.mode == "namespaces":
                job |= {"uid": self._locks[slot][0], "root": self._root}
                return self._execute(slot, job, limits, decides)
            workdir = tempfile.mkdtemp(prefix="nfverify-")
            try:
                return self._execute(slot, job | {"workdir": workdir}, limits, decides)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)

    def _execute(self, slot: int, job: dict[str, Any], limits: Limits, decides: Decides | None) -> RunResult:
        srv = self._server(slot)
        srv.send(job)
        deadline = time.monotonic() + limits.cpu_s * limits.wall_factor + 2
        lines = CandidateLines(len(job["inputs"]) if isinstance(job["inputs"], list) else 0, decides)
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
            assert payload is not None  # frame() gives both or neither
            if tag == b"S":
                pid = json.loads(payload)["pid"]
            elif tag == b"I":
                isolation = parse_line(payload) or {"isolated": False, "exc": "unreadable isolation report"}
            elif tag == b"E":
                end = json.loads(payload)
            elif tag == b"C" and kept < _MAX_OUTPUT and lines.violation is None and not lines.decided:
                kept += len(payload)
                lines.take(payload)
                if lines.violation is not None or lines.decided:
                    self._stop(job, pid)  # what it writes from here on is read and dropped
        self._stop(job, pid)
        if end is None:
            srv.close()
            self._servers[slot] = None
        if isolation is not None and isolation.get("isolated") is not True:
            raise SandboxError(f"sandbox isolation failed, candidate not run: {isolation.get('exc')}")
        return run_result(lines, end, timed_out and lines.violation is None, limits.cpu_s, self.secrets)

    def _stop(self, job: dict[str, Any], pid: int | None) -> None:
        if "uid" in job:
            kill_uid(job["uid"])
        elif pid is not None:
            kill_group(pid)

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
