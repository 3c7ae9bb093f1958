"""nfview on a large store: the first page of exchanges and of sessions, and a filtered page deep
in the store, against reading the whole store once (what a viewer without a cursor would do).

    python bench/viewer_pages.py [--exchanges 200000]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from noisefloor.proxy.cli.listing import Filters  # noqa: E402
from noisefloor.proxy.store.log import Store  # noqa: E402
from noisefloor.proxy.store.replay_index import RecordedEntry  # noqa: E402
from noisefloor.viewer import pages  # noqa: E402


def fill(path: Path, n: int) -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"hello"}]}'
    digest = hashlib.sha256(body).hexdigest()
    with Store.open(path, write=True, create=True) as store:
        for start in range(0, n, 5000):
            items = []
            for i in range(start, min(n, start + 5000)):
                session = f"live-r{i % 5}-T/{i // 50}"
                rec = {"time": 1.7e9 + i, "mode": "record", "session": session, "task": f"T/{i // 50}",
                       "replicate": str(i % 5), "condition": ("live", "t0", "replay")[i % 3], "key": f"{i:064x}",
                       "occurrence": 0, "seq": i, "rules_id": "r",
                       "request": {"method": "POST", "url": "http://127.0.0.1/v1/chat/completions",
                                   "headers": [["content-type", "application/json"]], "body": digest, "body_size": 60},
                       "response": {"status": 404 if i == n - 10 else 200, "headers": [], "body": digest,
                                    "body_size": 60}, "model": "m", "notes": []}
                items.append((rec, {digest: body}, RecordedEntry(0, rec["key"], session, 0, i, "POST h /p")))
            store.append_many(items)


def timed(fn, repeat: int = 3) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--exchanges", type=int, default=200_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.lmdb"
        t = time.perf_counter()
        fill(path, args.exchanges)
        print(f"wrote {args.exchanges} exchanges in {time.perf_counter() - t:.1f} s")
        with Store.open(path, write=False) as store:
            first = timed(lambda: pages.exchange_page(store, 0, 100, Filters()))
            sessions = timed(lambda: pages.session_page(store, 0, Filters()))
            deep = timed(lambda: pages.exchange_page(store, args.exchanges - 1000, 100, Filters(status="4xx")))
            whole = timed(lambda: sum(1 for _ in store.exchanges()), repeat=1)
        print(f"first page of 100 exchanges: {first * 1000:.1f} ms")
        print(f"first page of sessions ({pages.SCAN} exchanges read): {sessions * 1000:.1f} ms")
        print(f"a filtered page from a cursor near the end: {deep * 1000:.1f} ms")
        print(f"reading the whole store once: {whole * 1000:.0f} ms ({whole / first:.0f}x the first page)")


if __name__ == "__main__":
    main()
