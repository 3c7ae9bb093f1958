"""A store's graded rows read straight into columns (`outcome_columns.RowColumns`), for
`nfanalyze STORE`: a million-exchange study keeps a few hundred thousand rows, too many to build one typed
row (`OutcomeRow.from_json`) each.

Exact or not at all: a row is taken here only when its text decodes into `_Stored` (every column
this version knows, each of a type its parser in `outcome_rows` returns unchanged) and its values
are ones `OutcomeRow.from_json` keeps as they are. Anything else (a column this version does not
know, a text where a number belongs, NaN, an empty task, an outcome that is not 0/1, another row
version, a (condition, task, replicate) given twice in or across the stores, the floors' or the
gate's rows) makes `read` answer None, and the caller reads the rows the full way, which checks
them one by one and names the first bad one exactly as before.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Generator, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any, cast

import msgspec
import numpy as np

from noisefloor.analyzer.outcome_columns import NONE, Numbering, RowColumns
from noisefloor.outcome_rows import VERSION_KEY, OutcomeRow
from noisefloor.proxy.store.log import Store

_DTYPES = (np.int32, np.int32, np.int64, np.int8, np.int8, np.float64, np.int32)  # RowColumns' arrays, in order
CHUNK = 4096  # rows decoded at once: their texts and structs are what the read holds beside the columns
_EXACT = 2**53  # a replicate the full parse keeps as given (it goes through float)


def _stored_type() -> type[msgspec.Struct]:
    """`OutcomeRow`'s columns (their one definition) as a strict msgspec type, with the row's
    version: every value it decodes is one the full parse keeps as it is (`outcome_rows._PARSERS`).
    `extra` (the columns this version does not know) is left out: a row with one is the full parse's."""
    hints = typing.get_type_hints(OutcomeRow)
    columns = [(f.name, hints[f.name]) if f.default is dataclasses.MISSING else (f.name, hints[f.name], f.default)
               for f in dataclasses.fields(OutcomeRow) if f.name != "extra"]
    return msgspec.defstruct("_Stored", [*columns, (VERSION_KEY, int, 1)], forbid_unknown_fields=True)


_Stored = _stored_type()

_DECODER = msgspec.json.Decoder(_Stored)


def decoded(texts: list[bytes]) -> list[Any] | None:  # _Stored rows: a type built at import, so Any
    """The rows of `texts`, one each, decoded in one call; None when any is not a `_Stored`. A text
    holding a line break could be read as two lines: those are left to the full parse."""
    joined = b"\n".join(texts)
    if joined.count(b"\n") != len(texts) - 1:
        return None
    try:
        rows = _DECODER.decode_lines(joined)
    except msgspec.DecodeError:  # ValidationError included
        return None
    return rows if len(rows) == len(texts) else None


class RowsReader:
    """Decoded rows gathered into columns chunk by chunk, the texts numbered across every chunk and
    source (the stores here, a JSON Lines file in `file_rows`)."""

    def __init__(self) -> None:
        self.conds, self.tasks, self.fails = Numbering(), Numbering(), Numbering()
        self.parts: list[tuple[np.ndarray, ...]] = []

    def add(self, rows: list[Any]) -> bool:  # _Stored rows
        """Keep `rows`' columns; False when some value is not one the full parse keeps as given."""
        if ({r.row_version for r in rows} != {1} or not {r.outcome for r in rows} <= {0, 1}
                or not {r.reference for r in rows} <= {None, 0, 1}
                or not {r.endpoint for r in rows} | {r.variant for r in rows} <= {None, ""}):
            return False
        replicate = [r.replicate for r in rows]
        if max(replicate) >= _EXACT or min(replicate) <= -_EXACT:
            return False
        self.add_columns([r.condition for r in rows], [r.task_id for r in rows], replicate, [r.outcome for r in rows],
                         [NONE if r.reference is None else r.reference for r in rows],
                         [r.confidence for r in rows], [r.failure for r in rows])  # a confidence None -> NaN
        return True

    def add_columns(self, cond: list[str], task: list[str], replicate: list[int], outcome: list[int],
                    reference: list[int], confidence: Sequence[float | None], failure: Sequence[str | None]) -> None:
        """Keep one chunk of rows given as columns, values already checked (a falsy failure: none)."""
        fails = self.fails
        self.parts.append((
            np.array(self.conds.of(cond), dtype=np.int32),
            np.array(self.tasks.of(task), dtype=np.int32),
            np.array(replicate, dtype=np.int64),
            np.array(outcome, dtype=np.int8),
            np.array(reference, dtype=np.int8),
            np.array(confidence, dtype=float),
            np.array([fails.of((f,))[0] if f else NONE for f in failure], dtype=np.int32),
        ))

    def columns(self) -> RowColumns | None:
        """All rows as columns; None when a task or condition is empty or a row's key repeats."""
        if "" in self.conds.ids or "" in self.tasks.ids:
            return None
        arrays = [np.concatenate(a) for a in zip(*self.parts)] if self.parts else [np.empty(0, t) for t in _DTYPES]
        cols = RowColumns(self.conds.names(), self.tasks.names(), self.fails.names(), *arrays)
        return None if repeats(cols) else cols


def repeats(cols: RowColumns) -> bool:
    """Whether two rows have the same (condition, task, replicate)."""
    if len(cols) < 2:
        return False
    order = np.lexsort((cols.replicate, cols.task, cols.condition))
    same = np.ones(order.size - 1, dtype=bool)
    for a in (cols.condition, cols.task, cols.replicate):
        s = a[order]
        same &= s[1:] == s[:-1]
    return bool(same.any())


def read(paths: Sequence[Path]) -> RowColumns | None:
    """The rows kept in the stores, in the order `logstats.outcome_rows` gives them, as columns;
    None when the full parse is needed (see the module's docstring)."""
    reader = RowsReader()
    for p in paths:
        # the chunks' read is closed before the store is; outcome_texts is a generator, though the
        # store annotates it as an Iterator
        with (Store.open(p, write=False) as store,
              closing(cast("Generator[list[bytes], None, None]", store.outcomes.texts(CHUNK))) as chunks):
            for texts in chunks:  # CHUNK rows at a time
                rows = decoded(texts)
                if rows is None or not reader.add(rows):
                    return None
    return reader.columns()
