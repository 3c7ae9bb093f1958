"""A lock shared by every process on the machine that names the same file or folder
(`fcntl.flock`), held for a block: how processes that write into one folder (pytest-xdist workers
saving one recording) take turns instead of overwriting each other's work.

A folder is locked as it is (no file is created in it); a lock file is created when missing and
never removed: a process waiting on a file that another one unlinks would lock an inode nobody
else can see, and two processes would hold "the" lock at once. Waiting is bounded; past `timeout`
the block is refused with one line naming the path and how to find the process that holds it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from noisefloor.errors import StateError

POLL = 0.05  # seconds between tries while another process holds the lock


class LockTimeout(StateError):
    """Another process held the lock for longer than the caller would wait."""


@contextlib.contextmanager
def held(path: Path, *, shared: bool = False, timeout: float = 600.0) -> Iterator[None]:
    """Hold the lock of `path` (a folder, or a file created if missing) for the block: exclusive,
    or `shared` with other shared holders."""
    if path.is_dir():
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    else:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() >= deadline:
                raise LockTimeout(f"{path} stayed locked by another process for {timeout:.0f} s; find the process "
                                  f"that holds it (fuser {path}) and let it finish or stop it")
            time.sleep(POLL)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)

