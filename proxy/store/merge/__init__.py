"""`nfproxy merge`: stores recorded by different processes or machines become one."""

__all__ = [
    "run",
    "scan",
    "shard",
]
