"""The replay index's own lookups, timed apart from the rest of a replay: CPU per miss search
(`LmdbIndex.near`: the bands' newest ids, the ranked sketches) and per hit lookup (a key's
candidates, their sessions' first ids and one session's entries), on a store that
bench/store_scale.py built (the requests are its own, a word changed for the misses).

    python bench/index_lookups.py STORE [--queries 300]

Runs on whichever noisefloor is imported, so one layout's code and store can be measured against
another's (main's code on a store it wrote, PYTHONPATH pointing at a copy of it) in turns.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.store_traffic import REQUEST_HEADERS  # noqa: E402
from noisefloor.proxy.request.keys import Rules  # noqa: E402
from noisefloor.proxy.request.traffic import RequestData  # noqa: E402
from noisefloor.proxy.store import replay_index  # noqa: E402
from noisefloor.proxy.store.log import Store  # noqa: E402


def _canonical(body: bytes):
    return RequestData("POST", "https://api.openai.com/v1/chat/completions", "api.openai.com",
                       "/v1/chat/completions", REQUEST_HEADERS, body).canonical(Rules())


def measure(store: Path, queries: int) -> dict[str, float]:
    with Store.open(store, write=False) as s:
        n = len(s)
        ids = [1 + (i * 7919) % n for i in range(queries)]
        asked = []
        for i in ids:
            doc = json.loads(s.bodies.of_part(s.exchange(i).request, i, "request"))
            doc["messages"][-1]["content"] = "Changed " + doc["messages"][-1]["content"]
            asked.append((s.index.entry(i), _canonical(json.dumps(doc).encode())))
        out: dict[str, float] = {}
        route = "POST api.openai.com /v1/chat/completions"
        index = replay_index.LmdbIndex(s)
        t = time.process_time()
        for _, canon in asked:
            index.near(canon, route)
        out["near_us"] = (time.process_time() - t) / queries * 1e6
        index = replay_index.LmdbIndex(s)  # nothing cached from the misses
        t = time.process_time()
        for e, _ in asked:
            index.candidates(e.key)
            index.session(e.session)
        out["hit_us"] = (time.process_time() - t) / queries * 1e6
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--queries", type=int, default=300)
    a = ap.parse_args()
    print(json.dumps(measure(a.store, a.queries)))


if __name__ == "__main__":
    main()
