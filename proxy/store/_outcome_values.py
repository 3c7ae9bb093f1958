"""How the outcomes table keeps a graded row: under its key, the JSON of (condition, task,
replicate), and as its value the row without the three fields its key already holds.

A row whose first three fields are task_id, condition and replicate, in that order (every row
nfverify and nfladder write), is kept as `KEYED` and the JSON of its other fields (a study's row
shrinks from ~80 bytes to ~15); read back, the three are put first again from the key, so the row
and its JSON text are exactly those `json.dumps` wrote whole. Any other row is kept whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from itertools import islice
from typing import Any

import msgspec

from noisefloor.outcome_rows import row_key

KEYED = b"\x01"  # a value without its key's fields (JSON text never starts with this byte)
_LEAD = ("task_id", "condition", "replicate")


def key(row: Mapping[str, Any]) -> bytes:
    """A row's key: (condition, task, replicate) as JSON (merge looks rows up by it)."""
    return json.dumps(row_key(row)).encode()


def value(row: Mapping[str, Any]) -> bytes:
    """A row as the table keeps it: without its key's fields where it leads with them."""
    whole = dict(row)
    if tuple(islice(whole, 3)) == _LEAD:
        return KEYED + json.dumps({k: v for k, v in whole.items() if k not in _LEAD}).encode()
    return json.dumps(whole).encode()


def text(stored_key: bytes, stored: bytes) -> bytes:
    """The row's JSON text, as `json.dumps` wrote the whole row; ValueError for a keyed value whose
    key is not a (condition, task, replicate) array."""
    if stored[:1] != KEYED:
        return stored
    lead = json.loads(stored_key)
    if not isinstance(lead, list) or len(lead) != 3:
        raise ValueError("an outcome row's key is not (condition, task, replicate)")
    condition, task, replicate = (json.dumps(v) for v in lead)
    rest = stored[1:]
    if rest[:1] != b"{" or rest[-1:] != b"}":
        raise ValueError("an outcome row's value is not a JSON object")
    head = f'{{"task_id": {task}, "condition": {condition}, "replicate": {replicate}'.encode()
    return head + (b"}" if rest == b"{}" else b", " + rest[1:])


def row(stored_key: bytes, stored: bytes) -> Any:
    """A stored row: msgspec's decoder (a study's rows number one per graded attempt), or json's
    for what msgspec refuses and json reads (NaN, a lone surrogate)."""
    whole = text(stored_key, stored)
    try:
        return msgspec.json.decode(whole)
    except msgspec.DecodeError:
        return json.loads(whole)
