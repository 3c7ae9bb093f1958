"""`nfproxy migrate` on an old store whose bytes were written by an adversary (each case a copy of
a store an earlier main made, tests/data, with its raw LMDB tables edited): one error line naming
the store, the problem and the fix, a non-zero exit, no traceback, the store's data file as it
was, no work folder left beside it, and no planted secret on the screen."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import pytest
import zstandard

from noisefloor.proxy.store.log import FORMAT
from tests.conftest import DATA, nfproxy_argv

_U64 = struct.Struct(">Q")
SECRET = "sk-hostileSECRET0123456789abcdefABCDEF"
DEEP = b"[" * 50000 + b"]" * 50000  # past any JSON parser's nesting depth


def old_copy(tmp_path: Path, fixture: str, edit: Callable[[Any, Any], None] | None = None) -> Path:
    """A copy of a fixture store, `edit(env, txn)` applied to its raw tables in one transaction."""
    store = tmp_path / "old.lmdb"
    shutil.copytree(DATA / fixture, store, ignore=shutil.ignore_patterns("lock.mdb"))
    if edit is not None:
        env = lmdb.open(str(store), max_dbs=32, map_size=1 << 30)
        with env.begin(write=True) as txn:
            edit(env, txn)
        env.close()
    return store


def rows(env: Any, txn: Any, table: str) -> tuple[Any, list[tuple[bytes, bytes]]]:
    db = env.open_db(table.encode(), txn=txn, create=False)
    return db, [(bytes(k), bytes(v)) for k, v in txn.cursor(db=db)]


def _bounded_memory() -> None:
    """A migrate that a planted value makes allocate gigabytes fails here instead of on the machine."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (_ADDRESS_SPACE, _ADDRESS_SPACE))


_ADDRESS_SPACE = 4 << 30  # readers fall back to a map of the file's size when more is refused


def migrate(store: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*nfproxy_argv(), "migrate", "--store", str(store)], capture_output=True, text=True,
                          timeout=120, preexec_fn=_bounded_memory)


def refused(store: Path, said: str) -> str:
    """Migrate refuses the store by one line containing `said`, leaving it and its folder as they were."""
    before = (store / "data.mdb").read_bytes()
    r = migrate(store)
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("nfproxy: ")]  # progress
    assert r.returncode != 0 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-2000:]
    assert said in lines[0] and str(store) in lines[0] and ".migrate" not in lines[0], lines[0]
    assert SECRET not in r.stderr + r.stdout
    assert (store / "data.mdb").read_bytes() == before
    assert sorted(p.name for p in store.parent.iterdir()) == [store.name]  # no work folder left, compact's neither
    return lines[0]


def _meta(key: bytes, raw: bytes) -> Callable[[Any, Any], None]:
    return lambda env, txn: txn.put(key, raw, db=env.open_db(b"meta", txn=txn))


def _record(tag: bytes, how: Callable[[dict], bytes]) -> Callable[[Any, Any], None]:
    """Exchange 3's record rewritten as `how` makes it from the record, compressed as the store keeps it."""
    def edit(env: Any, txn: Any) -> None:
        db, rs = rows(env, txn, "exchanges")
        k, raw = rs[2]
        doc = json.loads(zstandard.ZstdDecompressor().decompress(raw[len(tag):]))
        txn.put(k, tag + zstandard.ZstdCompressor().compress(how(doc)), db=db)
    return edit


def _deep_record(doc: dict) -> bytes:
    return json.dumps(doc)[:-1].encode() + b', "later": ' + DEEP + b"}"


@pytest.mark.parametrize(("fixture", "edit", "said"), [
    ("store-main-1704f55", _meta(b"format", DEEP), "not an nfproxy store"),
    ("store-index-v2", _meta(b"extra", DEEP), "is damaged (RecursionError"),
    ("store-main-1704f55", _record(b"", _deep_record), "exchange 3 is damaged (RecursionError"),
    ("store-index-v1", _record(b"\x01", _deep_record), "exchange 3 is damaged (RecursionError"),
    ("store-index-v2", lambda env, txn: txn.put(rows(env, txn, "outcomes")[1][0][0], DEEP,
                                                db=rows(env, txn, "outcomes")[0]), "is damaged (RecursionError"),
    ("store-index-v1", lambda env, txn: txn.put(_U64.pack(2), b'{"key": ' + DEEP + b"}",
                                                db=rows(env, txn, "recorded")[0]), "is damaged (RecursionError"),
], ids=["format", "meta", "record-v1", "record-v2", "outcome", "entry-layout1"])
def test_a_value_nested_past_the_parsers_depth_is_damage_not_a_traceback(tmp_path, fixture, edit, said):
    refused(old_copy(tmp_path, fixture, edit), said)


def test_a_body_bomb_is_refused_naming_the_store_not_its_work_folder(tmp_path):
    """A format-1 body (an untagged frame) streaming 100 MB of zeros past its recorded size."""
    co = zstandard.ZstdCompressor(level=1).compressobj()  # no declared size: found by reading it
    bomb = b"".join(co.compress(bytes(1 << 20)) for _ in range(100)) + co.flush()

    def edit(env: Any, txn: Any) -> None:
        db, rs = rows(env, txn, "bodies")
        txn.put(rs[2][0], bomb, db=db)

    line = refused(old_copy(tmp_path, "store-main-1704f55", edit), "decompresses past its recorded size")
    assert line.endswith("nothing was changed")


def test_a_dictionary_whose_bytes_are_not_its_key_is_refused(tmp_path):
    """A record compressed with a planted dictionary stored under another's key: decoding it would
    launder whatever the planted dictionary makes of the frame into today's store."""
    planted = b"a planted dictionary " * 200
    key = b"\x00" * 8

    def edit(env: Any, txn: Any) -> None:
        txn.put(key, planted, db=env.open_db(b"dicts", txn=txn))
        db, rs = rows(env, txn, "exchanges")
        text = zstandard.ZstdDecompressor().decompress(rs[2][1][1:])
        frame = zstandard.ZstdCompressor(dict_data=zstandard.ZstdCompressionDict(planted)).compress(text)
        txn.put(rs[2][0], b"\x02" + key + frame, db=db)

    refused(old_copy(tmp_path, "store-index-v1", edit), "exchange 3 is damaged (ValueError: compression dictionary")


@pytest.mark.parametrize("layout", [b"99", b'"2"', b"[1]", b"true"])
def test_a_replay_index_layout_no_nfproxy_wrote_is_refused(tmp_path, layout):
    refused(old_copy(tmp_path, "store-index-v2", _meta(b"replay_index", layout)), "layout no nfproxy wrote")


@pytest.mark.parametrize("fixture", ["store-main-1704f55", "store-index-v2"])  # index rebuilt from them; kept
@pytest.mark.parametrize("rules", [b'{"version": 99}', b'"abc"', b"[1, 2]"])
def test_normalization_rules_that_are_no_rule_set_are_refused(tmp_path, fixture, rules):
    refused(old_copy(tmp_path, fixture, _meta(b"rules", rules)), "normalization rules (meta rules)")


def _entry_of_missing_exchange(env: Any, txn: Any) -> None:
    db, rs = rows(env, txn, "recorded")
    txn.put(_U64.pack(999), rs[0][1], db=db)


def _entry_copied_to_another(env: Any, txn: Any) -> None:
    db, rs = rows(env, txn, "recorded")
    txn.put(rs[1][0], rs[0][1], db=db)


def _entry_dropped(env: Any, txn: Any) -> None:
    db, rs = rows(env, txn, "recorded")
    txn.delete(rs[1][0], db=db)


def _deps_of_no_exchange(env: Any, txn: Any) -> None:
    db, rs = rows(env, txn, "recorded")
    doc = json.loads(rs[1][1])
    txn.put(rs[1][0], json.dumps({**doc, "deps": [999]}).encode(), db=db)


@pytest.mark.parametrize(("fixture", "edit", "said"), [
    ("store-index-v1", _entry_of_missing_exchange, "does not name each recorded exchange once"),
    ("store-index-v2", _entry_of_missing_exchange, "does not name each recorded exchange once"),
    ("store-main-1704f55", _entry_of_missing_exchange, "does not name each recorded exchange once"),
    ("store-main-0ba4151", _entry_of_missing_exchange, "does not name each recorded exchange once"),
    ("store-index-v2", _entry_dropped, "does not name each recorded exchange once"),
    ("store-index-v1", _entry_copied_to_another, "entry of exchange 2 does not match its record"),
    ("store-index-v2", _entry_copied_to_another, "entry of exchange 2 does not match its record"),
    ("store-main-0497a29", _entry_copied_to_another, "entry of exchange 2 does not match its record"),
    ("store-index-v1", _deps_of_no_exchange, "entry of exchange 2 does not match its record"),
], ids=["missing-layout1", "missing-layout2", "missing-none", "missing-layout3", "dropped", "copied-layout1",
        "copied-layout2", "copied-layout3", "deps-layout1"])
def test_an_index_entry_that_is_not_its_exchanges_is_refused(tmp_path, fixture, edit, said):
    """Else the migrated store would replay one request's answer for another, or name none."""
    refused(old_copy(tmp_path, fixture, edit), said)


def test_a_damaged_sketch_leaves_no_folder_of_compacts_behind(tmp_path):
    def edit(env: Any, txn: Any) -> None:
        db, rs = rows(env, txn, "rindex")
        for k, v in rs:
            if k[:1] == b"g":
                txn.put(k, v + b"\x01", db=db)

    refused(old_copy(tmp_path, "store-index-v1", edit), "a replay-index sketch of 129 bytes")


def test_a_planted_format_mark_is_not_echoed(tmp_path):
    line = refused(old_copy(tmp_path, "store-main-1704f55", _meta(b"format", json.dumps(SECRET).encode())),
                   "is not an nfproxy store")
    assert "point --store at one made by nfproxy" in line


@pytest.mark.parametrize("fixture", ["store-main-1704f55", "store-index-v2"])
@pytest.mark.parametrize("part", ["request", "response"])
def test_a_body_named_by_a_planted_text_is_refused_without_repeating_it(tmp_path, fixture, part):
    """A record naming its body by a secret instead of a sha256: the line says so, never the text."""
    def plant(doc: dict) -> bytes:
        doc[part]["body"] = SECRET
        return json.dumps(doc).encode()

    refused(old_copy(tmp_path, fixture, _record(b"" if fixture == "store-main-1704f55" else b"\x01", plant)),
            f"exchange 3 is damaged (ValueError: its {part} body is not named by a sha256)")


def test_a_lock_file_that_is_a_folder_is_one_line(tmp_path):
    store = old_copy(tmp_path, "store-main-1704f55")
    (store / "nfproxy-record.lock").mkdir()
    before = sorted(p.name for p in store.iterdir())
    refused(store, "Is a directory")
    assert sorted(p.name for p in store.iterdir()) == before


def test_a_store_being_recorded_is_refused(tmp_path):
    store = old_copy(tmp_path, "store-main-1704f55")
    with open(store / "nfproxy-record.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        refused(store, "is being recorded or migrated by another nfproxy")


@pytest.mark.parametrize("what", ["file", "link"])
def test_a_work_folder_name_taken_by_a_file_or_link_is_replaced_and_the_link_target_kept(tmp_path, what):
    store = old_copy(tmp_path / "s", "store-main-1704f55")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "precious").write_text("x")
    taken = store.parent / ".old.lmdb.migrate"
    taken.write_text("x") if what == "file" else taken.symlink_to(kept)
    r = migrate(store)
    assert r.returncode == 0 and f"to {FORMAT}" in r.stdout, r.stderr
    assert (kept / "precious").read_text() == "x" and sorted(p.name for p in store.parent.iterdir()) == [store.name]


def test_a_store_folder_linked_from_another_file_system_migrates_in_place(tmp_path):
    """The work folder goes beside the store's real folder: its data file moves in by one rename."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system at /dev/shm")
    real = shm / f"nf-migrate-{os.getpid()}-{tmp_path.name}"
    try:
        store = old_copy(real, "store-main-1704f55")
        (tmp_path / "old.lmdb").symlink_to(store)
        r = migrate(tmp_path / "old.lmdb")
        assert r.returncode == 0 and f"to {FORMAT}" in r.stdout, r.stderr
        assert sorted(p.name for p in real.iterdir()) == ["old.lmdb"] and (store / "data.mdb").is_file()
    finally:
        shutil.rmtree(real, ignore_errors=True)


def test_an_exchange_under_id_0_is_refused_not_dropped(tmp_path):
    """No reader lists id 0: migrated, the exchange would be lost without a word."""
    def edit(env: Any, txn: Any) -> None:
        db, rs = rows(env, txn, "exchanges")
        txn.put(_U64.pack(0), rs[2][1], db=db)

    refused(old_copy(tmp_path, "store-main-1704f55", edit), "holds an exchange under an id no nfproxy writes")


@pytest.mark.parametrize("after", ["bodies converted", "records converted", "replay index rebuilt"])
def test_migrate_killed_midway_leaves_the_store_as_it_was_and_a_rerun_finishes(tmp_path, after):
    import signal

    store = old_copy(tmp_path, "store-index-v1")
    before = (store / "data.mdb").read_bytes()
    p = subprocess.Popen([*nfproxy_argv(), "migrate", "--store", str(store)], stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True)
    try:
        assert p.stderr is not None
        for line in p.stderr:  # killed once it says it got this far
            if after in line:
                p.send_signal(signal.SIGKILL)
                break
    finally:
        p.kill()
        p.wait(timeout=60)
    assert p.returncode == -signal.SIGKILL
    assert (store / "data.mdb").read_bytes() == before
    r = migrate(store)
    assert r.returncode == 0 and f"to {FORMAT}" in r.stdout, r.stderr
    assert sorted(p.name for p in store.parent.iterdir()) == [store.name]
    listed = subprocess.run([*nfproxy_argv(), "log", "--json", "--store", str(store)], capture_output=True, text=True,
                            timeout=60, check=True)
    assert len(listed.stdout.splitlines()) == 60


def _referencing(bodies: list[bytes]) -> Callable[[Any, Any], None]:
    """Each of `bodies` stored, and a small body compressed against it (tag 0x03) beside it."""
    import hashlib

    c = zstandard.ZstdCompressor(level=1)

    def edit(env: Any, txn: Any) -> None:
        db = env.open_db(b"bodies", txn=txn, create=False)
        for i, big in enumerate(bodies):
            digest = hashlib.sha256(big).digest()
            txn.put(digest, b"\x01" + c.compress(big), db=db)
            small = b'{"turn": %d, "text": "hello there"}' % i
            txn.put(hashlib.sha256(small).digest(), bytes([3, 1]) + digest + c.compress(small), db=db)
    return edit


def test_a_body_compressed_against_hundreds_of_copies_of_a_large_one_is_refused(tmp_path):
    """255 references to one 60 MB body would join 15 GB before decompressing a byte."""
    import hashlib

    big = bytes(60 << 20)
    small = b'{"hello": "world"}' * 10
    c = zstandard.ZstdCompressor(level=1)

    def edit(env: Any, txn: Any) -> None:
        db = env.open_db(b"bodies", txn=txn, create=False)
        txn.put(hashlib.sha256(big).digest(), b"\x01" + c.compress(big), db=db)
        txn.put(hashlib.sha256(small).digest(), bytes([3, 255]) + hashlib.sha256(big).digest() * 255
                + c.compress(small), db=db)

    refused(old_copy(tmp_path, "store-main-0ba4151", edit), "compressed against more than 2 x --max-body-mb")


def test_large_referenced_bodies_are_not_kept_decoded(tmp_path):
    """Forty 8 MB bodies, each referenced once: reading them one at a time stays far below their sum
    (a reader kept every referenced body decoded, up to 256 of them: 16 GB at the body bound)."""
    store = old_copy(tmp_path, "store-main-0ba4151",
                     _referencing([bytes([i + 1]) * (8 << 20) for i in range(40)]))
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True); "
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss >> 10)")
    out = subprocess.run([sys.executable, "-c", probe, *nfproxy_argv(), "migrate", "--store", str(store)],
                         capture_output=True, text=True, timeout=300, check=True).stdout.split()
    assert out[0] == "0" and int(out[1]) < 160, out  # MiB of peak memory; the forty bodies are 320


def test_a_second_migrate_of_a_store_being_migrated_is_refused_and_the_first_finishes(tmp_path):
    """The second one, run while the first is compacting its converted copy, would clear the
    first's work folder under it, and the first would swap in whatever is left there."""
    import signal

    store = old_copy(tmp_path, "store-index-v1")
    first = subprocess.Popen([*nfproxy_argv(), "migrate", "--store", str(store)], stderr=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stderr is not None
        for line in first.stderr:
            if "sampling" in line:  # compacting the converted copy
                first.send_signal(signal.SIGSTOP)
                break
        second = migrate(store)
    finally:
        first.send_signal(signal.SIGCONT)
    out, _ = first.communicate(timeout=120)
    lines = [line for line in second.stderr.strip().splitlines() if not line.startswith("nfproxy: ")]
    assert second.returncode != 0 and len(lines) == 1 and "being recorded or migrated by another nfproxy" in lines[0]
    assert first.returncode == 0 and f"to {FORMAT}" in out
    assert sorted(p.name for p in store.parent.iterdir()) == [store.name]
    listed = subprocess.run([*nfproxy_argv(), "log", "--json", "--store", str(store)], capture_output=True, text=True,
                            timeout=60, check=True)
    assert len(listed.stdout.splitlines()) == 60


def test_a_converted_copy_the_disk_cannot_hold_is_not_called_damage(tmp_path):
    """A full disk while the copy is written (here: a file size limit, which fails the write as a
    full disk does) is named as such: "restore it from a copy" would send the user to discard a
    store that is whole."""
    import resource
    import signal

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, not the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))

    store = old_copy(tmp_path, "store-index-v1")
    before = (store / "data.mdb").read_bytes()
    r = subprocess.run([*nfproxy_argv(), "migrate", "--store", str(store)], capture_output=True, text=True,
                       timeout=120, preexec_fn=small_files)
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("nfproxy: ")]
    assert r.returncode != 0 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-2000:]
    assert f"cannot write the converted copy of store {store} in {tmp_path}" in lines[0], lines[0]
    assert "free disk space" in lines[0] and "damaged" not in lines[0]
    assert (store / "data.mdb").read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [store.name]


def test_a_layout2_entry_whose_bucket_is_cut_short_is_refused(tmp_path):
    """A 1-byte bucket would be written into today's index as the key of its nearest-request rows."""
    import msgspec

    def edit(env: Any, txn: Any) -> None:
        db, rs = rows(env, txn, "recorded")
        fields = msgspec.msgpack.decode(rs[1][1])
        fields[10] = b"\x01"  # layout 2: version, id, key, session, occurrence, seq, route, start, end, deps, bucket
        txn.put(rs[1][0], msgspec.msgpack.encode(fields), db=db)

    refused(old_copy(tmp_path, "store-index-v2", edit), "is damaged (ValueError: a replay-index bucket of 1 bytes)")


@pytest.mark.parametrize("mark", ["noisefloor-log/0", "noisefloor-log/01", "noisefloor-log/0007"])
def test_a_format_mark_no_nfproxy_wrote_is_not_sent_back_to_migrate(tmp_path, mark):
    """Spelled as an older format, it was refused with "run `nfproxy migrate` first" by migrate itself."""
    line = refused(old_copy(tmp_path, "store-main-1704f55", _meta(b"format", json.dumps(mark).encode())),
                   "is not an nfproxy store")
    assert "nfproxy migrate" not in line


def test_a_v7_body_whose_crc_does_not_match_its_bytes_is_refused(tmp_path):
    def edit(env: Any, txn: Any) -> None:
        db, rs = rows(env, txn, "bodies")
        k, v = next((k, v) for k, v in rs if v[:1] == b"\x04")  # a body behind its CRC-32
        txn.put(k, v[:-1] + bytes([v[-1] ^ 1]), db=db)

    refused(old_copy(tmp_path, "store-main-ac2f828", edit), "CRC-32 does not match its bytes")


def test_a_v7_value_whose_frame_names_another_dictionary_than_its_key_is_refused(tmp_path):
    """Read by its key, the frame would be decoded with a dictionary it does not name."""
    def edit(env: Any, txn: Any) -> None:
        _, ds = rows(env, txn, "dicts")
        db, rs = rows(env, txn, "exchanges")
        k, v = rs[0]
        assert v[:1] == b"\x02"
        txn.put(k, v[:1] + next(key for key, _ in ds if key != v[1:9]) + v[9:], db=db)

    refused(old_copy(tmp_path, "store-main-ac2f828-dicts", edit), "names another dictionary than its key")
