"""A private filesystem view for one candidate (root only; standard library only).

Inside a new mount namespace a fresh tmpfs becomes the candidate's root: the interpreter's own
folders (prefixes, stdlib, site-packages) and the system's `/usr` are bound read-only at their
usual paths, so every stdlib module imports wherever Python is installed (pyenv under /root
included), while home folders, datasets, caches, proxy stores and the repository do not exist
in that view. `/tmp`, `/var/tmp`, `/dev/shm` and the working folder live in the tmpfs, so what a
candidate writes is bounded by its size and vanishes with its last process. Every step raises on
failure: the caller runs no candidate in a half-built jail.
"""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT = 1, 2, 4, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18

_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
WORKDIR = "/candidate"  # a name no interpreter prefix is likely to sit under

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def become_subreaper() -> None:
    """Orphans of candidates are re-parented to the caller, which reaps them: a zombie still counts
    against its uid's process limit, and a container's init may be slow to reap."""
    _check(_libc.prctl(36, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")  # 36: PR_SET_CHILD_SUBREAPER


def _enc(s: str | None) -> bytes | None:
    return s.encode() if s is not None else None


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(_enc(source), _enc(target), _enc(fstype), flags, _enc(data)), f"mount {source} on {target}")


def _under(path: str, dirs: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def plan() -> dict[str, list]:
    """What the view holds, computed once in the fork server before any candidate runs."""
    links, dirs = [], []
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            links.append((d, os.readlink(d)))
        elif os.path.isdir(d):
            dirs.append(d)
    for prefix in sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}, key=len):
        real = os.path.realpath(prefix)
        if os.path.isdir(real) and not _under(real, dirs):
            dirs.append(real)
    sources = [os.path.realpath(f) if f == "/etc/localtime" else f for f in _SYSTEM_FILES]
    files = [(f, dst) for f, dst in zip(sources, _SYSTEM_FILES) if os.path.isfile(f)]
    return {"links": links, "dirs": dirs, "files": files, "devices": [d for d in _DEVICES if os.path.exists(d)]}


def _bind(src: str, dst: str, readonly: bool) -> None:
    _mount(src, dst, None, _MS_BIND | _MS_REC)
    if readonly:
        _mount(None, dst, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def _file_at(root: str, path: str) -> str:
    dst = root + path
    os.makedirs(os.path.dirname(dst), mode=0o755, exist_ok=True)
    with open(dst, "wb"):
        pass
    return dst


def enter(root: str, view: dict[str, list], uid: int, size_mb: int) -> None:
    """Build the view on the empty folder `root` and chroot into it, working folder `/candidate`."""
    os.umask(0o022)
    unshare(CLONE_NEWNS)
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing below propagates back to the host
    _mount("nfsandbox", root, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={size_mb}m,mode=755")
    for path, target in view["links"]:
        os.symlink(target, root + path)
    for d in view["dirs"]:
        os.makedirs(root + d, mode=0o755, exist_ok=True)
        _bind(d, root + d, readonly=True)
    for src, dst in view["files"]:
        _bind(src, _file_at(root, dst), readonly=True)
    for dev in view["devices"]:
        _bind(dev, _file_at(root, dev), readonly=False)
    for d in _SCRATCH:
        os.makedirs(root + d, exist_ok=True)
        os.chmod(root + d, 0o1777)
    os.makedirs(root + WORKDIR, exist_ok=True)
    os.chown(root + WORKDIR, uid, uid)
    os.chroot(root)
    os.chdir(WORKDIR)
