"""What a killed nfproxy leaves in a store, finished by the next process that holds its record
lock (`nfproxy repair`, a recording into it, `compact`, a merge into it): a recorder's answered
exchanges not yet written in full (`answered_rows`), a merge's replay lookups (`repair_lookups`)."""

from __future__ import annotations

from collections.abc import Callable

from noisefloor.display import counted
from noisefloor.proxy.record.recorder import Writer
from noisefloor.proxy.store.log import Store
from noisefloor.proxy.store.merge.shard import MergeIO


def finish(store: Store, progress: Callable[[str], None] = lambda s: None,
           drop_damaged: bool = False) -> tuple[int, int, int]:
    """How many answered exchanges were written, how many damaged rows dropped (`drop_damaged`;
    else a damaged one is a StoreError naming it) and how many exchanges' lookups written; call
    with the store's record lock held (`Store.lock_for_recording`)."""
    written, dropped = Writer(store).finish_unwritten(drop_damaged)
    if written:
        progress(f"{store.path}: {counted(written, 'answered exchange')} a killed nfproxy had not written in full, "
                 "written")
    indexed = MergeIO(store).repair_lookups()
    if indexed:
        progress(f"{store.path}: the replay lookups of an interrupted merge written")
    return written, dropped, indexed
