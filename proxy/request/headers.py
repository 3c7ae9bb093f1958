"""Header pairs as the log keeps them: a list of (name, value), names in any case."""

from __future__ import annotations

from collections.abc import Iterable

Pairs = Iterable[tuple[str, str]]
# fields about one connection, never stored or replayed as part of an answer
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te"})


def header(headers: Pairs, name: str, default: str | None = None) -> str | None:
    """The first value of `name`, case-insensitively (a plain loop: several times an exchange,
    about half a generator's cost)."""
    name = name.lower()
    for k, v in headers:
        if k.lower() == name:
            return v
    return default


def without(headers: Pairs, *names: str) -> list[tuple[str, str]]:
    """The pairs whose name is none of `names` (case-insensitively)."""
    drop = {n.lower() for n in names}
    return [(k, v) for k, v in headers if k.lower() not in drop]
