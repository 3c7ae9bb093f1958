"""`nfproxy merge OUT SHARD...`: stores recorded by different processes or machines become one.

A shard is checked whole before anything of it is written: every exchange must decode as an
exchange record and every body it names must be present, within its recorded size, with the
sha256 it is stored under, so a shard damaged on a lost node is refused by name (store and
exchange), never half merged. Sessions are the unit: a session's exchanges (with the bodies they
need and their replay-index entries) are written in one transaction, so an interrupted merge
leaves whole sessions, and merging again adds only what is missing. Between stores whose replay
index is layout 2, a shard's entries are copied as stored and its lookups table after its records,
whole, ids mapped (`merge_copy.copy_lookups`): until that is done OUT is marked, replay refuses it,
and the next merge first writes the missing lookups from OUT's own entries. A session that exists in OUT
or in another shard with different exchanges is a clash and is refused, as are shards recorded
under different normalization rules. Bodies are copied as stored (with the compression
dictionaries they name) and only when OUT lacks them (content addressing deduplicates across shards).

Memory is bounded by the number of sessions, not of exchanges or bodies: the check keeps, per
session, a hash of its exchanges' identities and their ids (8 bytes each); the copy (`merge_copy`)
reads each batch's records by id and passes their JSON through without parsing it (only a replay
record, whose source id changes, is parsed). A large shard is checked, and its batches prepared,
by worker processes when asked (`jobs`), each check as strict as a read in this process.
"""

from __future__ import annotations

import gc
import hashlib
import json
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noisefloor.errors import NoisefloorError
from noisefloor.outcome_rows import new_rows, row_key
from noisefloor.proxy import merge_copy
from noisefloor.proxy.exchange_record import Exchange
from noisefloor.proxy.keys import Rules
from noisefloor.proxy.store import Store, StoreError
from noisefloor.proxy.store_merge_scan import Identity

_BATCH, _BATCH_MAX = 2000, 5000  # exchanges per write transaction (whole sessions only): an eighth of
# a shard within these bounds, so that a large merge writes few, large transactions


@dataclass(frozen=True)
class MergeResult:
    shards: int
    sessions_added: int
    sessions_present: int  # already in OUT with the same exchanges: merging again changes nothing
    exchanges_added: int
    bodies_added: int
    bodies_shared: int  # bodies OUT already held (or another shard brought first)
    outcome_rows_added: int


def identity(doc: dict[str, Any] | Exchange) -> bytes:
    """What makes an exchange the same one in two stores (its id is only a position)."""
    if isinstance(doc, dict):
        return _identity(tuple(doc.get(k) for k in ("session", "mode", "key", "occurrence", "seq", "time")))
    return _identity((doc.session, doc.mode, doc.key, doc.occurrence, doc.seq, doc.time))


def _identity(parts: tuple[Any, ...]) -> bytes:
    """`identity` of (session, mode, key, occurrence, seq, time) as `Store.merge_scan` gives them."""
    return hashlib.blake2b(repr(parts).encode("utf-8", "surrogatepass"), digest_size=32).digest()


@dataclass
class _Session:
    """One session of a store: its exchange ids in write order and an order-free hash of their identities."""

    ids: array = field(default_factory=lambda: array("Q"))
    mark: int = 0

    def add(self, exchange_id: int, parts: Identity) -> None:
        self.ids.append(exchange_id)
        self.mark = (self.mark + int.from_bytes(_identity(parts), "big")) % (1 << 256)

    def join(self, ids: bytes, mark: int) -> None:
        """The same session's exchanges read by another worker, later in the store."""
        self.ids.frombytes(ids)
        self.mark = (self.mark + mark) % (1 << 256)

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


def _sessions(exchanges: Iterator[tuple[int, Identity]]) -> dict[str, _Session]:
    sessions: dict[str, _Session] = {}
    for exchange_id, parts in exchanges:
        sessions.setdefault(parts[0], _Session()).add(exchange_id, parts)
    return sessions


def _check_range(path: str, start: int, stop: int) -> list[tuple[str, bytes, int]]:
    """The sessions of exchanges start <= id < stop, every record and body checked (a worker's share)."""
    with Store.open(path, write=False) as s:
        found = _sessions(s.merge_scan(start, stop))
    return [(name, sess.ids.tobytes(), sess.mark) for name, sess in found.items()]


def _check_all(path: Path, last_id: int, jobs: int) -> dict[str, _Session]:
    """Every session of a shard, checked by `jobs` processes at once (each a range of ids) when the
    shard is large enough to pay for starting them."""
    jobs = merge_copy.workers(jobs, last_id)
    if not jobs:
        return _sessions(_store_checked(path))
    bounds = [1 + last_id * i // jobs for i in range(jobs)] + [last_id + 1]
    with merge_copy.pool(jobs) as pool:
        parts = pool.starmap(_check_range, [(str(path), bounds[i], bounds[i + 1]) for i in range(jobs)])
    sessions: dict[str, _Session] = {}
    for part in parts:
        for name, ids, mark in part:
            sessions.setdefault(name, _Session()).join(ids, mark)
    return sessions


def _store_checked(path: Path) -> Iterator[tuple[int, Identity]]:
    with Store.open(path, write=False) as s:
        yield from s.merge_scan()


def _read_shard(path: Path, jobs: int) -> _Shard:
    """Check one shard; StoreError names it (and the exchange) when anything in it is damaged."""
    with Store.open(path, write=False) as s:
        meta = {k: s.meta(k) for k in ("upstream",)}
        head = (s.outcome_rows(), s.meta("rules_id"), s.meta("rules"), s.last_id())
    try:
        sessions = _check_all(path, head[3], jobs)
        with Store.open(path, write=False) as s:
            if s.copies_lookups():  # copied as they are: checked as the records are
                s.checked_lookups()
    except StoreError as exc:
        raise StoreError(f"{exc}; nothing was merged (leave this shard out, or restore it)") from None
    return _Shard(path, sessions, head[0], head[1], head[2], meta, head[3])


def merge(out: Path, shard_paths: Sequence[Path], progress: Callable[[str], None] = lambda s: None,
          jobs: int | None = None) -> MergeResult:
    """Merge the shards into OUT; with `jobs` > 1, that many worker processes check a large shard and
    prepare its batches (one process by default: on a busy 2-core machine two workers cost twice
    the CPU and finished later)."""
    jobs = 1 if jobs is None else jobs
    with _no_gc():  # millions of short-lived objects and no cycles: the collector only costs time
        shards = []
        for p in shard_paths:
            if Path(p).resolve() == Path(out).resolve():
                raise StoreError(f"{p} is the output store itself; give OUT a new path or leave it out of the shards")
            progress(f"checking {p}")
            shards.append(_read_shard(Path(p), jobs))
        with Store.open(out, write=True, create=True) as dest:
            dest.lock_for_recording()  # no proxy records into OUT while it is merged
            if dest.repair_lookups():  # an earlier merge was killed before its lookups were in
                progress(f"{out}: the replay lookups of an interrupted merge written")
            rules = _rules(dest, shards)
            present = _sessions(dest.merge_scan(bodies=False))
            plan = _plan(present, shards)  # every refusal comes before the first write
            seen = {row_key(r): (r, "the output store") for r in dest.outcome_rows()}
            rows = [r for shard in shards for r in new_rows(seen, shard.outcomes, str(shard.path))]
            if rules is not None and dest.meta("rules_id") is None:
                dest.bind_rules(*rules)
            added = {"sessions": 0, "exchanges": 0, "bodies": 0, "shared": 0}
            for shard in shards:
                _copy_shard(dest, shard, plan, present, added, progress, jobs)
            if rows:
                dest.put_outcomes(rows)
            for name, value in shards[0].meta.items() if shards else ():
                if value is not None and dest.meta(name) is None:
                    dest.set_meta(name, value)
    return MergeResult(len(shards), added["sessions"], sum(1 for name in plan if plan[name] is None),
                       added["exchanges"], added["bodies"], added["shared"], len(rows))


@contextmanager
def _no_gc() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _copy_shard(dest: Store, shard: _Shard, plan: dict[str, _Shard | None], present: dict[str, _Session],
                added: dict[str, int], progress: Callable[[str], None], jobs: int) -> None:
    """The sessions this shard brings, whole sessions per transaction."""
    new_ids = array("Q", bytes(8 * (shard.last_id + 1)))  # shard id -> id in OUT (replay sources)
    for name, sess in shard.sessions.items():
        if plan.get(name) is None and name in present:  # already there: its ids, for replays naming it
            for old, new in zip(sess.ids, present[name].ids):
                new_ids[old] = new
    todo = [name for name in shard.sessions if plan.get(name) is shard]
    size = min(_BATCH_MAX, max(_BATCH, sum(len(shard.sessions[n].ids) for n in todo) // 8))
    grouped = list(_batches(todo, shard.sessions, size))
    batches = [array("Q", [i for name in names for i in shard.sessions[name].ids]) for names in grouped]
    sessions = iter(len(names) for names in grouped)
    following = dest.last_id() + 1  # OUT is locked: the batches take the next ids, in this order
    for old in (i for b in batches for i in b):
        new_ids[old], following = following, following + 1
    with Store.open(shard.path, write=False) as src:
        dest.adopt_dictionaries(src)

    def done(exchanges: int, bodies: int, fresh: int) -> None:
        added["sessions"] += next(sessions)
        added["exchanges"] += exchanges
        added["bodies"] += fresh
        added["shared"] += bodies - fresh
        progress(f"{shard.path}: {added['exchanges']} exchanges merged")

    merge_copy.write_shard(dest, shard.path, batches, jobs, new_ids, lambda text: _moved(text, new_ids), done)


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


def _batches(names: list[str], sessions: dict[str, _Session], most: int) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for name in names:
        batch.append(name)
        size += len(sessions[name].ids)
        if size >= most:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _moved(text: bytes, new_ids: array) -> bytes:
    """A stored replay record as OUT appends it: without its id, its source id mapped."""
    doc = json.loads(text)
    doc.pop("id")
    if (doc.get("replay") or {}).get("source_id") is not None:
        source = doc["replay"]["source_id"]
        mapped = new_ids[source] if 0 < source < len(new_ids) else 0
        doc["replay"] = {**doc["replay"], "source_id": mapped or None}
    return json.dumps(doc).encode()
