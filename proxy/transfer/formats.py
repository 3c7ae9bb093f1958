"""Recordings in and out: a store as HAR 1.2 (for other tools) or as JSON Lines (a reviewable diff
in a pull request), and traffic from HAR or mitmproxy flows into a store.

Import goes through the recorder, so an imported exchange is keyed, numbered and stored exactly as
one recorded through the proxy, secrets erased on the way in (credential headers and query
parameters redacted, their values erased from both bodies). A HAR nfproxy exported carries the
wire bytes, labels and stream chunk layout in `_noisefloor` fields, so export, import and strict
replay give back the same answers.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qsl, urlsplit

from noisefloor.errors import InputError
from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.request.headers import header
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import LABEL_HEADERS, Labels
from noisefloor.proxy.request.secrets import SECRET_QUERY_PARAMS, erase, erase_text
from noisefloor.proxy.request.traffic import RequestData, ResponseData
from noisefloor.proxy.store.exchange import Exchange
from noisefloor.proxy.store.log import Store

HAR_CREATOR = {"name": "nfproxy", "version": "1"}
LABEL_FIELDS = ("session", "task", "replicate", "condition")
MAX_HAR_BYTES = 4 << 30


class TransferError(InputError):
    """A file that cannot be imported; the message names the entry and the fix."""


# -- export --------------------------------------------------------------------------------------


def _iso(t: float | None) -> str:
    return datetime.fromtimestamp(t or 0, UTC).isoformat().replace("+00:00", "Z")


def _text_or_base64(data: bytes, encoded: bool) -> tuple[str, str | None]:
    if not encoded:
        try:
            return data.decode("utf-8"), None
        except UnicodeDecodeError:
            pass
    return base64.b64encode(data).decode(), "base64"


def _har_headers(headers: Iterable[Any]) -> list[dict[str, str]]:
    return [{"name": str(k), "value": str(v)} for k, v in headers]


def har_entry(store: Store, ex: Exchange) -> dict[str, Any]:
    """One exchange as a HAR entry; bodies are the stored bytes (as on the wire)."""
    req = ex.request
    body = store.bodies.of_part(req, ex.id, "request") or b""
    text, enc = _text_or_base64(body, bool(header(req["headers"], "content-encoding")))
    request: dict[str, Any] = {
        "method": req["method"], "url": req["url"], "httpVersion": "HTTP/1.1", "cookies": [],
        "headers": _har_headers(req["headers"]),
        "queryString": [{"name": k, "value": v} for k, v in parse_qsl(urlsplit(req["url"]).query)],
        "headersSize": -1, "bodySize": len(body),
    }
    if body:
        request["postData"] = {"mimeType": header(req["headers"], "content-type") or "", "text": text,
                               **({"_encoding": enc} if enc else {})}
    nf: dict[str, Any] = {k: getattr(ex, k) for k in (*LABEL_FIELDS, "id", "key", "occurrence", "seq", "mode",
                                                      "model", "error", "end", "notes")}
    entry: dict[str, Any] = {"startedDateTime": _iso(ex.time),
                             "time": ex.latency_ms if ex.latency_ms is not None else 0,
                             "request": request, "cache": {},
                             "timings": {"send": 0, "wait": ex.latency_ms or 0, "receive": 0},
                             "_noisefloor": nf}
    resp = ex.response
    if resp is None:
        entry["response"] = {"status": 0, "statusText": "", "httpVersion": "HTTP/1.1", "cookies": [], "headers": [],
                             "content": {"size": 0, "mimeType": ""}, "redirectURL": "", "headersSize": -1,
                             "bodySize": -1, "_error": ex.error}
        return entry
    rbody = store.bodies.of_part(resp, ex.id, "response") or b""
    rtext, renc = _text_or_base64(rbody, bool(header(resp["headers"], "content-encoding")))
    content: dict[str, Any] = {"size": len(rbody), "mimeType": header(resp["headers"], "content-type") or ""}
    if rbody:
        content["text"] = rtext
        if renc:
            content["encoding"] = renc
    entry["response"] = {"status": resp["status"], "statusText": "", "httpVersion": "HTTP/1.1", "cookies": [],
                         "headers": _har_headers(resp["headers"]), "content": content, "redirectURL": "",
                         "headersSize": -1, "bodySize": len(rbody)}
    nf["wire"] = True  # bodies are the stored (still content-encoded) bytes
    if resp.get("chunks") is not None:
        nf["chunks"] = resp["chunks"]
        nf["partial"] = resp.get("partial", False)
    return entry


def selected(store: Store, session: str | None, mode: str | None) -> Iterator[Exchange]:
    for ex in store.exchanges():
        if (session is None or ex.session == session) and (mode is None or ex.mode == mode):
            yield ex


def export_har(store: Store, out: IO[str], *, session: str | None = None, mode: str | None = "record") -> int:
    """Write a HAR document, entry by entry (the store is never held in memory whole)."""
    out.write('{"log": {"version": "1.2", "creator": ' + json.dumps(HAR_CREATOR) + ', "pages": [], "entries": [\n')
    n = 0
    for ex in selected(store, session, mode):
        out.write((",\n" if n else "") + json.dumps(har_entry(store, ex), ensure_ascii=False))
        n += 1
    out.write("\n]}}\n")
    return n


def jsonl_line(store: Store, ex: Exchange) -> dict[str, Any]:
    """One exchange for review: labels, key, both bodies decoded; no times (they change every run)."""
    doc: dict[str, Any] = {k: getattr(ex, k) for k in (*LABEL_FIELDS, "key", "occurrence", "mode", "model",
                                                       "finish_reason", "error")}
    doc["request"] = {"method": ex.request["method"], "url": ex.request["url"], "headers": ex.request["headers"],
                      "body": store.bodies.readable(ex.request, ex.id, "request")}
    if ex.response is not None:
        doc["response"] = {"status": ex.response["status"], "headers": ex.response["headers"],
                           "body": store.bodies.readable(ex.response, ex.id, "response")}
    return doc


def export_jsonl(store: Store, out: IO[str], *, session: str | None = None, mode: str | None = "record") -> int:
    n = 0
    for ex in selected(store, session, mode):
        out.write(json.dumps(jsonl_line(store, ex), ensure_ascii=False, sort_keys=True) + "\n")
        n += 1
    return n


# -- import --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Incoming:
    """One exchange to import, from whatever file it came."""

    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    started: float
    status: int | None  # None: no response (a failed connection)
    response_headers: tuple[tuple[str, str], ...] = ()
    response_body: bytes = b""
    ended: float | None = None
    latency_ms: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    layout: tuple[tuple[float | None, int], ...] | None = None
    partial: bool = False
    error: str | None = None


@dataclass(frozen=True)
class ImportResult:
    exchanges: int
    sessions: tuple[str, ...]
    upstream: str | None = None  # the origin the store now remembers for replay (None: none set here)


def import_into(path: str | os.PathLike[str], items: Iterable[Incoming | Checked], session: str,
                rules: Rules | None = None) -> ImportResult:
    """Record `items` into the store at `path` (created if new) as the proxy would have.

    Every item is read and checked before the store is opened for writing: a bad entry late in a
    file leaves the store as it was, so fixing the file and importing again duplicates nothing."""
    rules = rules or Rules()
    ready = [checked(item, n) for n, item in enumerate(items, 1)]
    sessions: list[str] = []
    with Store.open(path, write=True, create=True) as store:
        store.lock_for_recording()
        upstream = _upstream_to_remember(store, ready)
        recorder = Recorder(store, rules)
        with store.batch():  # committed hundreds at a time: an import is not a proxy answering
            _record_all(recorder, ready, session, sessions)
        if upstream is not None:
            store.set_meta("upstream", upstream)
    return ImportResult(len(ready), tuple(sessions), upstream)


def _upstream_to_remember(store: Store, ready: list[Checked]) -> str | None:
    """The origin a replay of this store answers for, as a reverse-mode recording remembers its
    --upstream: set when the import fills an empty store from one origin, so replaying it in any
    form (base URL or wrapped command) needs no --upstream the recording did not need. Several
    origins (a forward-proxy capture) set none: such a store replays as a forward proxy."""
    if len(store) or store.meta("upstream"):
        return None
    origins = {_origin(item.url) for item, _, _ in ready}
    return origins.pop() if len(origins) == 1 else None


_HOST = re.compile(r"[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]")


def _origin(url: str) -> str | None:
    """scheme://host[:port] of an http(s) URL, as --upstream takes it (never its user or password);
    None for anything else."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    if parts.scheme not in ("http", "https") or not _HOST.fullmatch(host):
        return None
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def _record_all(recorder: Recorder, ready: list[Checked], session: str, sessions: list[str]) -> None:
    for item, request, labels_found in ready:
        labels = Labels(session).overlay(labels_found)
        given = {k: v for k, v in item.labels.items() if k in LABEL_FIELDS and v is not None}
        if given:
            labels = replace(labels, **{k: str(v) for k, v in given.items()})
        response = None
        if item.status is not None:
            response = ResponseData(item.status, item.response_headers, item.response_body, item.layout,
                                    item.partial)
        error = erase_text(item.error, request.secret_values) if item.error else item.error
        pending = recorder.begin(request, labels)
        recorder.finish(pending, response, error=error, latency_ms=item.latency_ms,
                        notes=["imported"], end=item.ended if item.ended is not None else item.started)
        if labels.session not in sessions:
            sessions.append(labels.session)


def checked(item: Incoming | Checked, n: int, source: str = "exchange") -> Checked:
    """The request the recorder gets, or a TransferError naming the exchange (an item already
    checked passes through)."""
    if isinstance(item, tuple):
        return item
    where = f"{source} {n}"
    if not _TOKEN.fullmatch(item.method):
        raise TransferError(f"{where}: method {item.method[:40]!r} is not an HTTP method; fix the entry")
    try:
        parts = urlsplit(item.url)
        host = parts.hostname
    except ValueError as exc:
        raise TransferError(f"{where}: {item.url[:200]!r} is not a URL ({exc})") from None
    if not parts.scheme or not host:
        raise TransferError(f"{where}: {item.url[:200]!r} is not an absolute URL")
    for k, v in (*item.headers, *item.response_headers):
        if not _TOKEN.fullmatch(k) or any(c in v for c in "\r\n\x00"):
            raise TransferError(f"{where}: header {k[:40]!r} has a name or value no HTTP message can carry")
    if item.status is not None and not 100 <= item.status <= 999:
        raise TransferError(f"{where}: response status {item.status} is not an HTTP status (100-999)")
    if item.layout is not None and any(n < 0 for _, n in item.layout):
        raise TransferError(f"{where}: a stream chunk has a negative size")
    if not all(math.isfinite(t) for t in (item.started, item.ended or 0.0, item.latency_ms or 0.0)):
        raise TransferError(f"{where}: a time is not a finite number")
    labels_found = {k.lower(): v for k, v in item.headers if k.lower() in LABEL_HEADERS}
    headers = tuple((k, v) for k, v in item.headers if k.lower() not in LABEL_HEADERS)
    request = RequestData(item.method.upper(), item.url, host,
                          parts.path + (f"?{parts.query}" if parts.query else ""), headers, item.body,
                          arrived=item.started)
    return item, request, labels_found


Checked = tuple[Incoming, RequestData, dict[str, str]]


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")  # an HTTP token (RFC 9110): a method or a header name


def _b(text: Any, encoding: Any, where: str) -> bytes:
    if text is None or text == "":
        return b""
    if not isinstance(text, str):
        raise TransferError(f"{where}: a body's text is a {type(text).__name__}, not a string")
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except ValueError:
            raise TransferError(f"{where}: text is not valid base64") from None
    return text.encode("utf-8", "surrogatepass")


def _pairs(items: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(items, list) or not all(isinstance(h, dict) and isinstance(h.get("name"), str)
                                              and isinstance(h.get("value", ""), str) for h in items):
        raise TransferError(f"{where}: headers must be a list of {{name, value}} strings")
    return tuple((h["name"], h.get("value", "")) for h in items)


def _obj(value: Any, where: str, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TransferError(f"{where}: {name} is a {type(value).__name__}, not an object")
    return value


def _declared_secrets(req: dict[str, Any], resp: dict[str, Any], post: dict[str, Any]) -> list[str]:
    """Secret values a HAR spells out beside the headers: cookie values (request and response) and
    form parameters named as a secret query parameter is; erased from both bodies (the headers
    carrying them are redacted by the recorder)."""
    values = []
    for part, name in ((req, "cookies"), (resp, "cookies"), (post, "params"), (req, "queryString")):
        items = part.get(name)
        if not isinstance(items, list):
            continue
        for c in items:
            if not isinstance(c, dict) or not isinstance(c.get("value"), str):
                continue
            if name == "cookies" or str(c.get("name", "")).lower() in SECRET_QUERY_PARAMS:
                values.append(c["value"])
    return sorted({v for v in values if len(v) >= 8}, key=len, reverse=True)


def _started(value: Any, where: str) -> float:
    if not isinstance(value, str):
        raise TransferError(f"{where}: startedDateTime is a {type(value).__name__}, not an ISO 8601 string")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise TransferError(f"{where}: startedDateTime {value[:60]!r} is not an ISO 8601 time") from None


def _number(value: Any, where: str, name: str) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TransferError(f"{where}: {name} {str(value)[:40]!r} is not a finite number")
    return float(value)


def _layout(value: Any, where: str) -> tuple[tuple[float | None, int], ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
            isinstance(c, list) and len(c) == 2 and isinstance(c[1], int) and not isinstance(c[1], bool)
            for c in value):
        raise TransferError(f"{where}: _noisefloor.chunks must be a list of [time, size] pairs")
    return tuple((None if t is None else _number(t, where, "a chunk time"), n) for t, n in value)  # None: not timed


_DECODED_DROP = ("content-encoding", "content-length")


def har_items(path: Path) -> Iterator[Incoming]:
    """The entries of a HAR file. An entry nfproxy did not export holds decoded bodies (what
    browsers save): its Content-Encoding and Content-Length are dropped to match."""
    if path.stat().st_size > MAX_HAR_BYTES:
        raise TransferError(f"{path} is over {MAX_HAR_BYTES >> 30} GB; split it before importing")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else f"{exc.__class__.__name__}: {exc}"
        raise TransferError(f"{path} is not a HAR file ({why}); export one as HAR 1.2") from None
    log = doc.get("log") if isinstance(doc, dict) else None
    entries = log.get("entries") if isinstance(log, dict) else None
    if not isinstance(entries, list):
        raise TransferError(f"{path} is not a HAR file (no log.entries list); export one as HAR 1.2")
    for i, e in enumerate(entries, 1):
        yield _har_item(e, f"{path} entry {i}")


def _har_item(e: Any, where: str) -> Incoming:
    e = _obj(e, where, "the entry")
    req, resp = _obj(e.get("request"), where, "request"), _obj(e.get("response"), where, "response")
    nf = _obj(e.get("_noisefloor"), where, "_noisefloor")
    post = _obj(req.get("postData"), where, "request.postData")
    content = _obj(resp.get("content"), where, "response.content")
    method, url = req.get("method"), req.get("url")
    if not isinstance(method, str) or not isinstance(url, str) or "startedDateTime" not in e:
        raise TransferError(f"{where} is incomplete: each entry needs request.method, request.url (strings) "
                            "and startedDateTime")
    wire = bool(nf.get("wire"))
    headers = _pairs(req.get("headers", []), where)
    rheaders = _pairs(resp.get("headers", []), where)
    if not wire:  # the bodies are decoded: an encoding or length header would misdescribe them
        headers = tuple((k, v) for k, v in headers if k.lower() not in _DECODED_DROP)
        rheaders = tuple((k, v) for k, v in rheaders if k.lower() not in _DECODED_DROP)
    started = _started(e["startedDateTime"], where)
    elapsed = _number(e.get("time"), where, "time")
    status = resp.get("status") or 0
    if isinstance(status, bool) or not isinstance(status, int):
        raise TransferError(f"{where}: response.status {str(status)[:40]!r} is not a whole number")
    end = _number(nf["end"], where, "_noisefloor.end") if nf.get("end") is not None else started + elapsed / 1000
    labels = {k: nf[k] for k in LABEL_FIELDS if nf.get(k) is not None}
    if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in labels.values()):
        raise TransferError(f"{where}: a _noisefloor label (session, task, replicate, condition) is not a string")
    error = (nf.get("error") or resp.get("_error")) if not status else None
    if error is not None and not isinstance(error, str):
        raise TransferError(f"{where}: the recorded error is a {type(error).__name__}, not a string")
    declared = _declared_secrets(req, resp, post)
    body = _b(post.get("text"), post.get("_encoding") or post.get("encoding"), where)
    response_body = _b(content.get("text"), content.get("encoding"), where)
    if declared:
        body, response_body = erase(body, declared), erase(response_body, declared)
        error = erase_text(error, declared) if error else error
    return Incoming(
        method=method, url=url, headers=headers, body=body, started=started, status=status or None,
        response_headers=rheaders, response_body=response_body, ended=end,
        latency_ms=elapsed if elapsed >= 0 else None, labels={k: str(v) for k, v in labels.items()},
        layout=_layout(nf.get("chunks"), where), partial=bool(nf.get("partial")), error=error)
