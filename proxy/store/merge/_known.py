"""OUT's sessions as merge compares them, kept in a table of OUT (`merge_sessions`), so that a merge
reads the rows of the sessions it brings instead of every exchange OUT holds.

A row per session, under its name's 16-byte hash (`merge_sessions.name_hash`):

    CRC-32 of the key and the rest | the four lane sums of its identity hashes (4 x u64, little-endian)
    | its exchange ids, ascending (u64 each, little-endian)

and one row, `COVERED`, saying through which exchange id the rows are complete: every exchange
with an id up to it is in its session's row, none after it is. A merge first reads the exchanges
after it (a proxy may have recorded into OUT since: `MergeScan.scan` from there on) and adds
them to the table in one transaction, then writes each batch's sessions in the batch's own
transaction (`MergeIO.absorb`), moving `COVERED` to the batch's last id, so a killed merge leaves
the table as complete as the exchanges it wrote. A row that fails its CRC or its shape, or a
`COVERED` past the last exchange, and the table is written again from every exchange (it is
derived from the records, never the only copy of anything). A store that has none (made by a
recorder, copied by `compact`) gets it on its first merge.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

from noisefloor.proxy.store.env import StoreError

TABLE = b"merge_sessions"
COVERED = b"\x00covered"  # 9 bytes: no session's key (16)
_U32 = struct.Struct(">I")
_U64 = struct.Struct("<Q")
_LANES = 32

Row = tuple[Any, Any]  # numpy arrays (numpy imported on use: nfproxy starts without it): a session's four lane sums (uint64) and its ids (uint64, ascending)


class Damaged(StoreError):
    """A row of the table that does not check (merge writes the table again from the exchanges:
    never shown, but one root all the same should it escape)."""


def _sealed(key: bytes, rest: bytes) -> bytes:
    return _U32.pack(zlib.crc32(rest, zlib.crc32(key))) + rest


def _opened(key: bytes, value: Any) -> bytes:
    value = bytes(value)
    if len(value) < 4 or _U32.unpack_from(value)[0] != zlib.crc32(value[4:], zlib.crc32(key)):
        raise Damaged(key.hex())
    return value[4:]


def packed(row: Row) -> bytes:
    """A row's value less its CRC (what `rows_of` makes for many at once)."""
    lanes, ids = row
    return lanes.astype("<u8").tobytes() + ids.astype("<u8").tobytes()


def unpacked(rest: bytes) -> Row:
    import numpy as np

    return np.frombuffer(rest, dtype="<u8", count=4).astype(np.uint64), np.frombuffer(
        rest, dtype="<u8", offset=_LANES).astype(np.uint64)


def unpack(key: bytes, value: Any, covered: int) -> Row:
    """A session's row (Damaged where it does not check, or names an id past `covered`)."""
    rest = _opened(key, value)
    if len(key) != 16 or len(rest) < _LANES + 8 or (len(rest) - _LANES) % 8:
        raise Damaged(key.hex())
    lanes, ids = unpacked(rest)
    if int(ids[-1]) > covered or (len(ids) > 1 and not (ids[1:] > ids[:-1]).all()):
        raise Damaged(key.hex())
    return lanes, ids


def rows_of(keys: Any, lanes: Any, counts: Any, ids: Any) -> list[tuple[bytes, bytes]]:
    """Sessions' rows as `put_rows` takes them, (key, value less its CRC), made in one pass: their
    name hashes (V16), lane sums ((n, 4) uint64), counts, and ids (as OUT numbers them, grouped by
    session in this order, ascending within one)."""
    import numpy as np

    n = len(keys)
    if not n:
        return []
    counts = counts.astype(np.int64)
    ends = np.cumsum(counts + 4)
    starts = ends - counts - 4  # in 8-byte words: a session's lanes, then its ids
    words = np.empty(int(ends[-1]), dtype="<u8")
    words[(starts[:, None] + np.arange(4)).ravel()] = lanes.reshape(-1)
    before = np.cumsum(counts) - counts
    words[np.repeat(starts + 4 - before, counts) + np.arange(int(counts.sum()))] = ids
    buf = words.tobytes()
    return [(k, buf[8 * a:8 * b]) for k, a, b in zip(keys.tolist(), starts.tolist(), ends.tolist())]


def pack_covered(last: int) -> bytes:
    return _sealed(COVERED, _U64.pack(last))


def unpack_covered(value: Any) -> int:
    rest = _opened(COVERED, value)
    if len(rest) != 8:
        raise Damaged(COVERED.hex())
    return _U64.unpack(rest)[0]


def joined(a: Row | None, b: Row) -> Row:
    """Two parts of one session (a: its exchanges up to some id, b: after it) as one row."""
    import numpy as np

    if a is None:
        return b
    with np.errstate(over="ignore"):
        return a[0] + b[0], np.concatenate([a[1], b[1]])


def covered_in(txn: Any, db: Any) -> int | None:
    """The table's `COVERED` in `txn` (None: no table, no row, or one that does not check)."""
    if db is None:
        return None
    value = txn.get(COVERED, db=db)
    try:
        return None if value is None else unpack_covered(value)
    except Damaged:
        return None


def put_rows(txn: Any, db: Any, rows: list[tuple[bytes, bytes]], covered: int) -> bool:
    """Sessions' rows (`rows_of`) added in `txn` (to a session's row where it has one: its
    exchanges after the table's `COVERED`), and `COVERED` moved to `covered`; where a row held
    does not check, `COVERED` is deleted instead (the next merge writes the table again) and
    False returned."""
    sealed = []
    try:
        for key, rest in rows:
            old = txn.get(key, db=db)
            if old is not None:
                rest = packed(joined(unpack(key, old, covered), unpacked(rest)))
            sealed.append((key, _sealed(key, rest)))
    except Damaged:
        txn.delete(COVERED, db=db)
        return False
    with txn.cursor(db=db) as cur:
        cur.putmulti(sealed)
    txn.put(COVERED, pack_covered(covered), db=db)
    return True
