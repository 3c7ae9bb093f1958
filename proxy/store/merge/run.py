"""`nfproxy merge OUT SHARD...`: stores recorded by different processes or machines become one.

A shard is checked whole before anything of it is written: every exchange must decode as an
exchange record and every body it names must be present, within its recorded size, with the
sha256 it is stored under (decompressed and hashed: a CRC alone passes a body forged to other
content under a good digest), so a shard damaged on a lost node or forged is refused by name
(store and exchange), never half merged, whatever the order of the shards. Into a used OUT each
body an exchange names is hashed by the check (`MergeScan.check_body`); into a fresh one, which
takes every body, the whole bodies table of each shard is, once, the ones no exchange names too,
first (`merge_copy.verify_bodies`; where it finds damage, the shards are checked hashing each
body an exchange names, so that the refusal names the exchange). Sessions are the unit: a session's exchanges (with the bodies they
need and their replay-index entries) are written in one transaction, so an interrupted merge
leaves whole sessions, and merging again adds only what is missing. Between stores whose replay
index has one layout (2 or 3), a shard's entries are copied as stored and its lookups table after its records,
whole, ids mapped (`merge_copy.copy_lookups`); where OUT held little (at most a quarter of what
the merge brings: the refill then costs what is merged), every shard's lookups
are written once, merged in key order (`merge_copy.merged_lookups`): into a fresh OUT, whose every
table went in in key order, appended last (read and merged by a second process) and the file cut
to its pages; else by the refill, with OUT's own, not copied into OUT and then again. Until they are in, OUT is
marked, replay refuses it, and the next merge first writes the missing lookups from OUT's own entries. A session that exists in OUT
or in another shard with different exchanges is a clash and is refused, as are shards recorded
under different normalization rules. Bodies are copied as stored (with the compression
dictionaries they name) and only when OUT lacks them (content addressing deduplicates across shards).

What a merge reads of OUT follows what it merges, not what OUT holds: OUT's sessions come from
its sessions table (`_known`: a point read per session a shard has, and the exchanges recorded
into OUT since the last merge), each outcome row is looked up by key, and a larger OUT is not
refilled.

Memory does not grow with bodies, records or outcome rows: a shard is checked through its heads
(`MergeScan.scan`: a record its checked head vouches for is read for its identity and bodies,
not parsed whole), its sessions kept as numpy arrays (`merge_sessions`: per exchange 8 bytes
once a store is read, per session about 90), its outcome rows streamed (`merge_outcomes`); the
copy (`merge_copy`) reads each batch's records by id: each is copied as stored (its id is its key: its bytes do not change; its bodies' digests are the check's,
kept by id, so it is not decompressed again), else its JSON passed through
without parsing it and encoded again under its new id (only a replay record, whose source id
changes, is parsed), each head copied from the shard's. A large shard is checked, and its batches prepared, by worker processes when asked
(`jobs`), each check as strict as a read in this process.
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noisefloor.proxy.record import interrupted
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store.log import Store, StoreError
from noisefloor.proxy.store.merge import _copying as merge_copy
from noisefloor.proxy.store.merge import _known as known
from noisefloor.proxy.store.merge import _outcomes as merge_outcomes
from noisefloor.proxy.store.merge import _sessions as merge_sessions
from noisefloor.proxy.store.merge.scan import MergeScan
from noisefloor.proxy.store.merge.shard import MergeIO

_BATCH, _BATCH_MAX = 2000, 5000  # exchanges per write transaction (whole sessions only): an eighth of
# a shard within these bounds, so that a large merge writes few, large transactions
_REFILL = 4  # a merge into an OUT holding at most 1/4 of what it brings ends with OUT's pages refilled
# (`compact.refill`): its bodies went in by hash, in random order, leaving pages a third empty. A
# larger OUT is not: the refill would cost what OUT holds (`nfproxy compact` refills it). 0: never


@dataclass(frozen=True)
class MergeResult:
    shards: int
    sessions_added: int
    sessions_present: int  # already in OUT with the same exchanges: merging again changes nothing
    exchanges_added: int
    bodies_added: int
    bodies_shared: int  # bodies OUT already held (or another shard brought first)
    outcome_rows_added: int


@dataclass
class _Shard:
    path: Path
    sessions: merge_sessions.Sessions  # in order of first appearance
    rules_id: str | None
    rules: Any
    meta: dict[str, Any]
    last_id: int


def _check_range(path: str, start: int, stop: int, hashed: bool = True) -> merge_sessions.Scanned:
    """Exchanges start <= id < stop, every record and body checked (a worker's share); each body's
    content hashed too unless `hashed` is False (the whole bodies table is, by `verify_bodies`)."""
    with Store.open(path, write=False) as s:
        plans = bytearray()  # what the copy takes of this check
        return merge_sessions.scan(MergeScan(s, hashed).scan(start, stop, plans=plans), plans)


def _check_all(path: Path, last_id: int, jobs: int, meanwhile: Callable[[], None],
               hashed: bool = True) -> merge_sessions.Sessions:
    """Every session of a shard, checked by `jobs` processes at once (each a range of ids) when the
    shard is large enough to pay for starting them, while this process runs `meanwhile` (the
    lookups' check); the records' damage is reported first, as when run one after the other."""
    jobs = merge_copy.workers(jobs, last_id)
    if not jobs:
        scanned = _check_range(str(path), 1, last_id + 1, hashed)
        meanwhile()
        return merge_sessions.sessions(path, scanned)
    bounds = [1 + last_id * i // jobs for i in range(jobs)] + [last_id + 1]
    with merge_copy.pool(jobs) as pool:  # forked before this process opens the shard
        running = pool.starmap_async(_check_range, [(str(path), bounds[i], bounds[i + 1], hashed) for i in range(jobs)])
        failed: StoreError | None = None
        try:
            meanwhile()
        except StoreError as exc:
            failed = exc
        parts = running.get()
        if failed is not None:
            raise failed
    return merge_sessions.sessions(path, merge_sessions.join(parts))


def _name_of(sessions: merge_sessions.Sessions, s: int) -> str:
    """A session's name, read back from its first exchange (for a message)."""
    with Store.open(sessions.path, write=False) as store:
        ex = store.exchange(int(sessions.first[s]))
    return ex.session if ex is not None else f"#{s}"


def _read_shard(path: Path, jobs: int, hashed: bool = True) -> _Shard:
    """Check one shard; StoreError names it (and the exchange) when anything in it is damaged."""
    with Store.open(path, write=False) as s:
        s.answered.refuse("merge")
        meta = {k: s.meta(k) for k in ("upstream",)}
        rules_id, rules, last_id = s.meta("rules_id"), s.meta("rules"), s.last_id()
    def lookups() -> None:
        with Store.open(path, write=False) as s:
            MergeIO(s).checked_lookups()  # copied as they are: checked as the records are

    try:
        sessions = _check_all(path, last_id, jobs, lookups, hashed)
    except StoreError as exc:
        raise StoreError(f"{exc}; nothing was merged (leave this shard out, or restore it)") from None
    return _Shard(path, sessions, rules_id, rules, meta, last_id)


def merge(out: Path, shard_paths: Sequence[Path], progress: Callable[[str], None] = lambda s: None,
          jobs: int | None = None) -> MergeResult:
    """Merge the shards into OUT; with `jobs` > 1, that many worker processes check a large shard and
    prepare its batches (by default `default_jobs()`)."""
    jobs = default_jobs() if jobs is None else jobs
    with _no_gc():  # millions of short-lived objects and no cycles: the collector only costs time
        shards = []
        for p in shard_paths:
            if Path(p).resolve() == Path(out).resolve():
                raise StoreError(f"{p} is the output store itself; give OUT a new path or leave it out of the shards")
        whole_table, unsound = _empty(Path(out)), None  # a fresh OUT takes every body: hashed once, table by table
        if whole_table:
            try:  # before OUT is made: a forged body (one no exchange names too) leaves nothing behind
                merge_copy.verify_bodies([Path(p) for p in shard_paths])
            except StoreError as exc:
                whole_table, unsound = False, exc
        for p in shard_paths:
            progress(f"checking {p}")
            shards.append(_read_shard(Path(p), jobs, hashed=not whole_table))
        if unsound is not None:  # in a body no exchange names
            raise StoreError(f"{unsound}; nothing was merged (leave this shard out, or restore it)") from None
        merge_copy.check_dictionaries([Path(out)] * (Path(out) / "data.mdb").exists() + [s.path for s in shards])
        with Store.open(out, write=True, create=True) as dest:
            dest.lock_for_recording()  # no proxy records into OUT while it is merged
            interrupted.finish(dest, progress)  # what a killed proxy or merge left in OUT, before any merged in
            rules = _rules(dest, shards)
            present, catch_up = _present(dest, Path(out), shards)
            try:  # every refusal comes before the first write
                plan = merge_sessions.plan(present, [shard.sessions for shard in shards], _name_of)
            except ValueError as exc:
                raise StoreError(str(exc)) from None
            merge_outcomes.check(dest, [shard.path for shard in shards])
            if rules is not None and dest.meta("rules_id") is None:
                dest.bind_rules(*rules)
            if catch_up is not None:  # OUT's sessions table brought up to its last exchange
                MergeIO(dest).add_known(*catch_up)
            added = {"sessions": 0, "exchanges": 0, "bodies": 0, "shared": 0}
            coming = sum(int(shard.sessions.counts[plan.brings[i]].sum()) for i, shard in enumerate(shards))
            refill = bool(coming) and _REFILL > 0 and len(dest) * _REFILL <= coming  # out of key order, OUT small
            copied = _bodies_first(dest, shards, plan, progress)
            deferred = [d for i, shard in enumerate(shards) if (d := _copy_shard(
                dest, shard, (plan.brings[i], plan.in_out[i]), present, added, progress, jobs, refill,
                copied is not None)) is not None]
            if copied is not None:  # the batches named their bodies; every one was written here first
                added["shared"] += added["bodies"] - copied
                added["bodies"] = copied
            rows = merge_outcomes.write(dest, [shard.path for shard in shards])
            for name, value in shards[0].meta.items() if shards else ():
                if value is not None and dest.meta(name) is None:
                    dest.set_meta(name, value)
            if refill and copied is not None and len(deferred) == len(shards) and not dest.tables.count("lookups"):
                # every table went in in key order: only the lookups are left, appended, the file cut to its pages
                merge_copy.append_merged_lookups(dest, deferred, progress)
                dest.trim_on_close()
            elif refill:
                _refill(dest, out, deferred, progress)
    return MergeResult(len(shards), added["sessions"], plan.present,
                       added["exchanges"], added["bodies"], added["shared"], rows)


def _present(dest: Store, out: Path, shards: list[_Shard]) -> tuple[merge_sessions.Sessions, Any]:
    """OUT's sessions that some shard has too (a shard's session OUT lacks needs nothing of OUT),
    read from OUT's sessions table (`_known`): a point read per shard session, and the exchanges
    after the table's mark read through their heads (those a proxy recorded into OUT since the
    last merge; every exchange, once, where OUT has no table yet or one that does not check).
    Also what `MergeIO.add_known` then writes to bring the table up to OUT's last exchange (None:
    nothing)."""
    merging = MergeIO(dest)
    covered, last = merging.known_covered(), dest.last_id()
    keys = {bytes(k) for shard in shards for k in shard.sessions.keys}
    for again in (covered is None, True):
        since = 0 if again or covered is None else covered
        tail = merge_sessions.sessions(out, merge_sessions.scan(MergeScan(dest).scan(since + 1, bodies=False)))
        tail_at = {bytes(k): s for s, k in enumerate(tail.keys)}
        try:
            held = {} if again else merging.known_rows(sorted(keys | tail_at.keys()), since)
        except known.Damaged:
            continue  # the table is written again from every exchange
        wanted = {k: row for k, row in held.items() if k in keys} | {
            k: known.joined(held.get(k), merge_sessions.row(tail, s)) for k, s in tail_at.items() if k in keys}
        present = merge_sessions.of_rows(out, list(wanted.items()))
        rows = known.rows_of(tail.keys, tail.marks, tail.counts, tail.order)
        catch_up = (rows, last, again) if last > since or (again and covered is not None) else None
        return present, catch_up
    raise AssertionError("not reached: the second pass reads every exchange")


def _empty(out: Path) -> bool:
    """Whether OUT holds no exchange and no body yet (or does not exist)."""
    if not (out / "data.mdb").exists():
        return True
    with Store.open(out, write=False) as s:
        return len(s) == 0 and s.tables.count("bodies") == 0


def _bodies_first(dest: Store, shards: list[_Shard], plan: Any, progress: Callable[[str], None]) -> int | None:
    """Into an OUT with no exchange or body yet, taking every session of every shard of today's
    format: all their bodies, written once in key order before any record (`merge_copy.copy_bodies`);
    how many (None: not this merge, whose batches bring their bodies)."""
    if len(dest) or dest.tables.count("bodies") or not shards:
        return None
    for i, shard in enumerate(shards):
        if (plan.in_out[i] >= 0).any() or int(shard.sessions.counts[plan.brings[i]].sum()) != shard.last_id:
            return None  # a session already in OUT, or exchanges of the shard not coming: the old way
    progress(f"{dest.path}: the shards' bodies, in key order")
    try:
        return merge_copy.copy_bodies(dest, [shard.path for shard in shards])
    except StoreError as exc:  # a damaged body that no record names (those were checked with the shard)
        raise StoreError(f"{exc}; no exchange was merged (OUT holds some bodies: leave the shard out, or restore "
                         "it, and merge again)") from None


def _refill(dest: Store, out: Path, deferred: list[merge_copy.Deferred], progress: Callable[[str], None]) -> None:
    """OUT's pages refilled, the deferred shards' lookups written into the new file with OUT's
    own, in key order, once; if the refill fails, they are copied into OUT as without it."""
    width = replay_index.LOOKUP_KEY
    lookups = (lambda: (merge_copy.rows(c, width) for c in merge_copy.merged_lookups(dest, deferred))) if deferred \
        else None
    try:
        before, after = dest.refill_pages(progress, lookups)
        progress(f"{out}: pages refilled, {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    except StoreError as exc:  # merged whole all the same: only larger than it could be
        progress(f"{exc} (merged whole; `nfproxy compact` shrinks it later)")
        for d in deferred:
            with Store.open(d.path, write=False) as src:
                merge_copy.copy_lookups(dest, src, d.new_ids, d.first)


def default_jobs() -> int:
    """Two worker processes where this process may run on two CPUs or more, else none: on two
    cores they shorten a merge, even with one core kept busy by another job (BENCHMARKS.md, merge
    round 9). More are not taken by default: each adds its private memory."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return 2 if cpus >= 2 else 1


@contextmanager
def _no_gc() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _copy_shard(dest: Store, shard: _Shard, planned: tuple[Any, Any], present: merge_sessions.Sessions,
                added: dict[str, int], progress: Callable[[str], None], jobs: int,
                defer: bool = False, bodies_copied: bool = False) -> merge_copy.Deferred | None:
    """The sessions this shard brings, whole sessions per transaction; with `defer`, its lookups
    are left for the refill (returned)."""
    import numpy as np

    brings, in_out = planned
    ss = shard.sessions
    new_ids = np.zeros(shard.last_id + 1, dtype=np.uint64)  # shard id -> id in OUT (replay sources)
    for s in np.flatnonzero(in_out >= 0).tolist():  # already there: its ids, for replays naming it
        new_ids[ss.ids(s)] = present.ids(int(in_out[s]))
    size = min(_BATCH_MAX, max(_BATCH, int(ss.counts[brings].sum()) // 8))
    grouped = list(merge_sessions.batches(ss, brings, size))
    batches = [ids for ids, _ in grouped]
    sessions = iter(len(taken) for _, taken in grouped)
    following = dest.last_id() + 1  # OUT is locked: the batches take the next ids, in this order
    if batches:
        olds = np.concatenate(batches)
        new_ids[olds] = np.arange(following, following + len(olds), dtype=np.uint64)

    def rows(n: int) -> list[tuple[bytes, bytes]]:  # batch n's sessions' rows, made as it is written
        olds, taken = grouped[n]
        return known.rows_of(ss.keys[taken], ss.marks[taken], ss.counts[taken], new_ids[olds])
    with Store.open(shard.path, write=False) as src:
        MergeIO(dest).adopt_dictionaries(src)

    def done(exchanges: int, bodies: int, fresh: int) -> None:
        added["sessions"] += next(sessions)
        added["exchanges"] += exchanges
        added["bodies"] += fresh
        added["shared"] += bodies - fresh
        progress(f"{shard.path}: {added['exchanges']} exchanges merged")

    return merge_copy.write_shard(dest, shard.path, batches, jobs, new_ids, lambda text: _moved(text, new_ids), done,
                                  ss.plans_of, defer, bodies_copied, rows)


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
            today = Rules.described(shard.rules)
            have = (today.id, today.describe()) if today is not None and today.id in theirs else (shard.rules_id,
                                                                                              shard.rules)
            same = theirs
    return have


def _same_keys(rules_id: str, described: Any) -> frozenset[str]:
    """Every id of the keying a store was recorded with: today's and the earlier schemes' ids of the
    same keys (just its own when its description is not a rule set today's code rebuilds)."""
    rules = Rules.described(described)
    ids = {rules.id, *rules.legacy_ids} if rules is not None else set()
    return frozenset(ids) if rules_id in ids else frozenset({rules_id})


def _moved(text: bytes, new_ids: Any) -> bytes:
    """A stored replay record as OUT appends it: without its id, its source id mapped."""
    doc = json.loads(text)
    doc.pop("id")
    if (doc.get("replay") or {}).get("source_id") is not None:
        source = doc["replay"]["source_id"]
        mapped = int(new_ids[source]) if 0 < source < len(new_ids) else 0
        doc["replay"] = {**doc["replay"], "source_id": mapped or None}
    return json.dumps(doc).encode()
