"""The store, a page at a time, as the viewer's JSON: exchange rows behind a cursor, sessions
gathered from the same scan, one exchange decoded, and a miss beside its nearest recorded request.

Every scan is bounded (`SCAN` records per call): a store of a million exchanges answers its first
page at once, and the next page starts from the cursor the last one returned.
"""

from __future__ import annotations

import base64
import difflib
import json
from collections.abc import Iterator
from typing import Any

from noisefloor.proxy.cli.listing import SHOWN_BODY, Filters, order_note, result_of, row, unsearched
from noisefloor.proxy.replay.diagnosis import recorded_canonical
from noisefloor.proxy.request.headers import header
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.traffic import RequestData
from noisefloor.proxy.store.exchange import Exchange
from noisefloor.proxy.store.log import BodyOverLimit, Store

__all__ = ["Filters", "exchange_page", "session_page", "exchange_view", "order_note", "result_of", "row"]

SCAN = 5000  # exchanges read per call at most
SCAN_SEARCH = 500  # when searching bodies (each one decompressed)
MAX_LIMIT = 500


def _scan(store: Store, after: int, filters: Filters) -> Iterator[tuple[Exchange, bool]]:
    bound = SCAN_SEARCH if filters.q else SCAN
    for n, ex in enumerate(store.exchanges(start=after + 1)):
        if n >= bound:
            return
        yield ex, filters.wanted(ex, store)


def exchange_page(store: Store, after: int, limit: int, filters: Filters) -> dict[str, Any]:
    """Up to `limit` matching rows after id `after`; `next` is the cursor to go on from (None: the
    end of the store was reached)."""
    limit = max(1, min(limit, MAX_LIMIT))
    items: list[dict[str, Any]] = []
    last, scanned, ended = after, 0, True
    skipped: list[int] = []  # searched by their other fields only: a body over --max-body-mb
    for ex, ok in _scan(store, after, filters):
        scanned += 1
        last = ex.id
        if not ok and filters.q and unsearched(ex, store):
            skipped.append(ex.id)
        if ok:
            items.append(row(ex))
            if len(items) == limit:
                ended = False
                break
    else:
        ended = scanned < (SCAN_SEARCH if filters.q else SCAN)
    return {"items": items, "next": None if ended else last, "scanned": scanned, "total": len(store),
            "unsearched": skipped, "max_body_mb": store.max_body >> 20}


def session_page(store: Store, after: int, filters: Filters) -> dict[str, Any]:
    """Sessions seen in one bounded scan, with their counts in it; the client adds up a session
    that spans pages (its name is the key)."""
    found: dict[str, dict[str, Any]] = {}
    last, scanned = after, 0
    for ex, ok in _scan(store, after, filters):
        scanned += 1
        last = ex.id
        if not ok:
            continue
        s = found.setdefault(ex.session, {"session": ex.session, "condition": ex.condition, "task": ex.task,
                                          "replicate": ex.replicate, "first_id": ex.id, "first_time": ex.time,
                                          "exchanges": 0, "hits": 0, "misses": 0, "order": 0, "errors": 0,
                                          "models": [], "followed": {}, "diverged": None})
        s["exchanges"] += 1
        result = result_of(ex)
        _trajectory(s, ex)
        s["hits"] += result == "hit"
        s["misses"] += result == "miss"
        s["order"] += order_note(ex) is not None
        s["errors"] += result == "error" or bool(ex.response and ex.response["status"] >= 500)
        if ex.model and ex.model not in s["models"]:
            s["models"].append(ex.model)
    ended = scanned < (SCAN_SEARCH if filters.q else SCAN)
    return {"items": list(found.values()), "next": None if ended else last, "scanned": scanned, "total": len(store)}


def _trajectory(s: dict[str, Any], ex: Exchange) -> None:
    """A replay session's trajectory from its records: the recorded sessions that answered it
    (answers each) and where it first left the recording (`replay.trajectory`)."""
    replay = ex.replay if isinstance(ex.replay, dict) else {}
    src = replay.get("from")
    if replay.get("result") == "hit" and isinstance(src, str):
        s["followed"][src] = s["followed"].get(src, 0) + 1
    if s["diverged"] is None and isinstance(replay.get("diverged"), dict):
        s["diverged"] = replay["diverged"]


# -- one exchange -------------------------------------------------------------------------------


def body_view(store: Store, part: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stored body for reading: JSON pretty-printed, text as text, anything else as base64."""
    if not part or part.get("body") is None:
        return None
    try:
        data = store.bodies.decoded(part)
    except BodyOverLimit as exc:  # kept by a recorder with a higher limit: shown as a note, the page still served
        return {"kind": "over_limit", "size": part.get("body_size"), "text": str(exc)}
    if data is None:
        return {"kind": "missing", "text": f"body {part.get('body')} is not in the store"}
    cut = len(data) > SHOWN_BODY
    shown = data[:SHOWN_BODY]
    view: dict[str, Any] = {"size": len(data), "cut": cut}
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError:
        return {**view, "kind": "binary", "text": base64.b64encode(shown).decode()}
    if not cut:
        try:
            return {**view, "kind": "json", "text": json.dumps(json.loads(text), indent=2, ensure_ascii=False)}
        except ValueError:
            pass
    return {**view, "kind": "text", "text": text}


def chunks_view(store: Store, response: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """A streamed answer chunk by chunk, with each chunk's time after the first byte."""
    if not response or response.get("chunks") is None:
        return None
    try:
        data = store.bodies.of_part(response) or b""
    except BodyOverLimit:  # body_view says so
        return None
    if header(response["headers"], "content-encoding"):  # chunks are of the encoded bytes: show them whole
        data = store.bodies.decoded(response) or b""
        return [{"offset_ms": response["chunks"][-1][0] if response["chunks"] else 0.0, "size": len(data),
                 "text": data[:SHOWN_BODY].decode("utf-8", "replace")}]
    out, pos = [], 0
    for offset_ms, length in response["chunks"]:
        piece = data[pos:pos + int(length)]
        pos += int(length)
        out.append({"offset_ms": None if offset_ms is None else float(offset_ms), "size": len(piece), "text": piece.decode("utf-8", "replace")})
    return out


def store_rules(store: Store) -> Rules:
    described = store.meta("rules") or {}
    kwargs: dict[str, Any] = {"ignore_fields": tuple(described.get("ignore_fields") or ()),
                              "profile": described.get("profile")}
    if described.get("header_allowlist"):
        kwargs["header_allowlist"] = tuple(described["header_allowlist"])
    return Rules(**kwargs)


def side_by_side(left: str, right: str) -> list[dict[str, Any]]:
    """Two texts aligned line by line: equal, changed, only left (removed) or only right (added)."""
    a, b = left.splitlines(), right.splitlines()
    rows: list[dict[str, Any]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            rows += [{"op": "equal", "left": a[i], "right": b[j1 + k]} for k, i in enumerate(range(i1, i2))]
            continue
        n = max(i2 - i1, j2 - j1)
        for k in range(n):
            la = a[i1 + k] if i1 + k < i2 else None
            rb = b[j1 + k] if j1 + k < j2 else None
            rows.append({"op": "change" if la is not None and rb is not None else ("remove" if rb is None else "add"),
                         "left": la, "right": rb})
    return rows


def miss_view(store: Store, ex: Exchange) -> dict[str, Any] | None:
    """A miss beside the recorded request most like it (the one the miss answer named)."""
    if ex.replay_result != "miss":
        return None
    nearest = None
    if ex.response and ex.response.get("body"):
        try:
            doc = json.loads(store.bodies.decoded(ex.response) or b"{}")
            nearest = (doc.get("error") or {}).get("nearest")
        except ValueError:
            nearest = None
    rules = store_rules(store)
    asked = RequestData.from_record(ex.request, store.bodies.of_part(ex.request)).canonical(rules).pretty()
    if not nearest or not nearest.get("exchange_id"):
        return {"nearest": None, "asked": asked, "rows": [], "why": "the recording holds no request to compare with"}
    recorded = recorded_canonical(store, rules, int(nearest["exchange_id"])) or ""
    return {"nearest": {k: nearest.get(k) for k in ("exchange_id", "session", "similarity", "key")},
            "rows": side_by_side(recorded, asked), "diff": nearest.get("diff") or []}


def exchange_view(store: Store, exchange_id: int) -> dict[str, Any] | None:
    ex = store.exchange(exchange_id)
    if ex is None:
        return None
    doc = ex.to_json()
    return {"record": doc, "row": row(ex), "request_body": body_view(store, ex.request),
            "response_body": body_view(store, ex.response), "chunks": chunks_view(store, ex.response),
            "miss": miss_view(store, ex)}
