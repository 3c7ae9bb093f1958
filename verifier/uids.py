"""Slot uids: each sandbox slot runs its candidates under a uid no other sandbox uses meanwhile.

The end of every run SIGKILLs every process of the slot's uid (a candidate's daemons included),
so a uid is claimed first: an exclusive lock on its lock file, held for the claimer's lifetime,
in one fixed folder (never one that follows TMPDIR), so that every verifier on the machine sees
every other's claims. The folder must be this user's own (0700): one planted by another user is
refused, not trusted.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from pathlib import Path
from typing import IO

from noisefloor.verifier.isolation import SandboxError

BASE_UID = 60000
UID_RANGE = 4096  # slot uids are BASE_UID .. BASE_UID + UID_RANGE - 1
LOCKS = Path("/tmp/noisefloor-sandbox-uids")  # fixed: a TMPDIR that differs per process must not split claims


def claim_uid(locks: Path = LOCKS) -> tuple[int, IO[str]]:
    """An unused slot uid and the open lock file that holds it (close it to give the uid back)."""
    try:
        locks.mkdir(mode=0o700, exist_ok=True)
        st = locks.lstat()
        if locks.is_symlink() or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise SandboxError(f"{locks} is not a private folder of this user; remove it and run again")
    except OSError as exc:
        raise SandboxError(f"cannot make the sandbox's uid lock folder {locks}: {exc.strerror}") from None
    for uid in range(BASE_UID, BASE_UID + UID_RANGE):
        fh = open(locks / f"{uid}.lock", "a")  # noqa: SIM115 - kept open: the lock lives with it
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            continue
        return uid, fh
    raise SandboxError(f"all {UID_RANGE} sandbox uids are in use; too many verifiers run at once: wait, or use "
                       "fewer jobs")


def kill_group(pid: int) -> None:
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
    """SIGKILL every live process owned by `uid` (root only; a uid this process claimed); returns
    how many distinct processes were signalled (one killed but not yet dead at the next sweep, as on
    a loaded machine, is signalled again, not counted again)."""
    killed: set[int] = set()
    for _ in range(20):  # a fork bomb may fork between the scan and the kill: sweep until quiet
        pids = live_pids(uid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
        killed.update(pids)
        if not pids:
            break
        time.sleep(0.02)
    return len(killed)
