"""`nfproxy merge OUT SHARD...`: stores recorded by different processes or machines become one.

A shard is checked whole before anything of it is written: every exchange must decode and every
body it names must be present with the sha256 it is stored under, so a shard damaged on a lost
node is refused by name, never half merged. Sessions are the unit: a session's exchanges (with the
bodies they need and their replay-index entries) are written in one transaction, so an interrupted
merge leaves whole sessions, and merging again adds only what is missing. A session that exists in
OUT or in another shard with different exchanges is a clash and is refused, as are shards recorded
under different normalization rules. Bodies are copied compressed and only when OUT lacks them
(content addressing deduplicates across shards).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noisefloor.outcome_rows import new_rows, row_key
from noisefloor.proxy.store import RecordedEntry, Store, StoreError

_BATCH = 2000  # exchanges per write transaction (whole sessions only)


@dataclass(frozen=True)
class MergeResult:
    shards: int
    sessions_added: int
    sessions_present: int  # already in OUT with the same exchanges: merging again changes nothing
    exchanges_added: int
    bodies_added: int
    bodies_shared: int  # bodies OUT already held (or another shard brought first)
    outcome_rows_added: int


def identity(doc: dict[str, Any]) -> str:
    """What makes an exchange the same one in two stores (its id is only a position)."""
    parts = [doc.get(k) for k in ("session", "mode", "key", "occurrence", "seq", "time")]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


@dataclass
class _Shard:
    path: Path
    sessions: dict[str, list[dict[str, Any]]]  # session -> its exchange documents, in write order
    identities: dict[int, str]  # exchange id here -> its identity (computed once)
    outcomes: list[dict[str, Any]]  # graded rows kept in the shard
    rules_id: str | None
    rules: Any
    meta: dict[str, Any]


def _read_shard(path: Path) -> _Shard:
    """Load and check one shard; StoreError names it when anything in it is damaged."""
    with Store.open(path, write=False) as s:
        sessions: dict[str, list[dict[str, Any]]] = {}
        needed: set[str] = set()
        try:
            for ex in s.exchanges():
                doc = ex.to_json()
                sessions.setdefault(ex.session, []).append(doc)
                for part in (ex.request, ex.response or {}):
                    if part.get("body"):
                        needed.add(part["body"])
            for digest in sorted(needed):
                data = s.body(digest)
                if data is None or hashlib.sha256(data).hexdigest() != digest:
                    raise StoreError(f"shard {path} is damaged: body {digest[:12]} is "
                                     f"{'missing' if data is None else 'not what its hash says'}")
        except StoreError as exc:
            raise StoreError(f"{exc}; nothing was merged (leave this shard out, or restore it)") from None
        except (ValueError, TypeError, KeyError) as exc:
            raise StoreError(f"shard {path} is damaged ({exc.__class__.__name__}); nothing was merged "
                             "(leave this shard out, or restore it)") from None
        meta = {k: s.meta(k) for k in ("upstream",)}
        identities = {doc["id"]: identity(doc) for docs in sessions.values() for doc in docs}
        return _Shard(path, sessions, identities, s.outcome_rows(), s.meta("rules_id"), s.meta("rules"), meta)


def merge(out: Path, shard_paths: Sequence[Path], progress: Callable[[str], None] = lambda s: None) -> MergeResult:
    shards = []
    for p in shard_paths:
        if Path(p).resolve() == Path(out).resolve():
            raise StoreError(f"{p} is the output store itself; give OUT a new path or leave it out of the shards")
        progress(f"checking {p}")
        shards.append(_read_shard(Path(p)))
    with Store.open(out, write=True, create=True) as dest:
        dest.lock_for_recording()  # no proxy records into OUT while it is merged
        rules = _rules(dest, shards)
        present = _sessions_of(dest)
        ids = {identity(doc): doc["id"] for docs in present.values() for doc in docs}
        plan = _plan(present, shards)  # every refusal comes before the first write
        seen = {row_key(r): (r, "the output store") for r in dest.outcome_rows()}
        rows = [r for shard in shards for r in new_rows(seen, shard.outcomes, str(shard.path))]
        if rules is not None and dest.meta("rules_id") is None:
            dest.bind_rules(*rules)
        added = {"sessions": 0, "exchanges": 0, "bodies": 0, "shared": 0}
        for shard in shards:
            todo = [name for name in shard.sessions if plan.get(name) is shard]
            with Store.open(shard.path, write=False) as src:
                entries = {e.id: e for e in src.recorded_entries()}
                for batch in _batches(todo, shard.sessions):
                    _write_batch(dest, src, shard, batch, entries, ids, added)
                    progress(f"{shard.path}: {added['exchanges']} exchanges merged")
        if rows:
            dest.put_outcomes(rows)
        for name, value in shards[0].meta.items() if shards else ():
            if value is not None and dest.meta(name) is None:
                dest.set_meta(name, value)
    return MergeResult(len(shards), added["sessions"], sum(1 for name in plan if plan[name] is None),
                       added["exchanges"], added["bodies"], added["shared"], len(rows))


def _rules(dest: Store, shards: list[_Shard]) -> tuple[str, Any] | None:
    """The one rule set of OUT and every shard (id, description); different ones are refused."""
    have = (dest.meta("rules_id"), dest.meta("rules")) if dest.meta("rules_id") is not None else None
    for shard in shards:
        if shard.rules_id is None:
            continue
        if have is not None and shard.rules_id != have[0]:
            raise StoreError(f"shard {shard.path} was recorded with normalization rules {shard.rules_id}, the others "
                             f"with {have[0]}: their keys do not match, so they cannot replay as one store; merge "
                             "shards recorded with the same --ignore-field flags")
        have = have or (shard.rules_id, shard.rules)
    return have


def _sessions_of(store: Store) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for ex in store.exchanges():
        out.setdefault(ex.session, []).append(ex.to_json())
    return out


def _plan(present: dict[str, list[dict[str, Any]]], shards: list[_Shard]) -> dict[str, _Shard | None]:
    """session -> the shard that brings it, or None when OUT holds it already; refuses clashes."""
    seen: dict[str, tuple[set[str], str]] = {n: ({identity(d) for d in docs}, "the output store")
                                             for n, docs in present.items()}  # OUT's, computed here once
    plan: dict[str, _Shard | None] = {}
    for shard in shards:
        for name, docs in shard.sessions.items():
            mine = {shard.identities[d["id"]] for d in docs}
            if name in seen:
                theirs, where = seen[name]
                if theirs != mine:
                    raise StoreError(f"session {name!r} is in {shard.path} and in {where} with different exchanges: "
                                     "session names must be unique across shards (label each process's runs "
                                     "differently); nothing was merged")
                plan.setdefault(name, None)
                continue
            seen[name] = (mine, str(shard.path))
            plan[name] = shard
    return plan


def _batches(names: list[str], sessions: dict[str, list[dict[str, Any]]]) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for name in names:
        batch.append(name)
        size += len(sessions[name])
        if size >= _BATCH:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _write_batch(dest: Store, src: Store, shard: _Shard, names: list[str], entries: dict[int, RecordedEntry],
                 ids: dict[str, int], added: dict[str, int]) -> None:
    """Whole sessions in one transaction; a replay record's source id follows its source into OUT
    (sources are recorded before the replays that serve them, so they are merged first)."""
    items: list[tuple[dict[str, Any], RecordedEntry | None, str]] = []
    digests: set[str] = set()
    for name in names:
        for doc in shard.sessions[name]:
            old = doc["id"]
            record = {k: v for k, v in doc.items() if k != "id"}
            if record.get("replay") and record["replay"].get("source_id") is not None:
                source = shard.identities.get(record["replay"]["source_id"])
                record["replay"] = {**record["replay"], "source_id": ids.get(source) if source else None}
            items.append((record, entries.get(old), shard.identities[old]))
            for part in (doc["request"], doc.get("response") or {}):
                if part.get("body"):
                    digests.add(part["body"])
    raw = {d: src.raw_body(d) for d in sorted(digests)}
    new_ids, fresh = dest.absorb(raw, [(record, entry) for record, entry, _ in items])
    for (_, _, ident), new in zip(items, new_ids):
        ids[ident] = new
    added["sessions"] += len(names)
    added["exchanges"] += len(items)
    added["bodies"] += fresh
    added["shared"] += len(raw) - fresh
