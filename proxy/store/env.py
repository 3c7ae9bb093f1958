"""The store's LMDB environment: opening it (with every check that comes before LMDB reads a
byte), its format (the one layout the runtime reads and writes: a store of another is refused by
one line naming what to run; `migrate` converts the earlier ones), reserving its map's disk
blocks, and growing the map in steps when it fills."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import lmdb
import msgspec
import zstandard

from noisefloor.errors import StateError

_INITIAL_MAP = 32 << 20  # with writemap the whole map is reserved on disk
_GROWTH = 8  # a full map grows by 1/8 (at least _MIN_STEP): the file stays close to what is used
_MIN_STEP = 64 << 20
# a reader's map reaches this far past the file: address space only (no page past the file's end
# is read), so that a store a recorder grows while it is open does not outgrow the map (LMDB's
# MDB_MAP_RESIZED, which is no damage)
_READ_AHEAD = 64 << 30


class StoreError(StateError):
    """A store that cannot be used as asked; the message says what to do."""


FORMAT = "noisefloor-log/8"
INDEX_LAYOUT = 4  # meta "replay_index" of a store in FORMAT (`replay_index.VERSION`)
_PREFIX = "noisefloor-log/"


def refusal(path: Path, fmt: object) -> str | None:
    """Why a store marked `fmt` cannot be opened by this runtime (None: it can): an older format
    names `nfproxy migrate`, a newer one an upgrade, anything else a store made by nfproxy."""
    if fmt == FORMAT:
        return None
    number = fmt.removeprefix(_PREFIX) if isinstance(fmt, str) and fmt.startswith(_PREFIX) else ""
    # a number as nfproxy writes it (no sign, no leading zero, from 1): any other spelling is no
    # format of nfproxy's, older or newer, so `migrate` is not sent one it cannot convert
    if not (number.isascii() and number.isdigit() and len(number) < 5 and number == str(int(number)) != "0"):
        # the mark itself is not echoed: a planted one may be anything (a secret, a megabyte)
        return f"{path} is not an nfproxy store (its format mark is none nfproxy writes); point --store at one made by nfproxy"
    if int(number) > int(FORMAT.removeprefix(_PREFIX)):
        return f"{path} is a store of format {fmt}, newer than this nfproxy reads ({FORMAT}); upgrade noisefloor"
    return f"{path} is a store of format {fmt}, older than {FORMAT}; run `nfproxy migrate {path}` first"


def _read_only(path: Path) -> bool:
    """Read-only by permission bits too: root may write anyway, but the owner said not to."""
    if not path.exists():
        return False
    if os.statvfs(path).f_flag & os.ST_RDONLY:
        return True
    return not os.access(path, os.W_OK) or not path.stat().st_mode & stat.S_IWUSR


def is_read_only(path: str | os.PathLike[str]) -> bool:
    """A store that can be read but not written: checked out read-only, or on a read-only mount."""
    p = Path(path)
    return _read_only(p) or _read_only(p / "data.mdb")


# What reading a damaged store raises, from LMDB, zstd, JSON or the record types.
DAMAGE = (lmdb.Error, zstandard.ZstdError, ValueError, TypeError, KeyError, UnicodeDecodeError, struct.error,
           IndexError, AttributeError, msgspec.MsgspecError)
_MIN_FILE = 2 * 4096  # LMDB's two meta pages

def check_path(p: Path, write: bool, create: bool) -> None:
    """Refuse, by one line, a path that cannot be this store as asked, before LMDB touches it."""
    if p.exists() and not p.is_dir():
        raise StoreError(f"{p} is a file, not an nfproxy store; give a directory path such as recordings/log.lmdb")
    data = p / "data.mdb"
    if not data.exists():
        if not create:
            raise StoreError(f"no nfproxy store at {p}; record one first with `nfproxy --mode record --store {p}`")
        if p.exists() and any(p.iterdir()):
            raise StoreError(f"{p} is a non-empty directory without an LMDB store; choose a new path for --store")
    if write and (_read_only(p) or _read_only(data)):
        raise StoreError(f"store {p} is read-only; make it writable or record into a new --store path")
    if data.exists() and data.stat().st_size < _MIN_FILE:
        raise StoreError(f"{p} is not a readable LMDB store: {data} has {data.stat().st_size} bytes (truncated or "
                         "not a store); restore it from a copy, or point --store at an nfproxy store")


def open_env(p: Path, write: bool) -> tuple[lmdb.Environment, int]:
    """The LMDB environment, its map's disk reserved when writing, and the bytes its data file
    must keep (a file cut shorter is refused: reading past its end would be a SIGBUS)."""
    data = p / "data.mdb"
    size = data.stat().st_size if data.exists() else 0
    try:
        env = _opened(p, write, max(_INITIAL_MAP, size) if write else size + _READ_AHEAD)
    except StoreError:
        if write:
            raise
        env = _opened(p, write, max(_INITIAL_MAP, size))  # no address space to spare (a ulimit), or no store
    if write:
        try:
            _reserve(data, env.info()["map_size"])
        except StoreError:
            env.close()
            raise
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    if data.stat().st_size < needed:
        env.close()
        raise StoreError(f"store {p} is damaged: {data} is truncated ({data.stat().st_size} of {needed} bytes); "
                         "restore it from a copy or record it again")
    return env, needed


def _opened(p: Path, write: bool, map_size: int) -> lmdb.Environment:
    try:
        if write:
            p.mkdir(parents=True, exist_ok=True)
        return lmdb.open(
            str(p),
            map_size=map_size,
            max_dbs=16,
            subdir=True,
            readonly=not write,
            lock=write or not is_read_only(p),  # a read-only store gets no reader-table writes
            # Process-crash safe without fsync per exchange: LMDB writes the meta page last, so a
            # SIGKILL leaves the last committed transaction intact. `sync()` on close.
            sync=False,
            metasync=False,
            # writes go straight into the shared map: no pwrite per dirty page on the request path
            writemap=write,
            create=write,
        )
    except lmdb.Error as exc:
        raise StoreError(f"{p} is not a readable LMDB store ({exc}); point --store at an nfproxy store") from exc


def grow(env: lmdb.Environment, path: Path) -> None:
    """A full map grows by 1/8 (at least 64 MB), its disk reserved first: the file stays close to
    what is used, and the map never covers disk that is not there."""
    size = env.info()["map_size"]
    size += max(_MIN_STEP, size // _GROWTH)
    _reserve(path / "data.mdb", size)
    env.set_mapsize(size)


def _reserve(data: Path, size: int) -> None:
    """Allocate the store file's disk blocks for the whole map.

    With writemap, LMDB writes through a shared mapping of a sparse file: a page the disk cannot
    back kills the process with SIGBUS (measured on a full tmpfs) instead of failing one write.
    With the blocks allocated up front, a full disk is a clean error when the store is opened or
    its map grows, and everything committed before stays readable.
    """
    fd = os.open(data, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        raise StoreError(
            f"cannot reserve {size >> 20} MB of disk for store {data.parent} ({exc.strerror}); "
            "free some space or record into a --store on another disk"
        ) from None
    finally:
        os.close(fd)
