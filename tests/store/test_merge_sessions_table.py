"""What a merge reads of OUT follows what is merged, not what OUT holds: OUT's sessions come from
its sessions table (`merge._known`: a point read per shard session) and from the exchanges
recorded into it since the last merge, never from every exchange it holds. The table stays true
to the exchanges: a proxy recording into OUT between merges, a damaged row, a mark forged past
the last exchange, a merge killed between batches. An OUT holding more than a quarter of what a
merge brings is not refilled (that would cost what it holds). Real LMDB stores recorded by the
real recorder."""

from __future__ import annotations

from pathlib import Path

import lmdb
import pytest

from bench.store_traffic import record
from noisefloor.proxy.store.log import Store, StoreError
from noisefloor.proxy.store.merge import _known as known
from noisefloor.proxy.store.merge.run import merge
from noisefloor.proxy.store.merge.scan import MergeScan
from noisefloor.proxy.store.merge.shard import MergeIO
from tests.conftest import nfproxy_argv
from tests.store.store_fixtures import killed_after_first_batch, run


def _recorded(path: Path, n: int, seed: int, prefix: str) -> Path:
    with Store.open(path, write=True, create=True) as s:
        record(s, n, seed=seed, prefix=prefix)
    return path


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    where = tmp_path_factory.mktemp("shards")
    return [_recorded(where / f"s{i}.lmdb", 60, i, f"p{i}") for i in range(5)]


def _table(path: Path) -> dict[bytes, bytes]:
    with Store.open(path, write=False) as s, s.tables.env.begin(buffers=False) as txn:
        return dict(txn.cursor(db=s.tables.env.open_db(known.TABLE, txn=txn, create=False)))


def _rebuilt(path: Path, shard: Path) -> dict[bytes, bytes]:
    """OUT's table as a merge writes it from every exchange (the table dropped, a shard OUT holds merged again)."""
    env = lmdb.open(str(path), max_dbs=32)
    try:
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(known.TABLE, txn=txn, create=False), delete=True)
    finally:
        env.close()
    assert merge(path, [shard]).exchanges_added == 0
    return _table(path)


class _Reads:
    """What a merge reads of OUT: exchanges through the check (`MergeScan.scan`), and session keys
    asked of its table (`known_rows`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, out: Path) -> None:
        self.exchanges = self.keys = 0
        scan, rows = MergeScan.scan, MergeIO.known_rows

        def counted_scan(check: MergeScan, *a, **kw):  # type: ignore[no-untyped-def]
            for item in scan(check, *a, **kw):
                self.exchanges += check.path == out
                yield item

        def counted_rows(merging: MergeIO, keys, covered):  # type: ignore[no-untyped-def]
            keys = list(keys)
            self.keys += len(keys) * (merging.path == out)
            return rows(merging, keys, covered)

        monkeypatch.setattr(MergeScan, "scan", counted_scan)
        monkeypatch.setattr(MergeIO, "known_rows", counted_rows)


def test_a_merge_reads_as_much_of_a_small_out_as_of_a_large_one(shards, tmp_path, monkeypatch):
    small, large = tmp_path / "small.lmdb", tmp_path / "large.lmdb"
    merge(small, shards[:1])
    said: list[str] = []
    for shard in shards[:4]:  # one at a time: each merge into a non-empty OUT after the first
        merge(large, [shard], said.append)
    assert not any("pages refilled" in line for line in said)  # a refill would cost what OUT holds
    with Store.open(small, write=False) as s, Store.open(large, write=False) as g:
        assert len(g) >= 4 * len(s) - 4
    seen = {}
    for out in (small, large):
        reads = _Reads(monkeypatch, out)
        got = merge(out, [shards[4]])
        assert got.exchanges_added == 60 and got.sessions_present == 0
        seen[out] = (reads.exchanges, reads.keys)
        monkeypatch.undo()
    assert seen[small] == seen[large]
    assert seen[large][0] == 0  # no exchange of OUT read: every one was in its table
    with Store.open(shards[4], write=False) as s:
        sessions = len({h.session for h in s.walk.heads()})
    assert seen[large][1] == sessions  # a point read per session the shard brings
    assert _table(large) == _rebuilt(large, shards[0])  # what the merges kept equals the table written afresh


def test_sessions_a_proxy_recorded_into_out_since_the_last_merge_are_read_and_compared(shards, tmp_path, monkeypatch):
    out = tmp_path / "out.lmdb"
    merge(out, shards[:2])
    with Store.open(out, write=True) as s:  # as a proxy recording into OUT would: after the table's mark
        before = len(s)
        record(s, 30, seed=9, prefix="late")
        after = len(s)
    reads = _Reads(monkeypatch, out)
    copy = _recorded(tmp_path / "late.lmdb", 30, 9, "late")  # the same session names, recorded at other times
    with pytest.raises(StoreError, match="with different exchanges"):
        merge(out, [copy])
    assert reads.exchanges == after - before  # the exchanges after the mark, and no others
    monkeypatch.undo()
    twin = tmp_path / "twin.lmdb"
    with Store.open(out, write=False) as s:
        s.tables.copy_to(_empty_dir(twin))
    got = merge(out, [twin])  # every session OUT holds, from its table and the late ones: nothing new
    assert got.exchanges_added == 0 and got.sessions_present > 0
    assert _table(out) == _rebuilt(out, shards[0])


def _empty_dir(path: Path) -> Path:
    path.mkdir()
    return path


def _tampered(out: Path, key: bytes, change) -> None:  # type: ignore[no-untyped-def]
    env = lmdb.open(str(out), max_dbs=32)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(known.TABLE, txn=txn, create=False)
            txn.put(key, change(txn.get(key, db=db)), db=db)
    finally:
        env.close()


def test_a_damaged_row_or_a_forged_mark_has_the_table_written_again(shards, tmp_path):
    out = tmp_path / "out.lmdb"
    merge(out, shards[:2])
    clean = _table(out)
    row = next(k for k in clean if k != known.COVERED)
    _tampered(out, row, lambda v: v[:-1] + bytes([v[-1] ^ 1]))  # an id changed under the row's CRC
    got = merge(out, shards[:2])  # the sessions still compared: all present, none copied again
    assert got.exchanges_added == 0 and got.sessions_present == len(clean) - 1
    assert _table(out) == clean
    _tampered(out, known.COVERED, lambda v: known.pack_covered(10 ** 9))  # a mark past the last exchange
    with Store.open(out, write=False) as s:
        assert MergeIO(s).known_covered() is None
    assert merge(out, shards[:2]).exchanges_added == 0
    assert _table(out) == clean
    assert merge(out, [shards[2]]).exchanges_added == 60
    assert _table(out) == _rebuilt(out, shards[0])


def test_a_merge_killed_between_batches_leaves_the_table_true_to_the_exchanges(tmp_path):
    big = _many(tmp_path / "big.lmdb")
    out = tmp_path / "out.lmdb"
    killed_after_first_batch([*nfproxy_argv(), "merge", "--jobs", "1", str(out), str(big)])
    with Store.open(out, write=False) as s:
        partial = len(s)
        covered = MergeIO(s).known_covered()
    assert 0 < partial < 6000 and covered == partial  # the table took each batch's sessions with it
    assert sum(len(known.unpack(k, v, covered)[1]) for k, v in _table(out).items() if k != known.COVERED) == partial
    assert merge(out, [big]).exchanges_added == 6000 - partial
    assert _table(out) == _rebuilt(out, big)


def _many(path: Path) -> Path:
    """6,000 exchanges in sessions of 3: several write transactions."""
    from noisefloor.proxy.store.replay_index import RecordedEntry

    with Store.open(path, write=True, create=True) as s:
        items = []
        for i in range(6000):
            rec = {"time": 1000.0 + i, "mode": "record", "session": f"s{i // 3}", "key": f"{i % 7:064x}",
                   "occurrence": i // 21, "seq": i % 3, "rules_id": "r", "request": {"method": "POST", "url": "u",
                   "headers": [], "body": None}, "response": None}
            items.append((rec, {}, RecordedEntry(0, rec["key"], rec["session"], rec["occurrence"], rec["seq"],
                                                 "POST h /p", rec["time"], rec["time"] + 1)))
        s.append_many(items)
    return path


@pytest.mark.parametrize("forged", ["a plain value", "a table of duplicates"])
def test_a_sessions_entry_that_is_not_merges_table_is_refused_by_one_line(shards, tmp_path, forged):
    out = tmp_path / "out.lmdb"
    merge(out, shards[:1])
    env = lmdb.open(str(out), max_dbs=32)
    try:
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(known.TABLE, txn=txn, create=False), delete=True)
        if forged == "a plain value":
            with env.begin(write=True) as txn:
                txn.put(known.TABLE, b"not a table")
        else:
            env.open_db(known.TABLE, dupsort=True)
    finally:
        env.close()
    r = run([*nfproxy_argv(), "merge", str(out), str(shards[1])])
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert f"{known.TABLE.decode()} entry is not the table merge writes" in r.stderr and "nfproxy compact" in r.stderr
    with Store.open(out, write=False) as s:
        assert len(s) == 60  # nothing of the second shard written
    assert run([*nfproxy_argv(), "compact", str(out)]).returncode == 0
    assert merge(out, [shards[1]]).exchanges_added == 60  # as the line says
