"""Output files: checked before any work, written atomically.

A command that runs for minutes and then cannot write its result has lost the work, so every
output path is checked first (its folder exists and takes a new file); each file is then written
to a temporary name in the same folder and renamed over the target, so a reader (or a rerun)
never sees half a file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from noisefloor.errors import InputError


def check_writable(path: str | Path | None, option: str) -> None:
    """Raise a one-line `InputError` unless `path` can be written (None and '-' pass)."""
    if path is None or str(path) == "-":
        return
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise InputError(f"{option} {p}: is a folder; give a file name inside it")
    if not folder.is_dir():
        raise InputError(f"{option} {p}: folder {folder} does not exist; create it (mkdir -p {folder}) or "
                         "choose another path")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{p.name}.", suffix=".check"):
            pass
    except OSError as exc:
        raise InputError(f"{option} {p}: cannot write in folder {folder} ({exc.strerror}); choose another "
                         "path") from None


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` to write to; renamed over `path` when the block succeeds. A
    path that is not a regular file (`/dev/null`, a pipe) is written in place: renaming over it
    would replace the device for every program on the machine."""
    p = Path(path)
    if p.exists() and not p.is_file() and not p.is_dir():
        yield p
        return
    fd, tmp = tempfile.mkstemp(dir=p.parent if str(p.parent) else ".", prefix=f".{p.name}.", suffix=".tmp")
    os.close(fd)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)  # the mode a plain open() would give, not mkstemp's 0600
    try:
        yield Path(tmp)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
