"""Why a replayed request missed: the recorded request most like it, with a diff of the two
canonical forms (only a miss pays for this)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from noisefloor.proxy.keys import Rules, short_diff, similarity
from noisefloor.proxy.store import RecordedEntry, Store
from noisefloor.proxy.traffic import Prepared, RequestData

CANDIDATES = 64  # recorded requests compared at most


def recorded_canonical(store: Store, rules: Rules, exchange_id: int) -> str | None:
    """A recorded request's canonical form, rebuilt from what the store holds."""
    source = store.exchange(exchange_id)
    if source is None:
        return None
    request = RequestData.from_record(source.request, store.body(source.request.get("body")))
    return request.canonical(rules).pretty()


def nearest(store: Store, rules: Rules, entries: Sequence[RecordedEntry], p: Prepared) -> dict[str, Any] | None:
    """The recorded request most like `p` (same route first), with the diff of their canonical forms."""
    route = f"{p.canonical.method} {p.canonical.host} {p.canonical.path}"
    latest: dict[str, RecordedEntry] = {}
    for e in entries:
        latest[e.key] = e
    pool = ([e for e in latest.values() if e.route == route] or list(latest.values()))[-CANDIDATES:]
    asked = p.canonical.pretty()
    best, best_score, best_text = None, -1.0, ""
    for e in pool:
        pretty = recorded_canonical(store, rules, e.id)
        if pretty is None:
            continue
        score = similarity(pretty, asked)
        if score > best_score:
            best, best_score, best_text = e, score, pretty
    if best is None:
        return None
    return {"key": best.key, "exchange_id": best.id, "session": best.session, "similarity": round(best_score, 4),
            "diff": short_diff(best_text, asked)}
