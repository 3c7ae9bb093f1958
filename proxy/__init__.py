"""nfproxy: the recording and replaying proxy, in packages by job (see each package's docstring)."""

__all__ = [
    "cli",
    "launch",
    "mitm",
    "providers",
    "record",
    "replay",
    "request",
    "store",
    "transfer",
]
