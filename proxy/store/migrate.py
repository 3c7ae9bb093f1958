"""`nfproxy migrate`: a store of an earlier format rewritten whole in today's (`format.FORMAT`).

The one place that knows the earlier formats: what each one's tables hold, so that a store of
it is read as written and rewritten by `compact.rewrite` in today's layout (records joined with
their heads, bodies behind their CRC, the replay index in today's layout, outcome rows keyed).
Killed at any point, the store is as it was (the rewrite happens beside it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from noisefloor.proxy.store import compact
from noisefloor.proxy.store.env import Holds

_NONE = Holds(heads=False, joins=False, checks_bodies=False, keys_outcomes=False)
OLDER: dict[str, Holds] = {
    "noisefloor-log/1": _NONE,  # untagged zstd values, no dictionaries
    "noisefloor-log/2": _NONE,  # tagged values, the replay index's first layout
    "noisefloor-log/3": _NONE,  # the replay index's lookups (layout 2)
    "noisefloor-log/4": Holds(heads=True, joins=False, checks_bodies=False, keys_outcomes=False),
    "noisefloor-log/5": Holds(heads=True, joins=True, checks_bodies=False, keys_outcomes=False),  # index layout 3
    "noisefloor-log/6": Holds(heads=True, joins=True, checks_bodies=True, keys_outcomes=False),
}


def migrate(path: Path, progress: Callable[[str], None] = lambda s: None) -> compact.Rewritten:
    """The store at `path` in today's format: rewritten from an earlier one, or (already in it)
    compacted."""
    return compact.rewrite(Path(path), progress, older=OLDER)
