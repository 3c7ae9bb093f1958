"""Reading back everything a store holds, for tests that prove no secret was written: every value
of every LMDB table (decompressed where it is zstd or gzip) and what the store's own verified
readers give."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import lmdb
import zstandard

from noisefloor.proxy.store.log import Store


def every_value(store: Path) -> bytes:
    """Every value of every LMDB table, zstd-decoded where it is zstd, then gzip-decoded too."""
    env = lmdb.open(str(store), readonly=True, lock=False, max_dbs=16, subdir=True)
    chunks: list[bytes] = []
    with env.begin() as txn:
        names = [k for k, _ in txn.cursor()]
        for name in names:
            db = env.open_db(name, txn=txn, create=False)
            for k, v in txn.cursor(db):
                chunks += [k, v]
                try:
                    v = zstandard.ZstdDecompressor().decompressobj().decompress(v)
                    chunks.append(v)
                except zstandard.ZstdError:
                    pass
                try:
                    chunks.append(gzip.decompress(v))
                except (OSError, EOFError):
                    pass
    env.close()
    # values the store encodes itself (dictionaries, bodies chained to their session's previous
    # exchange) are read back through its own verified decoder too
    with Store.open(store, write=False) as s:
        chunks += list(s.bodies.all())
        chunks += [json.dumps(e.to_json()).encode() for e in s.exchanges()]
    assert len(chunks) > 20, "the scan read nothing"
    return b"\n".join(chunks)
