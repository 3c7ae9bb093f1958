"""Whether two replay indexes answer alike: what one store's index answers for every STEP-th
recorded request (its candidates, session and first id; the nearest recorded requests of it with
"Changed " before its last message: a miss), dumped as JSON, then two dumps compared (how many
nearest requests changed, and of those how many where the first two were tied).

    python bench/index_agreement.py dump STORE STEP OUT.json      # with either checkout's code
    python bench/index_agreement.py compare A.json B.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def dump(store: Path, step: int, out: Path) -> None:
    from noisefloor.proxy.store.log import Store
    from tests.data.make_index_v1_store import answers

    with Store.open(store, write=False) as s:
        out.write_text(json.dumps(answers(s, range(1, len(s) + 1, step))))


def compare(a_path: Path, b_path: Path) -> dict[str, int]:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    if a.keys() != b.keys():
        raise SystemExit("the dumps hold different queries")
    out = {"queries": len(a), "hit_lookups_same": 0, "near_lists_same": 0, "nearest_same": 0,
           "nearest_changed_where_tied": 0, "nearest_changed_not_tied": 0}
    for k, x in a.items():
        y = b[k]
        out["hit_lookups_same"] += [x[f] for f in ("candidates", "first_id", "session")] == [
            y[f] for f in ("candidates", "first_id", "session")]
        out["near_lists_same"] += x["near"] == y["near"]
        if [n[0] for n in x["near"][:1]] == [n[0] for n in y["near"][:1]]:
            out["nearest_same"] += 1
        elif len(x["near"]) > 1 and x["near"][0][1] == x["near"][1][1]:
            out["nearest_changed_where_tied"] += 1
        else:
            out["nearest_changed_not_tied"] += 1
    return out


def main() -> None:
    if sys.argv[1:2] == ["dump"] and len(sys.argv) == 5:
        dump(Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
    elif sys.argv[1:2] == ["compare"] and len(sys.argv) == 4:
        print(json.dumps(compare(Path(sys.argv[2]), Path(sys.argv[3]))))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
