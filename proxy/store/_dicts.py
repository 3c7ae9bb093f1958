"""The store's zstd dictionaries: sampled from its first values of each kind, trained in a thread
once there are enough, stored under their zstd ids and used by every value written after."""

from __future__ import annotations

import json
import threading

import lmdb

from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store._tables import Tables

TRAIN_AFTER = 1000  # values of a kind (body, record) seen before its dictionary is trained
_SAMPLE_MAX = 64 << 10  # longer values are not sampled for training


class Dictionaries:
    """The `dicts` table and the training of its dictionaries (a part of Store)."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.keys: dict[str, bytes] = {}  # kind (body, record) -> the dictionary new values use
        self._samples: dict[str, list[bytes]] = {"body": [], "record": []}
        self.training: dict[str, tuple[threading.Thread, list[bytes | None]]] = {}

    def adopt_keys(self, chosen: dict[str, str] | None) -> None:
        """The dictionaries new values use, as the store's meta "dicts" names them."""
        self.keys = {k: bytes.fromhex(v) for k, v in (chosen or {}).items()}

    def load(self, key: bytes) -> bytes | None:
        """A stored dictionary, checked against its key (no read discipline: the codec's caller's)."""
        db = self.tables.db["dicts"]
        if db is None:
            return None
        with self.tables.begin(db=db, buffers=False) as txn:
            data = txn.get(key)
        if data is not None and codec.dict_key(data) != key:
            raise ValueError(f"compression dictionary {key.hex()} is not stored under its id")
        return data

    def dictionary(self, key: bytes) -> bytes | None:
        with self.tables.reading("dictionaries"):
            return self.load(key)

    def add(self, data: bytes, kind: str | None = None) -> bytes:
        """Store a dictionary (under its zstd id); with `kind`, new values of that kind use it."""
        key = codec.dict_key(data)
        db, meta = self.tables.db["dicts"], self.tables.db["meta"]

        def put(txn: lmdb.Transaction) -> None:
            txn.put(key, data, db=db, overwrite=False)
            if kind is not None:
                chosen = {**{k: v.hex() for k, v in self.keys.items()}, kind: key.hex()}
                txn.put(b"dicts", json.dumps(chosen).encode(), db=meta)

        self.tables.write(put)
        if kind is not None:
            self.keys[kind] = key
        return key

    def sample(self, kind: str, data: bytes) -> None:
        """Keep the first values of a kind; once there are enough, train its dictionary in a thread
        (zstd releases the GIL: the requests going on meanwhile are not held up; `nfproxy compact`
        retrains on the whole store). It is used from the first write after it is ready."""
        samples = self._samples[kind]
        if kind in self.keys or kind in self.training or not self.tables.writable or len(data) > _SAMPLE_MAX \
                or not data:
            return
        samples.append(bytes(data))
        if len(samples) >= TRAIN_AFTER:
            self._samples[kind] = []
            result: list[bytes | None] = []
            thread = threading.Thread(target=lambda: result.append(codec.train(samples)), daemon=True,
                                      name=f"nfproxy-train-{kind}")
            self.training[kind] = (thread, result)
            thread.start()

    def trained(self, wait: bool = False) -> None:
        """Install the dictionaries whose training has finished (all of them, with `wait`)."""
        for kind, (thread, result) in list(self.training.items()):
            if wait:
                thread.join()
            if thread.is_alive():
                continue
            del self.training[kind]
            got = result[0] if result else None
            if got is None:
                self.keys.setdefault(kind, b"")  # untrainable: plain zstd from here on
            else:
                self.add(got, kind)
