"""The exchange record: built here, by every mode, and read here (its one typed definition).

A record is assembled in parts: the request's part when the request arrives (serialized while
the upstream works, so the client never waits for it), the answer's part when the answer is
complete, and the id when the store appends it. The parts have disjoint keys, and joining them
is a splice of JSON texts rather than a re-serialization of the whole record, which on the hot
path would cost as much as the rest of recording.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:  # the store imports this module too: no import of traffic at run time
    from noisefloor.proxy.request.traffic import Prepared, ResponseData

ANSWER_FIELDS = ("model", "fingerprint", "usage", "finish_reason", "truncated")
RECORD_VERSION = 1  # the layout `request_part` writes and `parse` reads without migrating
# layout version -> the function that rewrites a record of it into the next layout (none yet)
_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def request_part(p: Prepared, mode: str, rules_id: str) -> dict[str, Any]:
    """The fields every exchange record has, whatever happened next."""
    return {
        "version": RECORD_VERSION,
        "time": p.started,
        "mode": mode,
        "session": p.labels.session,
        "task": p.labels.task,
        "replicate": p.labels.replicate,
        "condition": p.labels.condition,
        "key": p.key,
        "occurrence": p.occurrence,
        "seq": p.seq,
        "rules_id": rules_id,
        "request": p.request.record(),
        "overrides": p.request.stamp.get("overrides"),
        "perturbation": p.request.stamp.get("perturbation"),
        "notes": [*p.canonical.notes, *p.request.stamp.get("notes", ())],
    }


def answer_part(response: ResponseData | None, identity: dict[str, Any] | None) -> dict[str, Any]:
    """The answer's fields: the response as stored, and what identifies the model that wrote it
    (`identity`: model, fingerprint, usage, finish_reason, truncated; None when unknown)."""
    part: dict[str, Any] = {"response": response.record() if response is not None else None}
    if identity is not None:
        part.update({k: identity.get(k) for k in ANSWER_FIELDS})
    return part


def join(head: str, tail: dict[str, Any]) -> str:
    """Two JSON objects with disjoint keys as one JSON text, `head` already serialized."""
    return head[:-1] + "," + json.dumps(tail)[1:]


def with_id(text: str, exchange_id: int) -> str:
    """The stored text: the id first, then the record (a JSON object without "id")."""
    return f'{{"id":{exchange_id},{text[1:]}'


# -- reading -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exchange:
    """One request the proxy saw and what it answered: the one typed definition of the stored
    record, read by `parse` and written by the builders above (`version` says which layout; keys
    this version does not know are kept in `unknown` and written back, never dropped)."""

    id: int
    time: float  # the request arrived
    mode: str
    session: str
    key: str
    occurrence: int
    seq: int
    rules_id: str
    request: dict[str, Any]
    response: dict[str, Any] | None
    task: str | None = None
    replicate: str | None = None
    condition: str | None = None
    latency_ms: float | None = None
    model: str | None = None
    fingerprint: str | None = None
    usage: dict[str, Any] | None = field(default_factory=dict)
    finish_reason: str | None = None
    truncated: bool | None = False
    replay: dict[str, Any] | None = None
    overrides: dict[str, Any] | None = None
    perturbation: str | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    end: float | None = None  # the answer was complete (recorded exchanges)
    version: int = 1  # the record's layout; records written before the field existed are 1
    unknown: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, as stored

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object. Shallow: the nested request / response / usage objects are
        the exchange's own (dataclasses.asdict deep-copied them, and dominated listing a store)."""
        doc = {name: getattr(self, name) for name in _FIELD_NAMES}
        doc.update(self.unknown)
        return doc

    def json_bytes(self) -> bytes:
        """The record as compact JSON (UTF-8, every field): the object `nfproxy log --json` prints
        (which passes a record's stored text through instead where `listed` can)."""
        try:
            return _ENCODER.encode(self.to_json())  # a dict: every field, in order
        except (UnicodeEncodeError, msgspec.EncodeError):  # a lone surrogate (bytes no header should hold)
            return json.dumps(self.to_json(), ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Exchange:
        """The record, or TypeError / ValueError naming the first field that is not what the record
        type says; keys it does not know are kept in `unknown`."""
        if not isinstance(doc, dict):
            raise TypeError(f"a JSON {type(doc).__name__}, not an object")
        doc = migrate(doc)
        try:
            ex = msgspec.convert({k: v for k, v in doc.items() if k in _KNOWN}, cls)
        except msgspec.ValidationError as exc:
            raise TypeError(str(exc)) from None
        for name in ("request", "response"):
            if doc.get(name) is not None:
                _check_part(name, doc[name])
        return dataclasses.replace(ex, unknown={k: v for k, v in doc.items() if k not in _KNOWN})

    @property
    def replay_result(self) -> str | None:
        return (self.replay or {}).get("result")

    @property
    def status(self) -> int | None:  # a head's fields, so that listings read either
        return None if self.response is None else self.response["status"]

    @property
    def method(self) -> str:
        return self.request["method"]

    @property
    def url(self) -> str:
        return self.request["url"]


_FIELD_NAMES = tuple(n for n in Exchange.__dataclass_fields__ if n != "unknown")
_KNOWN = frozenset(_FIELD_NAMES)
# every known key, its value left unparsed, and no other: how `parse` tells that a record has keys
# this version does not know (the typed decoder skips them) without parsing it twice
_KEYS_ONLY = msgspec.json.Decoder(msgspec.defstruct("_Keys", [(n, msgspec.Raw, msgspec.Raw()) for n in _FIELD_NAMES],
                                                    forbid_unknown_fields=True))


class RequestPart(msgspec.Struct):
    """A record's `request` as its fields are checked (keys beyond these are kept, unchecked)."""

    method: str
    url: str
    headers: list[Any]
    body: str | None = None  # the body's sha256 in the bodies table
    body_size: int | None = None


class ResponsePart(msgspec.Struct):
    """A record's `response` as its fields are checked (keys beyond these are kept, unchecked)."""

    status: int
    headers: list[Any]
    body: str | None = None
    body_size: int | None = None
    chunks: list[Any] | None = None  # a stream's chunk offsets, where they were recorded


_PARTS: dict[str, type[msgspec.Struct]] = {"request": RequestPart, "response": ResponsePart}


def _check_part(name: str, part: Any) -> None:
    """TypeError naming what is wrong with a record's request or response part."""
    try:
        msgspec.convert(part, _PARTS[name])
    except msgspec.ValidationError as exc:
        raise TypeError(f"{exc} in {name}") from None


class _Part(msgspec.Struct):
    """A part of a record's head as its JSON text has it."""


class _RequestHead(_Part):
    method: str
    url: str


class _ResponseHead(_Part):
    status: int


class _BodyRef(msgspec.Struct):
    body: str | None = None


class _RequestBodyOf(msgspec.Struct):
    """The field the store's compression chain reads of a record: its request's body digest."""

    request: _BodyRef


_REQUEST_BODY = msgspec.json.Decoder(_RequestBodyOf)


class _Refs(msgspec.Struct):
    """What merge reads of a record it copies whole: the bodies it names, whether it is a replay's."""

    request: _BodyRef
    response: _BodyRef | None = None
    replay: Any = None


_REFS = msgspec.json.Decoder(_Refs)


def body_refs(text: bytes) -> tuple[list[bytes], bool]:
    """The sha256 digests of the bodies a record's JSON names, and whether it is a replay record
    (its `replay` an object); ValueError for a text that is not a record."""
    try:
        r = _REFS.decode(text)
        named: tuple[Any, ...] = (r.request.body, r.response.body if r.response else None)
        replay = r.replay
    except msgspec.MsgspecError:  # JSON msgspec refuses and json reads (a lone surrogate)
        doc = json.loads(text)
        named = tuple((doc.get(p) or {}).get("body") for p in ("request", "response"))
        replay = doc.get("replay")
    digests = [bytes.fromhex(d) for d in named if isinstance(d, str) and len(d) == 64]
    return [d for d in digests if len(d) == 32], isinstance(replay, dict)


def request_body(text: str) -> str | None:
    """The sha256 hex a record's request names as its body (None: none, or a text msgspec does
    not read, such as one with a lone surrogate: the body is then compressed on its own)."""
    try:
        return _REQUEST_BODY.decode(text).request.body
    except msgspec.MsgspecError:
        return None


class _HeadText(msgspec.Struct):
    """What a head is read from in a record's JSON text (a writer given the text, not the head)."""

    id: int
    time: float
    mode: str
    session: str
    key: str
    occurrence: int
    request: _RequestHead
    response: _ResponseHead | None
    task: str | None = None
    replicate: str | None = None
    condition: str | None = None
    model: str | None = None
    fingerprint: str | None = None
    usage: dict[str, Any] | None = msgspec.field(default_factory=dict)  # as `Exchange` defaults it
    truncated: bool | None = False
    replay: dict[str, Any] | None = None
    error: str | None = None
    notes: list[str] = msgspec.field(default_factory=list)


class Head(msgspec.Struct, gc=False, frozen=True):
    """What listings and summaries read of an exchange record (`Walk.heads`): its labels, route,
    status and identity. Kept beside the record in a store's heads table (`store_heads`). The
    fields after `notes` are those an exchange shares with others: its labels (with its session),
    then its route (with most of the store), which the heads table stores once per distinct set."""

    id: int
    time: float
    key: str
    occurrence: int
    status: int | None  # None: no response
    usage: dict[str, Any] | None
    truncated: bool | None
    error: str | None
    notes: list[str]
    session: str
    task: str | None
    replicate: str | None
    condition: str | None
    mode: str
    method: str
    url: str
    model: str | None
    fingerprint: str | None
    replay_result: str | None


_DECODER = msgspec.json.Decoder(Exchange)
_HEAD_TEXT = msgspec.json.Decoder(_HeadText)
_ENCODER = msgspec.json.Encoder()


def parse(data: bytes) -> Exchange:
    """One stored record, typed: msgspec checks every field against Exchange's annotations in C
    (json.loads plus checks in Python cost five times as much and dominated listing a store);
    TypeError / ValueError name what is wrong. A record with keys this version does not know, or of
    an earlier layout, takes the slow path, which keeps them."""
    try:
        ex = _DECODER.decode(data)
        _KEYS_ONLY.decode(data)
    except msgspec.ValidationError as exc:
        if "unknown field" not in str(exc):
            raise TypeError(str(exc)) from None
        return Exchange.from_json(json.loads(data))
    except msgspec.DecodeError:  # JSON that msgspec refuses and json reads (a lone surrogate): the slow path
        return Exchange.from_json(json.loads(data))
    if ex.version != RECORD_VERSION:
        return Exchange.from_json(json.loads(data))
    for name in ("request", "response"):
        part = getattr(ex, name)
        if part is not None:
            _check_part(name, part)
    return ex


def migrate(doc: dict[str, Any]) -> dict[str, Any]:
    """A record of an earlier layout in today's; one of a later layout is refused (ValueError)."""
    version = doc.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool):
        raise TypeError(f"field version is a {type(version).__name__}")
    if version > RECORD_VERSION:
        raise ValueError(f"the record has layout version {version}, newer than this noisefloor reads "
                         f"({RECORD_VERSION}); upgrade noisefloor")
    while version < RECORD_VERSION:  # the seam: each step rewrites one layout into the next
        doc, version = _MIGRATIONS[version](doc), version + 1
    return doc


def parse_head(data: bytes) -> Head:
    """What listings read of a stored record's JSON (ValidationError / DecodeError as msgspec raises them)."""
    h = _HEAD_TEXT.decode(data)
    result = (h.replay or {}).get("result")
    return Head(h.id, h.time, h.key, h.occurrence, None if h.response is None else h.response.status, h.usage,
                h.truncated, h.error, h.notes, h.session, h.task, h.replicate, h.condition, h.mode, h.request.method,
                h.request.url, h.model, h.fingerprint, _result_text(result))


def _result_text(result: Any) -> str | None:
    """A replay result as a listing shows it (a damaged record's non-text result as its text)."""
    return result if result is None or type(result) is str else (str(result) if result else None)


def head_of(ex: Exchange) -> Head:
    return Head(ex.id, ex.time, ex.key, ex.occurrence, ex.status, ex.usage, ex.truncated, ex.error, list(ex.notes),
                ex.session, ex.task, ex.replicate, ex.condition, ex.mode, ex.method, ex.url, ex.model, ex.fingerprint,
                _result_text(ex.replay_result))


def checked_head(record: bytes) -> tuple[Head, int] | None:
    """A record's JSON text's head and the fields it leaves out (a bit each; NOT_LISTED: only
    `parse` can list it), checked once here so that listings need not; None where msgspec refuses
    its JSON (a lone surrogate, which json reads): its record is read instead. TypeError where the
    text is not an exchange record."""
    try:
        head = parse_head(record)
    except msgspec.ValidationError as exc:  # first: msgspec's ValidationError is a DecodeError
        raise TypeError(str(exc)) from None
    except msgspec.DecodeError:
        return None
    checked = _listable(record)
    return head, NOT_LISTED if checked is None else checked[1]


# -- listing a record as stored ------------------------------------------------------------------
# `nfproxy log --json` prints every record: parsing each into an Exchange and encoding it again
# cost four times reading it. `listed` checks the stored text against the same types `parse`
# checks (Exchange's fields, the request and response parts' fields), with the contents of JSON
# objects and lists left unparsed, and passes it through with the fields it leaves implicit added.


def _unparsed(types: tuple[Any, ...]) -> Any:
    """A union msgspec checks: JSON objects and lists as such, their contents unparsed."""
    bare = [typing.get_origin(t) or t for t in types]
    kinds = [dict[str, msgspec.Raw] if t is dict else list[msgspec.Raw] if t is list else t for t in bare]
    out: Any = kinds[0]
    for k in kinds[1:]:
        out = out | k
    return out


def _checker(name: str, fields: list[tuple[str, Any, bool]], **kw: Any) -> Any:
    """A struct of `fields` (name, type, required); an optional one left out decodes as UNSET."""
    return msgspec.defstruct(name, [(n, t, msgspec.NODEFAULT) if req else (n, t | msgspec.UnsetType, msgspec.UNSET)
                                    for n, t, req in sorted(fields, key=lambda f: not f[2])], gc=False, **kw)


def _alternatives(tp: Any) -> tuple[Any, ...]:
    """The types a hint allows: each of a union's, else itself."""
    return typing.get_args(tp) if isinstance(tp, types.UnionType) else (tp,)


@functools.cache  # built on the first listing, not by every process that imports the record type
def record_checker() -> tuple[Any, tuple[str, ...], dict[str, bytes]]:
    hints = typing.get_type_hints(Exchange)
    parts = {name: _checker(f"_{name}_check", [(f.name, _unparsed(_alternatives(f.type)), f.required)
                                               for f in msgspec.structs.fields(part)])
             for name, part in _PARTS.items()}
    fields, defaults = [], {}
    for f in dataclasses.fields(Exchange):
        if f.name == "unknown":
            continue
        tp = hints[f.name]
        if f.name in parts:
            tp = parts[f.name] | None if f.name == "response" else parts[f.name]
        elif typing.get_origin(tp) is dict or dict[str, Any] in typing.get_args(tp):
            tp = _unparsed(tuple(dict if a == dict[str, Any] else a for a in (typing.get_args(tp) or (dict,))))
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields.append((f.name, tp, required))
        if not required:
            factory: Any = f.default_factory
            value = f.default if f.default is not dataclasses.MISSING else factory()
            defaults[f.name] = b',"' + f.name.encode() + b'":' + msgspec.json.encode(value)
    checker = _checker("_RecordCheck", fields, forbid_unknown_fields=True)
    return msgspec.json.Decoder(checker), checker.__struct_fields__, defaults


@functools.cache
def left_out_of(keys: frozenset[str]) -> int:
    """The fields a record of these keys leaves out, a bit each as `_listable` gives them (a writer
    that built the record knows its keys and types: nothing to parse)."""
    _, names, _ = record_checker()
    return sum(1 << i for i, n in enumerate(names) if n not in keys)


_ADDED: dict[int, bytes] = {}  # which fields a record leaves out (a bit each) -> the text that adds them
NOT_LISTED = 0xFFFFFFFF  # a record only `parse` can list (its head says so)


def listed(data: bytes, exchange_id: int) -> bytes | None:
    """The stored record `data` as one line of JSON with every field (the object `Exchange.json_bytes`
    gives), checked as `parse` checks it; None where only `parse` can say (keys this version does not
    know, another layout, JSON msgspec refuses, a type that is wrong: `parse` names it)."""
    checked = _listable(data)
    if checked is None or checked[0] != exchange_id:
        return None
    return with_implicit(data, checked[1])


def _listable(data: bytes) -> tuple[int, int] | None:
    """(id, the fields it leaves out: a bit each) of a record `listed` passes through, else None."""
    decoder, _, _ = record_checker()
    try:
        rec = decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if rec.version not in (RECORD_VERSION, msgspec.UNSET) or b"\n" in data or b"\r" in data or not data.endswith(b"}"):
        return None
    return rec.id, sum(1 << i for i, v in enumerate(msgspec.structs.astuple(rec)) if v is msgspec.UNSET)


def with_implicit(data: bytes, left_out: int) -> bytes:
    """A checked record's text with the fields it leaves out (`left_out`, a bit each) added."""
    added = _ADDED.get(left_out)
    if added is None:
        _, names, implicit = record_checker()
        added = _ADDED[left_out] = b"".join(implicit[n] for i, n in enumerate(names) if left_out >> i & 1)
    return data[:-1] + added + b"}" if added else data
