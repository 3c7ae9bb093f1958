"""The store's zstd dictionaries: sampled from its first values of each kind, trained in a thread
once there are enough, stored under their zstd ids and used by every value written after."""

from __future__ import annotations

import json
import threading
from typing import Any

import lmdb

from noisefloor.proxy.store import _codec as codec

TRAIN_AFTER = 1000  # values of a kind (body, record) seen before its dictionary is trained
_SAMPLE_MAX = 64 << 10  # longer values are not sampled for training


class Dictionaries:
    """The `dicts` table and the training of its dictionaries (a part of Store)."""

    _env: Any
    _dicts: Any
    _meta: Any
    _keys: dict[str, bytes]
    _samples: dict[str, list[bytes]]
    _training: dict[str, tuple[threading.Thread, list[bytes | None]]]
    writable: bool
    _reading: Any
    _write: Any

    def _load_dict(self, key: bytes) -> bytes | None:
        if self._dicts is None:
            return None
        with self._env.begin(db=self._dicts, buffers=False) as txn:
            data = txn.get(key)
        if data is not None and codec.dict_key(data) != key:
            raise ValueError(f"compression dictionary {key.hex()} is not stored under its id")
        return data

    def dictionary(self, key: bytes) -> bytes | None:
        with self._reading("dictionaries"):
            return self._load_dict(key)

    def add_dictionary(self, data: bytes, kind: str | None = None) -> bytes:
        """Store a dictionary (under its zstd id); with `kind`, new values of that kind use it."""
        key = codec.dict_key(data)

        def put(txn: lmdb.Transaction) -> None:
            txn.put(key, data, db=self._dicts, overwrite=False)
            if kind is not None:
                chosen = {**{k: v.hex() for k, v in self._keys.items()}, kind: key.hex()}
                txn.put(b"dicts", json.dumps(chosen).encode(), db=self._meta)

        self._write(put)
        if kind is not None:
            self._keys[kind] = key
        return key

    def _sample(self, kind: str, data: bytes) -> None:
        """Keep the first values of a kind; once there are enough, train its dictionary in a thread
        (zstd releases the GIL: the requests going on meanwhile are not held up; `nfproxy compact`
        retrains on the whole store). It is used from the first write after it is ready."""
        samples = self._samples[kind]
        if kind in self._keys or kind in self._training or not self.writable or len(data) > _SAMPLE_MAX or not data:
            return
        samples.append(bytes(data))
        if len(samples) >= TRAIN_AFTER:
            self._samples[kind] = []
            result: list[bytes | None] = []
            thread = threading.Thread(target=lambda: result.append(codec.train(samples)), daemon=True,
                                      name=f"nfproxy-train-{kind}")
            self._training[kind] = (thread, result)
            thread.start()

    def _trained(self, wait: bool = False) -> None:
        """Install the dictionaries whose training has finished (all of them, with `wait`)."""
        for kind, (thread, result) in list(self._training.items()):
            if wait:
                thread.join()
            if thread.is_alive():
                continue
            del self._training[kind]
            trained = result[0] if result else None
            if trained is None:
                self._keys.setdefault(kind, b"")  # untrainable: plain zstd from here on
            else:
                self.add_dictionary(trained, kind)
