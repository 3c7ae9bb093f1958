"""What the proxy log adds to an analysis: per-condition call, miss and token counts, and the
served model / fingerprint identities (a model that changed mid-study is a different condition).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from noisefloor.proxy.store import Exchange, Store

UNLABELED = "(unlabeled)"


def summarize(exchanges: Iterable[Exchange]) -> dict[str, Any]:
    conds: dict[str, dict[str, Any]] = {}
    for ex in exchanges:
        s = conds.setdefault(
            ex.condition or UNLABELED,
            {"exchanges": 0, "sessions": set(), "misses": 0, "order_violations": 0, "errors": 0, "truncated": 0,
             "input_tokens": 0, "output_tokens": 0, "models": set(), "fingerprints": set(), "modes": set()},
        )
        s["exchanges"] += 1
        s["sessions"].add(ex.session)
        s["modes"].add(ex.mode)
        result = ex.replay_result
        s["misses"] += result == "miss"
        s["order_violations"] += result == "order_violation"
        s["errors"] += ex.error is not None or (ex.response is not None and ex.response["status"] >= 500)
        s["truncated"] += bool(ex.truncated)
        s["input_tokens"] += (ex.usage or {}).get("input") or 0
        s["output_tokens"] += (ex.usage or {}).get("output") or 0
        if ex.model:
            s["models"].add(ex.model)
        if ex.fingerprint:
            s["fingerprints"].add(ex.fingerprint)
    for s in conds.values():
        s["sessions"] = len(s["sessions"])
        for k in ("models", "fingerprints", "modes"):
            s[k] = sorted(s[k])
    return {"conditions": conds}


def from_store(path: Path) -> dict[str, Any]:
    with Store.open(path, write=False) as store:
        doc = summarize(store.exchanges())
        doc["store"] = str(path)
        doc["rules_id"] = store.meta("rules_id")
    return doc
