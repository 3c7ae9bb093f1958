"""What a candidate is given: its limits, its environment, and which isolation it runs under.

As root the default is 'namespaces' (network, mount and uid isolation, failing closed); without
root it is 'process' (no namespaces, sockets refused inside the candidate's Python, the user's
own file permissions). The environment is allow-listed: no credentials and nothing of the
verifier's beyond what a program needs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from noisefloor.errors import StateError
from noisefloor.proxy.request import secrets as secrets_mod

# The only variables a candidate sees. OPENBLAS_* are kept because some processors need them for
# a correct numpy; nothing else of the verifier's environment passes.
_ENV_PASS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_ENV_FIXED = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/candidate",
              "TMPDIR": "/tmp", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "OPENBLAS_NUM_THREADS": "1",
              "OMP_NUM_THREADS": "1"}
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|SESSION", re.I)
MODES = ("namespaces", "process")


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


def default_isolation() -> str:
    """'namespaces' as root (uid, network and mount namespaces), else 'process'."""
    return "namespaces" if os.geteuid() == 0 else "process"


def isolation_mode(asked: str | None) -> str:
    """The isolation a sandbox runs under; one the machine cannot give is refused before any candidate runs."""
    mode = asked or default_isolation()
    if mode not in MODES:
        raise SandboxError(f"unknown isolation {mode!r}; choose 'namespaces' or 'process'")
    if mode == "namespaces" and os.geteuid() != 0:
        raise SandboxError("namespace isolation needs root; run the verifier as root or choose 'process'")
    return mode


def candidate_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {**{k: environ[k] for k in _ENV_PASS if k in environ}, **_ENV_FIXED}


def known_secrets(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Values in the verifier's environment that look like credentials, longest first."""
    environ = os.environ if environ is None else environ
    vals = {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= secrets_mod.MIN_SECRET}
    return tuple(sorted(vals, key=len, reverse=True))
