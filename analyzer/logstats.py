"""What the proxy log adds to an analysis: per-condition call, miss and token counts, and the
served model / fingerprint identities (a model that changed mid-study is a different condition).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
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
    (mode, method, URL, model, fingerprint, replay result). A group per session: the sums are kept
    in lists and the condition's document written once, at the end."""
    acc: dict[str, tuple[list[int], set[Any], set[Any], set[Any], set[Any]]] = {}
    for ((session, _, _, condition), (mode, _, _, model, fingerprint, result)), (n, errors, truncated, tokens_in,
                                                                                tokens_out) in groups.items():
        cond = condition or UNLABELED
        a = acc.get(cond)
        if a is None:
            a = acc[cond] = ([0] * 7, set(), set(), set(), set())
        counts, sessions, modes, models, fingerprints = a
        counts[0] += n
        if result == "miss":
            counts[1] += n
        elif result == "order_violation":
            counts[2] += n
        counts[3] += errors
        counts[4] += truncated
        counts[5] += tokens_in
        counts[6] += tokens_out
        sessions.add(session)
        modes.add(mode)
        if model:
            models.add(model)
        if fingerprint:
            fingerprints.add(fingerprint)
    return {cond: {"exchanges": c[0], "sessions": len(sessions), "misses": c[1], "order_violations": c[2],
                   "errors": c[3], "truncated": c[4], "input_tokens": c[5], "output_tokens": c[6],
                   "models": sorted(models), "fingerprints": sorted(fingerprints), "modes": sorted(modes)}
            for cond, (c, sessions, modes, models, fingerprints) in acc.items()}


def from_store(path: Path | Sequence[Path]) -> dict[str, Any]:
    """The summary of one store, or of several read as one (shards of a study, not yet merged)."""
    paths = [path] if isinstance(path, Path | str) else list(path)
    rules: list[Any] = []

    def heads() -> Iterator[Parts]:  # streamed, heads only: memory grows with sessions, not exchanges
        for p in paths:
            with Store.open(p, write=False) as store:
                rules.append(store.meta("rules_id"))
                yield from map(itemgetter(1), store.head_parts())

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
