"""What the proxy log adds to an analysis: per-condition call, miss and token counts, and the
served model / fingerprint identities (a model that changed mid-study is a different condition).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from noisefloor.outcome_rows import new_rows
from noisefloor.proxy.store import Store
from noisefloor.proxy.store_heads import Parts

UNLABELED = "(unlabeled)"


def summarize(heads: Iterable[Parts]) -> dict[str, Any]:
    """Per condition: counts and identities, from the store's heads as it keeps them
    (`Store.head_parts`). A million heads pass through here: they are counted per distinct
    (labels, route), which a session's heads share, and the groups are folded into conditions."""
    groups: dict[tuple[tuple[Any, ...], tuple[Any, ...]], list[int]] = {}
    for s, labels, route in heads:
        key = (labels, route)
        g = groups.get(key)
        if g is None:
            g = groups[key] = [0, 0, 0, 0, 0]
        g[0] += 1
        if s.error is not None or (s.status or 0) >= 500:
            g[1] += 1
        if s.truncated:
            g[2] += 1
        usage = s.usage
        if usage:
            if type(usage) is not list:
                usage = (usage.get("input"), usage.get("output"))
            g[3] += usage[0] or 0
            g[4] += usage[1] or 0
    return {"conditions": _conditions(groups)}


def _conditions(groups: Mapping[tuple[tuple[Any, ...], tuple[Any, ...]], list[int]]) -> dict[str, dict[str, Any]]:
    """The groups' counts per condition; labels are (session, task, replicate, condition), a route
    (mode, method, URL, model, fingerprint, replay result)."""
    conds: dict[str, dict[str, Any]] = {}
    for ((session, _, _, condition), (mode, _, _, model, fingerprint, result)), (n, errors, truncated, tokens_in,
                                                                                tokens_out) in groups.items():
        cond = condition or UNLABELED
        s = conds.get(cond)
        if s is None:
            s = conds[cond] = {"exchanges": 0, "sessions": set(), "misses": 0, "order_violations": 0, "errors": 0,
                               "truncated": 0, "input_tokens": 0, "output_tokens": 0, "models": set(),
                               "fingerprints": set(), "modes": set()}
        s["exchanges"] += n
        s["sessions"].add(session)
        s["modes"].add(mode)
        s["misses"] += n if result == "miss" else 0
        s["order_violations"] += n if result == "order_violation" else 0
        s["errors"] += errors
        s["truncated"] += truncated
        s["input_tokens"] += tokens_in
        s["output_tokens"] += tokens_out
        if model:
            s["models"].add(model)
        if fingerprint:
            s["fingerprints"].add(fingerprint)
    for s in conds.values():
        s["sessions"] = len(s["sessions"])
        for k in ("models", "fingerprints", "modes"):
            s[k] = sorted(s[k])
    return conds


def from_store(path: Path | Sequence[Path]) -> dict[str, Any]:
    """The summary of one store, or of several read as one (shards of a study, not yet merged)."""
    paths = [path] if isinstance(path, Path | str) else list(path)
    rules: list[Any] = []

    def heads() -> Iterator[Parts]:  # streamed, heads only: memory grows with sessions, not exchanges
        for p in paths:
            with Store.open(p, write=False) as store:
                rules.append(store.meta("rules_id"))
                for _, parts in store.head_parts():
                    yield parts

    doc = summarize(heads())
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
