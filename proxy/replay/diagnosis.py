"""Why a replayed request missed: the recorded request most like it, the first JSON path where
the two differ, and a short diff of their canonical forms (only a miss pays for this)."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from itertools import islice
from typing import Any

from noisefloor.proxy.request.keys import CanonicalRequest, Rules
from noisefloor.proxy.request.traffic import Prepared, RequestData
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store.log import Store

_MISSING = object()
SKETCH_TIE = 3 / 32  # three of the sketch's 32 values: estimates closer than that are within its noise
_PATHS_COUNTED = 1000  # differing paths counted per candidate (a tie-break: enough to order them)
_LEAVES_COMPARED = 16  # differing string leaves compared as text per candidate (the last tie-break)
_MIDDLE_COMPARED = 64  # characters of each differing middle given to SequenceMatcher (its cost is quadratic)


def recorded_request(store: Store, rules: Rules, exchange_id: int) -> CanonicalRequest | None:
    """A recorded request's canonical form, rebuilt from what the store holds."""
    source = store.exchange(exchange_id)
    if source is None:
        return None
    return RequestData.from_record(source.request, store.bodies.of_part(source.request)).canonical(rules)


def recorded_canonical(store: Store, rules: Rules, exchange_id: int) -> str | None:
    canon = recorded_request(store, rules, exchange_id)
    return None if canon is None else canon.pretty()


def differing_leaves(a: Any, b: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(JSON pointer, value in `a`, value in `b`) of every leaf where they differ, keys in sorted order."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            yield from differing_leaves(a.get(k, _MISSING), b.get(k, _MISSING), f"{path}/{_escape(k)}")
    elif isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            yield from differing_leaves(a[i] if i < len(a) else _MISSING, b[i] if i < len(b) else _MISSING,
                                        f"{path}/{i}")
    elif not (a is b or (type(a) is type(b) and a == b)):
        yield path or "/", a, b


def differing_paths(a: Any, b: Any) -> Iterator[str]:
    """The JSON pointers (keys in sorted order) of every leaf where `a` and `b` differ."""
    return (path for path, _, _ in differing_leaves(a, b))


def _closeness(a: Any, b: Any) -> float:
    """How alike two differing requests' differing strings are (0..n): the sketch hashes a short
    string whole, so "write a haiku" and "write a limerick" are as far apart to it as any two
    prompts; a person would call the first the nearer. Bounded: a few leaves, each compared in
    time linear in its length plus a capped middle."""
    total = 0.0
    for _, x, y in islice(differing_leaves(a, b), _LEAVES_COMPARED):
        if isinstance(x, str) and isinstance(y, str):
            total += _text_closeness(x, y)
    return round(total, 4)


def _text_closeness(x: str, y: str) -> float:
    """The share of characters two strings have in common (difflib's ratio, 2M / (|x| + |y|)), with
    the common prefix and suffix counted directly and only the differing middles, cut to
    `_MIDDLE_COMPARED` characters each, given to SequenceMatcher (quadratic in what it is given,
    and a miss compares several)."""
    if not x and not y:
        return 1.0
    n = min(len(x), len(y))
    pre = 0
    while pre < n and x[pre] == y[pre]:
        pre += 1
    suf = 0
    while suf < n - pre and x[-1 - suf] == y[-1 - suf]:
        suf += 1
    mx, my = x[pre:len(x) - suf][:_MIDDLE_COMPARED], y[pre:len(y) - suf][:_MIDDLE_COMPARED]
    middle = sum(m.size for m in difflib.SequenceMatcher(None, mx, my, autojunk=False).get_matching_blocks()) \
        if mx and my else 0
    return 2 * (pre + suf + middle) / (len(x) + len(y))


def first_difference(a: Any, b: Any) -> str | None:
    """The first JSON pointer (keys in sorted order) where `a` and `b` differ; None if equal."""
    return next(differing_paths(a, b), None)


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
    """The recorded request most like `p`, with where they differ. Deterministic: one asked on
    the same route and model first, then the nearest by the index's sketch; those it cannot tell
    apart (estimates within its noise) by the content they share exactly (what the sketch
    estimates), then the fewest differing JSON paths, then the closest differing text, then recorded
    order."""
    route = f"{p.canonical.method} {p.canonical.host} {p.canonical.path}"
    found = index.near(p.canonical, route)
    if not found:
        return None
    best = found[0]
    pool = [n for n in found if n.same_route_model == best.same_route_model
            and (best.score is None or (n.score is not None and n.score >= best.score - SKETCH_TIE))]
    asked = p.canonical.as_dict()
    exact = len(pool) > 1 or best.score is None  # else the sketch alone has chosen: nothing to compare
    mine = replay_index.features(p.canonical, route) if exact else set()
    ranked: list[tuple[tuple[float, ...], int, Any, CanonicalRequest]] = []
    for n in pool:
        canon = recorded_request(store, rules, n.id)
        if canon is None:
            continue
        if not exact:
            ranked.append(((0.0, 0, 0.0, n.id), n.id, n.score, canon))
            continue
        shared = round(replay_index.jaccard(mine, replay_index.features(canon, route)), 4)
        paths = sum(1 for _ in islice(differing_paths(canon.as_dict(), asked), _PATHS_COUNTED))
        ranked.append(((-shared, paths), n.id, shared, canon))
    if not ranked:
        return None
    _, chosen, score, canon = _closest(ranked, asked)
    entry = store.index.entry(chosen)
    return {"key": canon.key, "exchange_id": chosen, "session": entry.session if entry else None,
            "similarity": score, "differs_at": first_difference(canon.as_dict(), asked),
            "diff": short_diff("\n".join(flat(canon.as_dict())), "\n".join(flat(asked)))}


def _closest(ranked: list[tuple[Any, int, Any, CanonicalRequest]], asked: Any) -> tuple[Any, int, Any, CanonicalRequest]:
    """The best of `ranked` by its key, then by the closest differing text, then recorded order:
    the text (the costly comparison) is compared only among those the key leaves tied."""
    best = min(r[0] for r in ranked)
    tied = [r for r in ranked if r[0] == best]
    if len(tied) == 1:
        return tied[0]
    return min(tied, key=lambda r: (-_closeness(r[3].as_dict(), asked), r[1]))


def short_diff(recorded: str, asked: str, *, limit: int = 40) -> list[str]:
    """A unified diff of two pretty canonical forms, capped so a miss response stays small."""
    lines = list(
        difflib.unified_diff(
            recorded.splitlines(), asked.splitlines(), "recorded", "request", n=1, lineterm=""
        )
    )
    if len(lines) > limit:
        lines = lines[:limit] + [f"... ({len(lines) - limit} more diff lines)"]
    return lines
