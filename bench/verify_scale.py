"""nfverify bfcl on a large store, in bounded memory: a store of N exchanges built through the
real recorder (bench/store_traffic.py's multi-turn sessions, ~5 kB raw per exchange), each session
labelled with a BFCL v4 task id so that every candidate is read and graded, then `nfverify bfcl
STORE` as a whole process: wall seconds, peak RSS (VmHWM, which counts the store pages it mapped)
and peak private memory. The store is deleted afterwards unless --keep is given.

    NF_SHARED_DATA=/work/shared/data python bench/verify_scale.py --exchanges 100000
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.store_scale import BIN, PRIVATE, timed  # noqa: E402
from bench.store_traffic import REQUEST_HEADERS, response_headers, sessions  # noqa: E402
from noisefloor.proxy.record.recorder import Recorder  # noqa: E402
from noisefloor.proxy.request.keys import Rules  # noqa: E402
from noisefloor.proxy.request.labels import Labels  # noqa: E402
from noisefloor.proxy.request.traffic import RequestData, ResponseData  # noqa: E402
from noisefloor.proxy.store.log import Store  # noqa: E402

TASK_IDS = [f"{cat}_{i}" for cat in ("multiple", "parallel") for i in range(200)]


def build(path: Path, n: int) -> int:
    """Record n exchanges; returns the number of sessions."""
    rng = random.Random(1)
    reps: dict[str, int] = {}
    count = 0
    with Store.open(path, write=True, create=True) as store:
        rec = Recorder(store, Rules())
        for count, (name, turns) in enumerate(sessions(n, 0), 1):
            task = TASK_IDS[count % len(TASK_IDS)]
            reps[task] = reps.get(task, -1) + 1
            labels = Labels(name, task, str(reps[task]), "live")
            for req_body, resp_body in turns:
                req = RequestData("POST", "https://api.openai.com/v1/chat/completions", "api.openai.com",
                                  "/v1/chat/completions", REQUEST_HEADERS, req_body)
                resp = ResponseData(200, response_headers(rng, len(resp_body)), resp_body)
                rec.finish(rec.begin(req, labels), resp, latency_ms=500.0)
    return count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exchanges", type=int, default=100_000)
    ap.add_argument("--keep", type=Path, help="build the store here and keep it (default: a temp folder, deleted)")
    a = ap.parse_args()
    where = a.keep or Path(tempfile.mkdtemp(prefix="nf-verify-scale-"))
    where.mkdir(parents=True, exist_ok=True)
    store = where / f"bfcl{a.exchanges}.lmdb"
    try:
        if not (store / "data.mdb").exists():
            t = time.perf_counter()
            n_sessions = build(store, a.exchanges)
            print(f"built {a.exchanges} exchanges ({n_sessions} sessions) in {time.perf_counter() - t:.0f} s", flush=True)
        wall, peak = timed([str(BIN / "nfverify"), "bfcl", str(store), "--outcomes", str(where / "o.jsonl")])
        rows = sum(1 for _ in (where / "o.jsonl").open())
        print(json.dumps({"exchanges": a.exchanges, "rows": rows, "nfverify_s": round(wall, 1),
                          "nfverify_rss_mb": round(peak), "nfverify_private_mb": round(max(PRIVATE.values()))}))
    finally:
        if a.keep is None:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
