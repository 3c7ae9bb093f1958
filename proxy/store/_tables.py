"""The store's foundation: its LMDB environment, its named tables (the schema, listed once here)
and the two disciplines every part reads and writes under.

Reading (`reading`): a file cut short under an open store is refused (reading past its end would
be a SIGBUS), and damage from LMDB, zstd, JSON or the record types becomes one StoreError naming
the store and what was read. Writing (`write`): one transaction, retried after the map grew when
it filled; what a part staged for it (`on_settle`) is told whether it committed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lmdb

from noisefloor.proxy.store import heads as store_heads
from noisefloor.proxy.store.env import DAMAGE, StoreError, grow

# name -> (made when the store is, its LMDB flags); a table not made with the store is made by its
# first write (opened when a writer opens the store, or on first use: `pending`, `merge_sessions`)
SCHEMA: dict[str, tuple[bool, dict[str, Any]]] = {
    "meta": (True, {}),  # name -> JSON: format, normalization rules, dictionaries
    "bodies": (True, {}),  # sha256 -> value: every body, stored once (`_bodies`)
    "exchanges": (True, {}),  # u64 id -> value: the records, without their heads' fields (`_records`)
    "recorded": (True, {}),  # u64 id -> entry: the replay index (`replay_index`)
    "outcomes": (False, {}),  # condition, task, replicate -> JSON: graded rows (`_outcome_values`)
    "dicts": (False, {}),  # key -> zstd dictionary (`_dicts`)
    "lookups": (False, {"dupsort": True, "dupfixed": True}),  # key -> sorted 4-byte ids (`replay_index`)
    "index_routes": (False, {}),  # u32 -> bucket + route, named by index entries
    "heads": (False, {}),  # u64 id -> head (`heads`: labels, route, status, identity; CRC-checked), so that
    # listings never decompress records
    **{kind: (False, {}) for kind in store_heads.SETS},  # the heads' labels and routes, each once
}
# opened on first use: `pending` (answered rows, `record.answered_rows`), `merge_sessions` (each
# session's identity sums and ids, `merge._known`: a merge reads only the sessions it brings)


def created(env: lmdb.Environment) -> dict[str, Any]:
    """Every table of the schema made in a new environment (compact, migrate), by name."""
    return {name: env.open_db(name.encode(), **flags) for name, (_, flags) in SCHEMA.items()}


class Tables:
    """An open store's environment and table handles (None: a table this store does not have)."""

    def __init__(self, env: lmdb.Environment, path: Path, writable: bool, needed: int) -> None:
        self.env: Any = env
        self.path = path
        self.writable = writable
        self.fd = os.open(path / "data.mdb", os.O_RDONLY)
        self.needed = needed  # bytes the data file must keep: reading past its end is a SIGBUS
        self.on_settle: list[Callable[[bool], None]] = []  # told whether each write committed
        # a table every store has is opened as is (its absence: lmdb's error, no store)
        self.db: dict[str, Any] = {name: env.open_db(name.encode(), create=writable, **flags) if made
                                   else self.opened(name) for name, (made, flags) in SCHEMA.items()}

    def opened(self, name: str, create: bool | None = None) -> Any:
        """Table `name`'s handle, opened now (`create`: made if missing; default: if writable)."""
        flags = SCHEMA[name][1] if name in SCHEMA else {}
        try:
            return self.env.open_db(name.encode(), create=self.writable if create is None else create, **flags)
        except lmdb.NotFoundError:
            return None

    def begin(self, **kw: Any) -> Any:
        return self.env.begin(**kw)

    def check_intact(self) -> None:
        size = os.fstat(self.fd).st_size
        if size < self.needed:
            raise StoreError(f"store {self.path} was truncated while in use ({size} of {self.needed} bytes); "
                             "restore it from a copy or record it again")

    @contextmanager
    def reading(self, what: str = "") -> Iterator[None]:
        """Every read: refuse a file cut short under us, and turn damage into one StoreError that
        names the store, what was read, and what to do."""
        self.check_intact()
        try:
            yield
        except StoreError:
            raise
        except DAMAGE as exc:
            raise StoreError(f"store {self.path} is damaged{' (' + what + ')' if what else ''}: "
                             f"{exc.__class__.__name__}: {exc}; restore it from a copy or record it again") from None

    def write(self, fn: Any) -> Any:
        """`fn` in one write transaction (again after the map grew where it filled); its result."""
        if not self.writable:
            raise StoreError(f"store {self.path} was opened read-only")
        while True:
            self.check_intact()
            try:
                with self.env.begin(write=True) as txn:
                    done = fn(txn)
            except BaseException as exc:  # whatever undid the transaction, what it staged goes with it
                self._settle(False)
                if isinstance(exc, lmdb.MapFullError):
                    grow(self.env, self.path)
                    continue
                if isinstance(exc, lmdb.Error):
                    raise StoreError(f"writing store {self.path} failed ({exc}); nothing of this exchange was kept") \
                        from exc
                raise
            self._settle(True)
            return done

    def _settle(self, committed: bool) -> None:
        for settle in self.on_settle:
            settle(committed)

    def count(self, name: str) -> int:
        db = self.db[name]
        if db is None:
            return 0
        with self.reading(), self.env.begin(db=db) as txn:
            return int(txn.stat(db)["entries"])

    def rows(self, name: str, what: str = "") -> Iterator[tuple[bytes, bytes]]:
        """A table's keys and values as stored, in key order, in one read (compact copies them)."""
        db = self.db[name]
        if db is None:
            return
        with self.reading(what or name), self.env.begin(db=db, buffers=False) as txn:
            yield from txn.cursor()

    def used(self) -> int:
        return int((self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"])

    def usage(self) -> dict[str, int]:
        """Bytes: `used` by pages holding data, `file` on disk (the reserved map)."""
        return {"used": self.used(), "file": os.fstat(self.fd).st_size, "map": self.env.info()["map_size"]}

    def copy_to(self, folder: Path) -> None:
        """A copy of this store (a consistent snapshot, no reserved map) in an empty folder: a shard to ship."""
        with self.reading():
            # LMDB's compacting copy cannot walk tables of fixed-size duplicates (it crashes): a
            # store with lookups is copied page for page
            self.env.copy(str(folder), compact=self.count("lookups") == 0)

    def close(self) -> int:
        """The environment closed (synced when writable); the bytes its pages used."""
        if self.writable:
            self.env.sync(True)
        used = self.used()
        self.env.close()
        os.close(self.fd)
        return used
