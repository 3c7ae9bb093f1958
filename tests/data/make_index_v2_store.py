"""How tests/data/store-index-v2 and store-index-v2.json were made: run from the repository root
with main at 05ff371 installed (`python tests/data/make_index_v2_store.py` with main's venv).

The store: 60 exchanges of bench/store_traffic.py's multi-turn agent sessions through the real
recorder, so its replay index is layout 2 (msgpack entries with 32 x uint32 sketches, `lookups`
under 9-byte keys), format noisefloor-log/4. The JSON: what main's index answered on it
(`make_index_v1_store.answers`), which layout 3 must answer alike. Kept for the record; rerunning
it with later code writes a later layout.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from bench.store_traffic import record
from noisefloor.proxy.store.log import Store
from tests.data.make_index_v1_store import answers

HERE = Path(__file__).parent


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s"
        with Store.open(path, write=True, create=True) as s:
            record(s, 60, seed=4, prefix="v2")
        with Store.open(path, write=False) as s:
            assert s.meta("replay_index") == 2 and s.format == "noisefloor-log/4"
            expected = answers(s)
            target = HERE / "store-index-v2"
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            s.tables.copy_to(target)
        (HERE / "store-index-v2.json").write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}"
                                                                 for k, v in expected.items()) + "\n}\n")


if __name__ == "__main__":
    sys.exit(main())
