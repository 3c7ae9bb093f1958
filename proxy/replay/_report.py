"""What replay says about its misses: one stderr line per miss, and the exit summary's lines
(what each miss replaced and affected, the order notes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from noisefloor.proxy.request.traffic import Prepared

SHOWN = 10  # misses listed in the summary


@dataclass(frozen=True)
class MissReport:
    """One miss, for the summary: what it replaced and which recorded requests carry that answer."""

    session: str
    task: str | None
    key: str
    route: str
    nearest: dict[str, Any] | None
    affected: tuple[int, ...]  # recorded exchanges that carry the nearest request's answer


def summary_lines(misses: list[MissReport], order_notes: list[str], session_size: Callable[[str], int]) -> list[str]:
    """What the exit summary adds: each miss and what it affected, the order notes."""
    lines = []
    for r in misses[:SHOWN]:
        near = r.nearest
        head = f"  miss {r.key[:12]} (session {r.session}" + (f", task {r.task})" if r.task else ")")
        if near is None:
            lines.append(head + ": no recorded request like it")
            continue
        total = session_size(near["session"]) if near.get("session") else 0
        if r.affected:
            ids = ", ".join(str(i) for i in r.affected[:8]) + (" ..." if len(r.affected) > 8 else "")
            lines.append(f"{head} replaced recorded exchange {near['exchange_id']}: {len(r.affected)} later "
                         f"recorded requests carry its answer and are affected (exchanges {ids}); the other "
                         f"{max(total - 1 - len(r.affected), 0)} of session {near['session']!r} are not")
        else:
            lines.append(f"{head} replaced recorded exchange {near['exchange_id']}: no recorded request carries "
                         "its answer, the others are unaffected")
    if len(misses) > SHOWN:
        lines.append(f"  ... {len(misses) - SHOWN} more misses (see the replay log)")
    if order_notes:
        lines.append(f"  {len(order_notes)} order notes (recorded order departed from, no answer changed), "
                     "e.g.: " + order_notes[0])
    return lines


def miss_line(p: Prepared, route: str, recorded: int, near: dict[str, Any] | None, affected: tuple[int, ...]) -> str:
    """One compact stderr line per miss."""
    who = f"session {p.labels.session}" + (f" task {p.labels.task}" if p.labels.task else "")
    head = f"nfproxy: replay miss {who} key {p.key[:12]} {route}"
    if recorded:
        return f"{head}: occurrence {p.occurrence}, the recording holds {recorded}"
    if near is None:
        return f"{head}: nothing like it was recorded"
    tail = f"; {len(affected)} recorded requests carry its answer" if affected else ""
    return (f"{head}: nearest recorded exchange {near['exchange_id']} (session {near['session']}, similarity "
            f"{near['similarity']}) differs first at {near['differs_at']}{tail}")
