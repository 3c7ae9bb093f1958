"""Merge's outcome rows, streamed: each shard's graded rows checked against OUT's and the earlier
shards' (a key graded differently in two places is refused before anything is written, as
`outcome_rows.new_rows` refuses it), then written where OUT lacks them, the first place's row
kept. One row at a time, looked up by key in each store (one read transaction each): memory does
not grow with the rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from noisefloor.outcome_rows import new_rows, row_key
from noisefloor.proxy.store import _outcome_values as outcome_values
from noisefloor.proxy.store.log import Store

_CHUNK = 10000  # rows written per transaction


def check(dest: Store, shards: Sequence[Path]) -> None:
    """OutcomeError naming the first row two places grade differently (OUT first, then the shards in order)."""
    with ExitStack() as opened:
        earlier: list[tuple[Callable[[bytes], Any], str]] = [(opened.enter_context(dest.outcomes.rows_of()),
                                                               "the output store")]
        for path in shards:
            store = opened.enter_context(Store.open(path, write=False))
            for _, _, row in store.outcomes.items():
                key = outcome_values.key(row)
                for row_of, where in earlier:
                    first = row_of(key)
                    if first is not None:
                        new_rows({row_key(row): (first, where)}, [row], str(path))  # raises on a clash
                        break
            earlier.append((opened.enter_context(store.outcomes.rows_of()), str(path)))


def write(dest: Store, shards: Sequence[Path]) -> int:
    """The shards' rows OUT does not hold, in shard order (a key twice: the first place's row), each
    value copied as stored where its key is the row's own (what it reads back as is the row:
    checked as it was read), else encoded for OUT. Returns how many."""
    added = 0
    for path in shards:
        with Store.open(path, write=False) as store:
            chunk: list[tuple[bytes, bytes]] = []
            for stored_key, stored, row in store.outcomes.items():
                key = outcome_values.key(row)
                chunk.append((key, stored if key == stored_key else outcome_values.value(row)))
                if len(chunk) >= _CHUNK:
                    added, chunk = added + dest.outcomes.add(chunk), []
            added += dest.outcomes.add(chunk)
    return added
