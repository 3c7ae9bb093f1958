"""Where a store's bytes go: each LMDB table's pages (branch, leaf, overflow; a dupsort table's
sub-databases included) and the free pages, against the store's raw bytes (bodies + records, as
bench/store_scale.py writes them next to the store in s{n}.build.json).

    python bench/store_tables.py DIR/s100000.lmdb [--raw BYTES]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import lmdb

TABLES = ("meta", "bodies", "exchanges", "dicts", "recorded", "outcomes", "lookups", "index_routes", "heads", "labels", "routes")


def _pages(stat: dict[str, int]) -> int:
    return stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]


def tables(store: Path) -> dict[str, int]:
    """Bytes per table, 'free' for pages no table holds (free list and LMDB's own), 'used' in all."""
    env = lmdb.open(str(store), max_dbs=16, readonly=True, lock=False)
    try:
        psize = env.stat()["psize"]
        out: dict[str, int] = {}
        with env.begin() as txn:
            for name in TABLES:
                try:
                    db = env.open_db(name.encode(), txn=txn, create=False)
                except lmdb.NotFoundError:
                    continue
                out[name] = _pages(txn.stat(db)) * psize
        in_tables = sum(out.values())
        out["used"] = (env.info()["last_pgno"] + 1) * psize
        # the rest: the free list's pages and the pages it lists, LMDB's two meta pages, its table of tables
        out["free"] = out["used"] - in_tables - (2 + _pages(env.stat())) * psize
        return out
    finally:
        env.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--raw", type=int, help="raw bytes (default: s{n}.build.json beside the store)")
    a = ap.parse_args()
    raw = a.raw or json.loads(a.store.with_name(a.store.stem + ".build.json").read_text())["raw_bytes"]
    got = tables(a.store)
    print(json.dumps({k: round(v / raw, 4) for k, v in got.items()} | {"raw_bytes": raw}))


if __name__ == "__main__":
    main()
