"""`nfproxy merge OUT SHARD...`: stores recorded by different processes or machines become one.

A shard is checked whole before anything of it is written: every exchange must decode as an
exchange record and every body it names must be present, within its recorded size, with the
sha256 it is stored under, so a shard damaged on a lost node is refused by name (store and
exchange), never half merged. Sessions are the unit: a session's exchanges (with the bodies they
need and their replay-index entries) are written in one transaction, so an interrupted merge
leaves whole sessions, and merging again adds only what is missing. A session that exists in OUT
or in another shard with different exchanges is a clash and is refused, as are shards recorded
under different normalization rules. Bodies are copied as stored (with the compression
dictionaries they name) and only when OUT lacks them (content addressing deduplicates across shards).

Memory is bounded by the number of sessions, not of exchanges or bodies: the check keeps, per
session, a hash of its exchanges' identities and their ids (8 bytes each); the copy reads each
session's records by id and passes their JSON through without parsing it (only a replay record,
whose source id changes, is parsed).
"""

from __future__ import annotations

import hashlib
import json
import re
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from noisefloor.errors import NoisefloorError
from noisefloor.outcome_rows import new_rows, row_key
from noisefloor.proxy import replay_index
from noisefloor.proxy.exchange_record import Exchange
from noisefloor.proxy.keys import Rules
from noisefloor.proxy.replay_index import RecordedEntry
from noisefloor.proxy.store import Store, StoreError

_BATCH = 2000  # exchanges per write transaction (whole sessions only)
_VERIFIED = 1 << 17  # body digests remembered as verified (a bounded cache: bodies repeat across replicates)
_BODY = re.compile(rb'"body": ?"([0-9a-f]{64})"')
_ID_PREFIX = re.compile(rb'^\{"id": ?\d+, ?')


@dataclass(frozen=True)
class MergeResult:
    shards: int
    sessions_added: int
    sessions_present: int  # already in OUT with the same exchanges: merging again changes nothing
    exchanges_added: int
    bodies_added: int
    bodies_shared: int  # bodies OUT already held (or another shard brought first)
    outcome_rows_added: int


def identity(doc: dict[str, Any] | Exchange) -> str:
    """What makes an exchange the same one in two stores (its id is only a position)."""
    get = doc.get if isinstance(doc, dict) else lambda k: getattr(doc, k)
    parts = [get(k) for k in ("session", "mode", "key", "occurrence", "seq", "time")]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


@dataclass
class _Session:
    """One session of a store: its exchange ids in write order and an order-free hash of their identities."""

    ids: array = field(default_factory=lambda: array("Q"))
    mark: int = 0

    def add(self, ex: Exchange) -> None:
        self.ids.append(ex.id)
        self.mark = (self.mark + int(identity(ex), 16)) % (1 << 256)

    def same(self, other: _Session) -> bool:
        return len(self.ids) == len(other.ids) and self.mark == other.mark


@dataclass
class _Shard:
    path: Path
    sessions: dict[str, _Session]  # in order of first appearance
    outcomes: list[dict[str, Any]]
    rules_id: str | None
    rules: Any
    meta: dict[str, Any]
    last_id: int


def _scan(store: Store, verify: bool) -> dict[str, _Session]:
    """Every session of a store; with `verify`, every record and body checked on the way."""
    sessions: dict[str, _Session] = {}
    verified: OrderedDict[str, None] = OrderedDict()
    for ex in store.exchanges():
        sessions.setdefault(ex.session, _Session()).add(ex)
        if not verify:
            continue
        for name, part in (("request", ex.request), ("response", ex.response)):
            digest = (part or {}).get("body")
            if digest is None or digest in verified:
                continue
            store.part_body(part, ex.id, name)
            verified[digest] = None
            if len(verified) > _VERIFIED:
                verified.popitem(last=False)
    return sessions


def _read_shard(path: Path) -> _Shard:
    """Check one shard; StoreError names it (and the exchange) when anything in it is damaged."""
    with Store.open(path, write=False) as s:
        try:
            sessions = _scan(s, verify=True)
        except StoreError as exc:
            raise StoreError(f"{exc}; nothing was merged (leave this shard out, or restore it)") from None
        meta = {k: s.meta(k) for k in ("upstream",)}
        return _Shard(path, sessions, s.outcome_rows(), s.meta("rules_id"), s.meta("rules"), meta, s.last_id())


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
        present = _scan(dest, verify=False)
        plan = _plan(present, shards)  # every refusal comes before the first write
        seen = {row_key(r): (r, "the output store") for r in dest.outcome_rows()}
        rows = [r for shard in shards for r in new_rows(seen, shard.outcomes, str(shard.path))]
        if rules is not None and dest.meta("rules_id") is None:
            dest.bind_rules(*rules)
        added = {"sessions": 0, "exchanges": 0, "bodies": 0, "shared": 0}
        for shard in shards:
            new_ids = array("Q", bytes(8 * (shard.last_id + 1)))  # shard id -> id in OUT (replay sources)
            for name, sess in shard.sessions.items():
                if plan.get(name) is None and name in present:  # already there: its ids, for replays naming it
                    for old, new in zip(sess.ids, present[name].ids):
                        new_ids[old] = new
            todo = [name for name in shard.sessions if plan.get(name) is shard]
            with Store.open(shard.path, write=False) as src:
                for batch in _batches(todo, shard.sessions):
                    _write_batch(dest, src, shard, batch, new_ids, added)
                    progress(f"{shard.path}: {added['exchanges']} exchanges merged")
        if rows:
            dest.put_outcomes(rows)
        for name, value in shards[0].meta.items() if shards else ():
            if value is not None and dest.meta(name) is None:
                dest.set_meta(name, value)
    return MergeResult(len(shards), added["sessions"], sum(1 for name in plan if plan[name] is None),
                       added["exchanges"], added["bodies"], added["shared"], len(rows))


def _rules(dest: Store, shards: list[_Shard]) -> tuple[str, Any] | None:
    """The one keying of OUT and every shard (id, description); a different one is refused. A
    store recorded under an earlier id scheme of the same keys (`Rules.legacy_ids`) merges: OUT
    takes today's id when it has none."""
    have = (dest.meta("rules_id"), dest.meta("rules")) if dest.meta("rules_id") is not None else None
    same = _same_keys(*have) if have is not None else frozenset()
    for shard in shards:
        if shard.rules_id is None:
            continue
        theirs = _same_keys(shard.rules_id, shard.rules)
        if have is not None and not same & theirs:
            raise StoreError(f"shard {shard.path} was recorded with normalization rules {shard.rules_id}, the others "
                             f"with {have[0]}: their keys do not match, so they cannot replay as one store; merge "
                             "shards recorded with the same --ignore-field flags")
        if have is None:
            today = _today(shard.rules)
            have = (today.id, today.describe()) if today is not None and today.id in theirs else (shard.rules_id,
                                                                                              shard.rules)
            same = theirs
    return have


def _today(described: Any) -> Rules | None:
    """The rule set a stored description names, or None when it is not one this version reads."""
    try:
        return Rules(tuple(described["header_allowlist"]), tuple(described["ignore_fields"]), described.get("profile"))
    except (TypeError, KeyError, ValueError, AttributeError, NoisefloorError):
        return None


def _same_keys(rules_id: str, described: Any) -> frozenset[str]:
    """Every id of the keying a store was recorded with: today's and the earlier schemes' ids of the
    same keys (just its own when its description is not a rule set today's code rebuilds)."""
    rules = _today(described)
    ids = {rules.id, *rules.legacy_ids} if rules is not None else set()
    return frozenset(ids) if rules_id in ids else frozenset({rules_id})


def _plan(present: dict[str, _Session], shards: list[_Shard]) -> dict[str, _Shard | None]:
    """session -> the shard that brings it, or None when OUT holds it already; refuses clashes."""
    seen: dict[str, tuple[_Session, str]] = {n: (s, "the output store") for n, s in present.items()}
    plan: dict[str, _Shard | None] = {}
    for shard in shards:
        for name, sess in shard.sessions.items():
            if name in seen:
                theirs, where = seen[name]
                if not theirs.same(sess):
                    raise StoreError(f"session {name!r} is in {shard.path} and in {where} with different exchanges: "
                                     "session names must be unique across shards (label each process's runs "
                                     "differently); nothing was merged")
                plan.setdefault(name, None)
                continue
            seen[name] = (sess, str(shard.path))
            plan[name] = shard
    return plan


def _batches(names: list[str], sessions: dict[str, _Session]) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for name in names:
        batch.append(name)
        size += len(sessions[name].ids)
        if size >= _BATCH:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _write_batch(dest: Store, src: Store, shard: _Shard, names: list[str], new_ids: array,
                 added: dict[str, int]) -> None:
    """Whole sessions in one transaction, with their replay-index entries and nearest-request
    sketches; a replay record's source id follows its source into OUT (sources are recorded before
    the replays that serve them, so they are merged first)."""
    olds = [old for name in names for old in shard.sessions[name].ids]
    entries = {e.id: e for e in src.recorded_entries_by_id(olds)}
    recorded = [i for i in olds if i in entries]
    for i, near in zip(recorded, replay_index.stored_near(src, recorded)):
        entries[i] = replace(entries[i], near=near)
    items: list[tuple[str, RecordedEntry | None]] = []
    digests: set[str] = set()
    for old, text in zip(olds, src.record_texts_of(olds)):
        digests.update(m.decode() for m in _BODY.findall(text))
        items.append((_moved(text, new_ids), entries.get(old)))
    raw = dict(zip(sorted(digests), src.raw_bodies(sorted(digests))))
    ids, fresh = dest.absorb(raw, items, source=src)
    for old, new in zip(olds, ids):
        new_ids[old] = new
    added["sessions"] += len(names)
    added["exchanges"] += len(items)
    added["bodies"] += fresh
    added["shared"] += len(raw) - fresh


def _moved(text: bytes, new_ids: array) -> str:
    """A stored record as OUT appends it: without its id, a replay record's source id mapped."""
    if b'"replay": {' not in text and b'"replay":{' not in text:
        return "{" + _ID_PREFIX.sub(b"", text, count=1).decode()
    doc = json.loads(text)
    doc.pop("id")
    if (doc.get("replay") or {}).get("source_id") is not None:
        source = doc["replay"]["source_id"]
        mapped = new_ids[source] if 0 < source < len(new_ids) else 0
        doc["replay"] = {**doc["replay"], "source_id": mapped or None}
    return json.dumps(doc)
