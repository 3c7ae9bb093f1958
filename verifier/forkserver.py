"""One slot's fork server process (`_worker.py`) and the framed lines it writes on its stdout.

The server is started in its own session with the allow-listed environment and, under namespace
isolation, in its own empty network namespace. It says it is ready (with the interfaces it
sees), then takes one job per line on stdin; what it writes back is framed (`tag payload`), so a
candidate cannot forge the server's own frames.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from noisefloor.verifier import _jail
from noisefloor.verifier.isolation import SandboxError, candidate_env
from noisefloor.verifier.uids import kill_group

WORKER = Path(__file__).with_name("_worker.py")
START_TIMEOUT_S = 60.0


class ForkServer:
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
        tag, ready = self.frame(time.monotonic() + START_TIMEOUT_S)
        if tag != b"R" or ready is None:
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
        kill_group(self.proc.pid)
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f:
                f.close()
