"""What the proxy log adds to an analysis: per-condition call, miss and token counts, and the
served model / fingerprint identities (a model that changed mid-study is a different condition).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from noisefloor.outcome_rows import new_rows
from noisefloor.proxy.exchange_record import Exchange, Head
from noisefloor.proxy.store import Store

UNLABELED = "(unlabeled)"


def summarize(exchanges: Iterable[Exchange | Head]) -> dict[str, Any]:
    """Per condition: counts and identities, from whole exchanges or their heads (`Store.heads`).
    A million heads pass through here: one dict lookup per condition, counts kept as locals' items."""
    conds: dict[str, dict[str, Any]] = {}
    for ex in exchanges:
        cond = ex.condition or UNLABELED
        s = conds.get(cond)
        if s is None:
            s = conds[cond] = {"exchanges": 0, "sessions": set(), "misses": 0, "order_violations": 0, "errors": 0,
                               "truncated": 0, "input_tokens": 0, "output_tokens": 0, "models": set(),
                               "fingerprints": set(), "modes": set()}
        s["exchanges"] += 1
        s["sessions"].add(ex.session)
        s["modes"].add(ex.mode)
        result = ex.replay_result
        if result is not None:
            s["misses"] += result == "miss"
            s["order_violations"] += result == "order_violation"
        if ex.error is not None or (ex.status or 0) >= 500:
            s["errors"] += 1
        if ex.truncated:
            s["truncated"] += 1
        if ex.usage:
            s["input_tokens"] += ex.usage.get("input") or 0
            s["output_tokens"] += ex.usage.get("output") or 0
        if ex.model:
            s["models"].add(ex.model)
        if ex.fingerprint:
            s["fingerprints"].add(ex.fingerprint)
    for s in conds.values():
        s["sessions"] = len(s["sessions"])
        for k in ("models", "fingerprints", "modes"):
            s[k] = sorted(s[k])
    return {"conditions": conds}


def from_store(path: Path | Sequence[Path]) -> dict[str, Any]:
    """The summary of one store, or of several read as one (shards of a study, not yet merged)."""
    paths = [path] if isinstance(path, Path | str) else list(path)
    rules: list[Any] = []

    def exchanges() -> Iterator[Head]:  # streamed, heads only: memory grows with sessions, not exchanges
        for p in paths:
            with Store.open(p, write=False) as store:
                rules.append(store.meta("rules_id"))
                yield from store.heads()

    doc = summarize(exchanges())
    doc["store"] = ", ".join(map(str, paths))
    doc["rules_id"] = rules[0] if len(set(rules)) == 1 else sorted({str(r) for r in rules})
    return doc


def outcome_rows(paths: Sequence[Path]) -> list[Mapping[str, Any]]:
    """The graded rows kept in several stores; one (condition, task, replicate) graded differently
    in two of them is refused (a clash of shards, not something to average)."""
    seen: dict[tuple[Any, Any, Any], tuple[Mapping[str, Any], str]] = {}
    rows: list[Mapping[str, Any]] = []
    for p in paths:
        with Store.open(p, write=False) as store:
            rows += new_rows(seen, store.outcome_rows(), str(p))
    return rows


STUDY_META = "nfladder_study"  # written by nfladder: its design, provenance manifest, judge parse counts, truth


def study(paths: Sequence[Path]) -> dict[str, Any] | None:
    """What nfladder kept about its study in the (first) store, None when it kept nothing."""
    for p in paths:
        with Store.open(p, write=False) as store:
            doc = store.meta(STUDY_META)
        if isinstance(doc, dict):
            return doc
    return None
