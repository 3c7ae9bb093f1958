"""Why a replayed request missed: the recorded request most like it, the first JSON path where
the two differ, and a short diff of their canonical forms (only a miss pays for this)."""

from __future__ import annotations

import json
from typing import Any

from noisefloor.proxy.keys import CanonicalRequest, Rules, short_diff, similarity
from noisefloor.proxy.store import Store
from noisefloor.proxy.traffic import Prepared, RequestData

_MISSING = object()


def recorded_request(store: Store, rules: Rules, exchange_id: int) -> CanonicalRequest | None:
    """A recorded request's canonical form, rebuilt from what the store holds."""
    source = store.exchange(exchange_id)
    if source is None:
        return None
    return RequestData.from_record(source.request, store.body(source.request.get("body"))).canonical(rules)


def recorded_canonical(store: Store, rules: Rules, exchange_id: int) -> str | None:
    canon = recorded_request(store, rules, exchange_id)
    return None if canon is None else canon.pretty()


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The first JSON pointer (keys in sorted order) where `a` and `b` differ; None if equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            found = first_difference(a.get(k, _MISSING), b.get(k, _MISSING), f"{path}/{_escape(k)}")
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            found = first_difference(a[i] if i < len(a) else _MISSING, b[i] if i < len(b) else _MISSING, f"{path}/{i}")
            if found is not None:
                return found
        return None
    if a is b or (type(a) is type(b) and a == b):
        return None
    return path or "/"


def flat(doc: Any, path: str = "", out: list[str] | None = None) -> list[str]:
    """A canonical form as `pointer = value` lines: what the miss diff shows (and cheap to make:
    each leaf is encoded by the C JSON encoder)."""
    out = [] if out is None else out
    if isinstance(doc, dict) and doc:
        for k in sorted(doc):
            flat(doc[k], f"{path}/{_escape(k)}", out)
    elif isinstance(doc, list) and doc:
        for i, v in enumerate(doc):
            flat(v, f"{path}/{i}", out)
    else:
        out.append(f"{path or '/'} = {json.dumps(doc, ensure_ascii=False)}")
    return out


def _escape(k: str) -> str:
    return str(k).replace("~", "~0").replace("/", "~1")


def nearest(store: Store, rules: Rules, index: Any, p: Prepared) -> dict[str, Any] | None:
    """The recorded request most like `p`, found by the replay index, with where they differ."""
    route = f"{p.canonical.method} {p.canonical.host} {p.canonical.path}"
    found = index.near(p.canonical, route)
    if not found:
        return None
    scored = [(i, s) for i, s in found if s is not None]
    if scored:  # the index ranked them by content already: rebuild only the best
        pool = scored[:1]
    else:  # no ranking (a store without the index, or nothing alike): compare each
        pool = found
    best, best_score, best_canon = None, -1.0, None
    for exchange_id, score in pool:
        canon = recorded_request(store, rules, exchange_id)
        if canon is None:
            continue
        if score is None:
            score = similarity(canon.pretty(), p.canonical.pretty())
        if score > best_score:
            best, best_score, best_canon = exchange_id, score, canon
    if best is None or best_canon is None:
        return None
    entry = store.recorded_entry(best)
    where = first_difference(best_canon.as_dict(), p.canonical.as_dict())
    return {"key": best_canon.key, "exchange_id": best, "session": entry.session if entry else None,
            "similarity": round(best_score, 4), "differs_at": where,
            "diff": short_diff("\n".join(flat(best_canon.as_dict())), "\n".join(flat(p.canonical.as_dict())))}
