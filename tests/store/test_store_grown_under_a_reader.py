"""A store another process grows while a reader holds it open (a recorder's map grows in steps)
reads on: LMDB's MDB_MAP_RESIZED is no damage, and a reader's map reaches past the file for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from noisefloor.proxy.store.log import Store

GROW = """
import sys
from noisefloor.proxy.store.log import Store
with Store.open(sys.argv[1], write=True) as s:
    s.set_meta("big", "x" * (80 << 20))  # past the first map (32 MB) and its first steps
"""


def test_a_reader_reads_on_after_another_process_grew_the_store(tmp_path: Path) -> None:
    path = tmp_path / "s.lmdb"
    with Store.open(path, write=True, create=True) as s:
        s.set_meta("small", 1)
    with Store.open(path, write=False) as reader:
        assert reader.meta("small") == 1
        before = (path / "data.mdb").stat().st_size
        subprocess.run([sys.executable, "-c", GROW, str(path)], check=True, timeout=120)
        assert (path / "data.mdb").stat().st_size > before  # grown past what the reader opened
        assert reader.meta("small") == 1 and len(reader.meta("big")) == 80 << 20


def test_a_reader_without_address_space_to_spare_maps_the_file(tmp_path: Path) -> None:
    """Under a ulimit on address space the reader's map falls back to the file's size."""
    path = tmp_path / "s.lmdb"
    with Store.open(path, write=True, create=True) as s:
        s.set_meta("small", 1)
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
            "from noisefloor.proxy.store.log import Store\n"
            "with Store.open(sys.argv[1], write=False) as s:\n"
            "    print(s.meta('small'), s.tables.usage()['map'] < 4 << 30)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["1", "True"], done.stderr
