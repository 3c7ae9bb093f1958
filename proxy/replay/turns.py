"""`--replay-session next` / `first`: repeated recorded runs replayed in turn.

Several runs of one agent recorded into a store (temperature > 0: each a different trajectory) all
begin with the same request, so a replay that may follow any of them follows the first. With
`next`, each new run (each proxy start, or each wrapped command) replays the next recorded session
no earlier run took, in recorded order; `first` starts over. What was taken is remembered in a
small file in nfproxy's state folder beside the store (the recording itself is never written:
it may be a read-only fixture), under a lock, so two proxies started at once take two runs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noisefloor import outputs
from noisefloor.display import visible
from noisefloor.errors import InputError

NEXT, FIRST = "next", "first"
FOLDER = "replay-turns"


@dataclass(frozen=True)
class Turn:
    session: str  # the recorded session this run replays
    number: int  # its place among the recorded sessions, from 1
    of: int  # recorded sessions in the store

    def line(self) -> str:
        return (f"replaying recorded session '{visible(self.session)}' ({self.number} of {self.of} recorded; "
                f"--replay-session next takes the next one, first starts over)")


def wanted(names: tuple[str, ...]) -> str | None:
    """NEXT or FIRST when `--replay-session` asked for a turn, else None (session names)."""
    if len(names) == 1 and names[0] in (NEXT, FIRST):
        return names[0]
    if NEXT in names or FIRST in names:
        raise InputError("--replay-session next / first stands alone: give it once, without session names")
    return None


def take(store: Any, store_path: Path, state_dir: Path, how: str) -> Turn:
    """The recorded session this run replays, marked as taken."""
    recorded = _recorded_sessions(store)
    if not recorded:
        raise InputError(f"store {store_path} holds no recorded session; record with --mode record first")
    state_dir.mkdir(parents=True, exist_ok=True)
    state = state_dir / f"{hashlib.sha256(str(store_path.resolve()).encode()).hexdigest()[:16]}.json"
    with open(state.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        taken = [] if how == FIRST else _read(state)
        left = [s for s in recorded if s not in set(taken)]
        if not left:
            raise InputError(f"every recorded session was replayed ({len(recorded)} of {len(recorded)}) with "
                             "--replay-session next; pass --replay-session first to start over")
        chosen = left[0]
        outputs.write_text(state, json.dumps({"store": str(store_path.resolve()), "taken": [*taken, chosen]}))
    return Turn(chosen, recorded.index(chosen) + 1, len(recorded))


def _recorded_sessions(store: Any) -> list[str]:
    """Recorded sessions in the order they began."""
    first: dict[str, int] = {}
    for e in store.index.entries():
        if e.session not in first or e.id < first[e.session]:
            first[e.session] = e.id
    return sorted(first, key=first.__getitem__)


def _read(state: Path) -> list[str]:
    """The sessions earlier runs took; a missing or unreadable file is a fresh start."""
    try:
        doc = json.loads(state.read_text())
    except (OSError, ValueError):
        return []
    taken = doc.get("taken") if isinstance(doc, dict) else None
    return [s for s in taken if isinstance(s, str)] if isinstance(taken, list) else []
