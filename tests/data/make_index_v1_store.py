"""How tests/data/store-index-v1 and store-index-v1.json were made: run from the repository root
with main at ba3b454 installed (`PYTHONPATH=. python tests/data/make_index_v1_store.py`).

The store: 60 exchanges of bench/store_traffic.py's multi-turn agent sessions through the real
recorder, so its replay index has lookup rows of layout 1 (`rindex`: one row per key, session,
bucket, band and sketch) and JSON entries. The JSON: what main's replay index answered on it, for
the tests to hold every later layout to: for each of 30 recorded requests (by exchange id), the
nearest recorded requests of that request with "Changed " put before its last message (id, score,
same route and model), the candidates of its own key, and its session's first id and ids.
Kept for the record; rerunning it with later code writes a later layout.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from bench.store_traffic import REQUEST_HEADERS, record
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.traffic import RequestData
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store.log import Store

HERE = Path(__file__).parent
QUERIES = range(1, 61, 2)


def changed(body: bytes) -> bytes:
    doc = json.loads(body)
    doc["messages"][-1]["content"] = "Changed " + doc["messages"][-1]["content"]
    return json.dumps(doc).encode()


def answers(store: Store, queries: range = QUERIES) -> dict[str, object]:
    """What the store's lookup rows answer for each query, as plain data."""
    index = replay_index.LmdbIndex(store)
    out = {}
    for i in queries:
        ex = store.exchange(i)
        body = store.bodies.of_part(ex.request, i, "request")
        canonical = RequestData("POST", "https://api.openai.com/v1/chat/completions", "api.openai.com",
                                "/v1/chat/completions", REQUEST_HEADERS, changed(body)).canonical(Rules())
        route = f"{canonical.method} {canonical.host} {canonical.path}"
        e = store.index.entry(i)
        out[str(i)] = {"near": [[n.id, n.score, n.same_route_model] for n in index.near(canonical, route)],
                       "candidates": [c.id for c in index.candidates(e.key)],
                       "first_id": index.first_id(e.session),
                       "session": [x.id for x in index.session(e.session).entries]}
    return out


def answered(path: Path, queries: range | None = None) -> dict[str, object]:
    """`answers` of the store at `path`, opened read-only (the layout tests' one way to ask)."""
    with Store.open(path, write=False) as s:
        return answers(s) if queries is None else answers(s, queries)


def layout(path: Path) -> tuple[str | None, int | None]:
    """The store's format and its replay index's layout, read as stored (any format's)."""
    import json

    import lmdb

    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=32)
    try:
        with env.begin(db=env.open_db(b"meta", create=False)) as txn:
            fmt, index = txn.get(b"format"), txn.get(b"replay_index")
        return json.loads(fmt), None if index is None else json.loads(index)
    finally:
        env.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s"
        with Store.open(path, write=True, create=True) as s:
            record(s, 60, seed=3, prefix="v1")
        with Store.open(path, write=False) as s:
            assert s.meta("replay_index") == 1
            expected = answers(s)
            target = HERE / "store-index-v1"
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            s.tables.copy_to(target)
        (HERE / "store-index-v1.json").write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}"
                                                                 for k, v in expected.items()) + "\n}\n")


if __name__ == "__main__":
    sys.exit(main())
