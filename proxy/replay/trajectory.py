"""Which recorded run each replayed session followed, and where it left it.

A replay session follows the recorded session whose answers it was served; when several recorded
sessions hold its first request (repeated runs of one agent), replay picks the first in recorded
order, and says how many others would have matched. Where the session first left the recording
(a miss or a call-order violation), the step (its n-th request, from 0), the JSON path where its
request differs from the nearest recorded one, and the recorded steps that carry the answer it did
not get (cut off) are kept. The replayer feeds this as it answers; the exit summary and the replay
records (`nfproxy log`) say it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from noisefloor.display import counted, visible


@dataclass(frozen=True)
class Divergence:
    step: int  # the replay session's request (0-based, in arrival order) that left the recording
    result: str  # miss / order_violation
    session: str | None  # the recorded session it left (a miss: the nearest recorded request's)
    path: str | None  # the first JSON path where the request differs from the nearest recorded one
    cut_off: int  # later recorded requests that carry the answer it was not served

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "result": self.result, "session": self.session, "path": self.path,
                "cut_off": self.cut_off}

    @classmethod
    def from_json(cls, doc: Any) -> Divergence | None:
        if not isinstance(doc, Mapping) or not isinstance(doc.get("step"), int):
            return None
        cut = doc.get("cut_off")
        return cls(doc["step"], str(doc.get("result")), _text(doc.get("session")), _text(doc.get("path")),
                   cut if isinstance(cut, int) else 0)


def _text(x: Any) -> str | None:
    return x if isinstance(x, str) else None


@dataclass
class Trajectory:
    steps: int = 0
    followed: Counter[str] = field(default_factory=Counter)  # recorded session -> answers served from it
    matching: int = 0  # recorded sessions holding the session's first request
    diverged: Divergence | None = None


class Trajectories:
    """Per replay session, as the replayer answers (thread-safe: requests arrive concurrently)."""

    def __init__(self) -> None:
        self._by_session: dict[str, Trajectory] = {}
        self._lock = threading.Lock()

    def asked(self, session: str, recorded_sessions: Iterable[str]) -> int:
        """A request of `session` arrived; the recorded sessions that hold its key (read on the
        first request only). Returns its step."""
        with self._lock:
            t = self._by_session.get(session)
            if t is None:
                t = self._by_session[session] = Trajectory(matching=len(set(recorded_sessions)))
            t.steps += 1
            return t.steps - 1

    def served(self, session: str, recorded: str) -> None:
        with self._lock:
            self._by_session.setdefault(session, Trajectory()).followed[recorded] += 1

    def departed(self, session: str, d: Divergence) -> bool:
        """Note where `session` left the recording; True for its first departure (the one kept)."""
        with self._lock:
            t = self._by_session.setdefault(session, Trajectory())
            if t.diverged is not None:
                return False
            t.diverged = d
            return True

    def get(self, session: str) -> Trajectory | None:
        return self._by_session.get(session)

    def lines(self, pinned: bool) -> list[str]:
        return [line for name, t in self._by_session.items() for line in describe(name, t, pinned)]


SHOWN = 10  # replay sessions described in the summary


def describe(name: str, t: Trajectory, pinned: bool = False) -> list[str]:
    """What one replay session followed and where it diverged, as the summary and `nfproxy log` say it."""
    who = f"replay session '{visible(name)}'"
    if t.followed:
        main, hits = t.followed.most_common(1)[0]
        text = f"  {who} followed recorded session '{visible(main)}' ({counted(hits, 'answer')})"
        others = len(t.followed) - 1
        if others:
            text += f" and {counted(others, 'other recorded session')}"
    else:
        text = f"  {who} was served no recorded answer"
    others_matching = max(0, t.matching - 1)
    if others_matching and not pinned:
        text += (f"; {others_matching} other recorded sessions match its first request (--replay-session next "
                 "replays them in turn)")
    lines = [text]
    d = t.diverged
    if d is not None:
        src = f" from recorded session '{visible(d.session)}'" if d.session else ""
        where = f" at {visible(d.path)}" if d.path else ""
        lines.append(f"    diverged{src} at step {d.step} ({d.result}{where}); "
                     f"{counted(d.cut_off, 'later recorded step')} cut off")
    return lines


def from_records(records: Iterable[tuple[str, Mapping[str, Any], str | None]]) -> dict[str, Trajectory]:
    """Trajectories rebuilt from replay records: (replay session, its `replay` field, the recorded
    session that answered or None), in the order they were written."""
    out: dict[str, Trajectory] = {}
    for session, replay, recorded in records:
        t = out.setdefault(session, Trajectory())
        t.steps += 1
        if recorded is not None and replay.get("result") == "hit":
            t.followed[recorded] += 1
        if t.diverged is None:
            t.diverged = Divergence.from_json(replay.get("diverged"))
        matching = replay.get("matching")
        if isinstance(matching, int) and not t.matching:
            t.matching = matching
    return out
